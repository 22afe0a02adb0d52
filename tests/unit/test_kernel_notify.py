"""What fuse/notify.py tells the kernel for a push (its inode numbers, its keys); that
the kernel takes it is tests/posix/test_posix_kernel_invalidation.py's."""
from __future__ import annotations

from curvine_py.client.metacache import LISTING, MetaCache
from curvine_py.fuse.notify import KernelNotifier, Note
from curvine_py.pb import curvine_pb2 as pb


def notifier(root_ino: int) -> KernelNotifier:
    return KernelNotifier(root_ino, entry=lambda ino, name: None, inode=lambda ino, attr_only=False: None)


def test_keys_become_the_kernels_notes_in_its_inode_numbers() -> None:
    push = pb.Invalidation(seq=1, keys=[
        pb.CacheKey(ino=7, name="x", entry=True),            # a name
        pb.CacheKey(ino=9),                                  # attributes
        pb.CacheKey(ino=7, name="", entry=True),             # a directory's mode: its attributes
        pb.CacheKey(ino=7, name=LISTING, entry=True),        # a listing: nothing, the kernel keeps none
        pb.CacheKey(ino=9),                                  # twice: once
        pb.CacheKey(ino=1, name="top", entry=True),          # the pool's root, above the subdir: not here
        pb.CacheKey(ino=5, name="in-root", entry=True),      # the subdir: the kernel's root
    ])
    assert notifier(5).notes(push) == [Note(7, b"x"), Note(9, None), Note(7, None), Note(1, b"in-root")]
    assert notifier(1).notes(pb.Invalidation(keys=[pb.CacheKey(ino=1, name="top", entry=True)])) == [Note(1, b"top")]


def test_a_refused_grant_names_only_what_no_push_will_end() -> None:
    told: list[list[pb.CacheKey]] = []
    c = MetaCache()
    c.on_refused = told.append
    c.begin(3, 1e18)
    attr = pb.Attr(ino=20, mode=0o100644)
    c.granted(3, 1, [attr], (10, "f", 20))                  # kept: nothing told
    assert told == [] and c.attr(20) is not None
    c.granted(3, 0, [attr], (10, "g", 20))                  # the master granted nothing: all of it
    assert [(k.ino, k.name, k.entry) for k in told.pop()] == [(20, "", False), (10, "g", True)]
    c.invalidate(pb.Invalidation(seq=2, keys=[pb.CacheKey(ino=10, name=LISTING, entry=True)]))
    c.granted(3, 2, [attr], (10, "h", 20), keys=[pb.CacheKey(ino=10, name=LISTING, entry=True)])
    assert [(k.ino, k.name) for k in told.pop()] == [(10, LISTING)]   # only what the push took
    c.granted(2, 5, [attr], (10, "i", 20))                  # an old session's reply: all of it
    assert len(told.pop()) == 2


def test_a_session_end_names_what_the_cache_held() -> None:
    ended: list[list[pb.CacheKey]] = []
    c = MetaCache()
    c.on_end = ended.append
    c.begin(3, 1e18)
    c.granted(3, 1, [pb.Attr(ino=20)], (10, "f", 20), pb.Attr(ino=10, mode=0o40755))
    c.end()
    assert sorted((k.ino, k.name, k.entry) for k in ended.pop()) == [(10, "", False), (10, "f", True), (20, "", False)]
    c.end()                                                  # nothing held: nothing told
    assert ended == []
