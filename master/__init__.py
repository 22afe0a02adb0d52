"""The curvine-py master: namespace, journal, worker registry, placement (installed as curvine_py.master)."""
