"""The block server: block files on local disks (io_uring or a thread pool), the framed TCP data
channel with chain replication, heartbeats to the master, and a small gRPC service.

Imports only the standard library, third-party packages, ``curvine_py.common`` and
``curvine_py.pb`` (never the master or the client).
"""
