"""What only a mount adds to the client core, at lookups and opens: files the kernel
reads by itself (a local replica's block file, checked ahead; a remote block staged in
memory), blocks fetched at a lookup for the open after it, and the kernel's cache modes.
The SDK reads through the same VFS without any of it (client/vfs.py ``SdkOpens``); only
the mount (``curvine_py.fuse``) imports this package, as ``MountOpens``
(``policy.py``)."""
