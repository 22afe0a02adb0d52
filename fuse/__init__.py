"""The FUSE mount: a thin pyfuse3 adapter over the client VFS (installed as curvine_py.fuse)."""
