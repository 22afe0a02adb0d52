"""The trash directory: where a file unlinked while open waits for its last close.

A mount keeps such a file (and an ``O_TMPFILE`` not linked yet) under a hidden name in
``/.curvine_hidden_trash`` and removes that name at the file's last release
(client/vfs.py).  A mount that dies never releases it, so the name carries its owner: the
hidden name, ``@``, and a tag of the client id of the process that keeps it.  While a
client keeps anything there it says so to the master (a lock-lease renewal, every few
seconds, client/core.py ``LeaseKeeper``); the leader removes the names of owners it has
not heard from for ``master.trash_grace_s`` (master/trashsweep.py), which frees their
blocks.  A name without a tag (an older client's) is never removed.

Shared by the client and the master, which may both import only ``curvine_py.common``.
"""
from __future__ import annotations

import hashlib

from curvine_py.common.types import HIDDEN_PREFIX

TRASH_NAME = HIDDEN_PREFIX + "trash"   # in the root, owned by root, mode 0700
SEP = "@"
TAG_LEN = 16   # hex digits: 64 bits of the client id's hash


def tag_of(client_id: str) -> str:
    """The owner tag of a client id (which holds '/', not allowed in a name)."""
    return hashlib.blake2b(client_id.encode(), digest_size=TAG_LEN // 2).hexdigest()


def kept_name(hidden: str, client_id: str) -> str:
    """The name in the trash of a hidden file kept by client_id."""
    return f"{hidden}{SEP}{tag_of(client_id)}"


def owner_of(name: str) -> str | None:
    """The owner tag of a name in the trash; None for one without a tag."""
    hidden, sep, tag = name.rpartition(SEP)
    if not sep or not hidden.startswith(HIDDEN_PREFIX) or len(tag) != TAG_LEN:
        return None
    try:
        int(tag, 16)
    except ValueError:
        return None
    return tag
