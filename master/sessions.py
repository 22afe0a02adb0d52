"""Cache sessions: which mounts cache which names and attributes, and the pushes that
keep those caches true (issue 39; Gray and Cheriton's leases, CephFS's caps).

A mount opens a session on a frame connection of its own (``OpenSession``); from then on
its reads may be granted a lease on what they return: a name in a directory (``Key``
with a name) and an inode's attributes (``Key`` without one).  Every committed mutation
reports the keys it changed (the store's triggers, ``schema.track_changes``) to
``changed``, in commit order; each session holding one of them gets an ``Invalidation``
push, and the mutation's caller is answered only once every other such session has
acknowledged its push (its next ``Beat``), or its lease has run out (``wait``).  So a
slow or dead mount costs a writer at most one lease, and no mount serves a name that
changed once the change's caller was answered.

Races, and why each is safe:
- A read's reply may be computed before a commit and registered after it: each key
  remembers the epoch of its last change, a grant names the epoch its data is at least
  as new as, and a key changed after that epoch is not granted (``grant``).
- A grant and a push travel on different connections: a grant names the session's push
  count when it was made, and the mount drops it if it has already handled a later
  push (``lease_seq``, client/metacache.py).
- A master that starts, or becomes the leader, does not know the previous leader's
  sessions: for one longest lease it answers no mutation (``grace``), after which every
  lease granted elsewhere has run out.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import typing
from collections import OrderedDict
from dataclasses import dataclass, field

from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)

# (ino, name): a name in a directory; (ino, None): an inode's attributes; (ino, ""): a
# directory's mode and owner; (ino, "/"): a directory's whole listing (schema.track_changes)
Key = tuple[int, str | None]
Push = typing.Callable[[pb.Invalidation], bool]   # False: the stream is gone
LISTING = "/"           # the name of a directory's whole-listing key
RECENT_KEYS = 1 << 16   # changed keys whose epoch is remembered; older reads are not granted
MIN_LEASE_S = 0.2
# The most names a Lookup's reply lists (LookupRequest.listing_max): a listing's reply and
# its grant cost the master ~N x (to_attr + a key per name and per inode) once per directory
LISTING_MAX = 1024


@dataclass
class Session:
    """One mount's session: its stream, its lease and the keys it caches."""

    sid: int
    lease_s: float
    heard: float                      # monotonic time of the last beat (or the open)
    push: Push | None                 # None: the stream broke; leases run out by the clock
    client_id: str = ""               # the mount's (Caller.client_id): its own changes come back in replies
    keys: set[Key] = field(default_factory=set)
    sent: int = 0                     # pushes numbered 1, 2, ...
    acked: int = 0

    def expired(self, now: float) -> bool:
        return now > self.heard + self.lease_s


@dataclass(frozen=True)
class Barrier:
    """What a mutation's caller waits for before its answer: the pushes to the sessions
    that held what it changed acknowledged (but its own session's, which its reply brings)."""

    epoch: int
    seqs: dict[int, int] = field(default_factory=dict)   # session id -> push number
    keys: dict[int, list[Key]] = field(default_factory=dict)   # session id -> the keys it must forget

    def own_seq(self, sid: int) -> int:
        return self.seqs.get(sid, 0)

    def listings(self, sid: int) -> list[Key]:
        """The complete directory listings sid held and this change took: a mutation of
        its own may keep them (MasterService re-grants them with its reply)."""
        return [k for k in self.keys.get(sid, ()) if k[1] == LISTING]


class Sessions:
    """The master's table of cache sessions (thread-safe; one lock, never held across I/O
    other than a non-blocking send of a push)."""

    def __init__(self, lease_max_s: float, term: typing.Callable[[], int] = lambda: 0) -> None:
        """lease_max_s: the longest lease granted (0: no caching: sessions are refused);
        term: the group's term, whose change starts a new grace (a new leader)."""
        self.lease_max_s = lease_max_s
        self._term = term
        self._lock = threading.Condition()
        self._sessions: dict[int, Session] = {}
        self._holders: dict[Key, set[int]] = {}
        self._changed: OrderedDict[Key, int] = OrderedDict()   # key -> epoch of its last change
        self._floor = 0         # epochs at or below this are forgotten for some keys
        self._epoch = 0
        self._ids = itertools.count(int(time.time() * 1000) << 16)   # unique across restarts
        self._seen_term = term()
        self._grace_until = time.monotonic() + lease_max_s

    @property
    def enabled(self) -> bool:
        return self.lease_max_s > 0

    # ------------------------------------------------------------------ the stream
    def open(self, lease_ms: int, push: Push, client_id: str = "") -> pb.SessionReply:
        lease = min(max(lease_ms / 1000, MIN_LEASE_S), self.lease_max_s) if lease_ms else self.lease_max_s
        with self._lock:
            self._new_term()
            s = Session(next(self._ids), lease, time.monotonic(), push, client_id)
            self._sessions[s.sid] = s
        log.info("cache session %d opened (lease %.1f s)", s.sid, lease)
        return pb.SessionReply(session=s.sid, lease_ms=int(lease * 1000))

    def beat(self, sid: int, acked: int, forgotten: typing.Iterable[Key] = ()) -> bool:
        """A renewal with the pushes handled so far and the keys the mount dropped on its
        own; False: no such session (expired)."""
        now = time.monotonic()
        with self._lock:
            s = self._sessions.get(sid)
            if s is None or s.expired(now):
                self._drop(s)
                return False
            s.heard = now
            for k in forgotten:
                if k in s.keys:
                    s.keys.discard(k)
                    self._release(k, sid)
            if acked > s.acked:
                s.acked = min(acked, s.sent)
                self._lock.notify_all()
            return True

    def broken(self, sid: int) -> None:
        """The session's stream closed: nothing more can be pushed to it; what it holds is
        good until its lease runs out (it may be cut off, not gone), so writers wait that long."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None:
                s.push = None
                self._lock.notify_all()

    def count(self) -> int:
        with self._lock:
            return len(self._sessions)

    # ------------------------------------------------------------------ grants
    def epoch(self) -> int:
        """Noted before a read: its data is at least as new as this."""
        return self._epoch

    def grant(self, sid: int, keys: typing.Iterable[Key], epoch: int) -> int:
        """Let session sid cache keys (read at epoch or later): the reply's lease_seq (the
        session's push count + 1), or 0 when nothing may be cached."""
        if not sid:
            return 0
        keys = list(keys)
        now = time.monotonic()
        with self._lock:
            s = self._sessions.get(sid)
            if s is None or s.push is None or s.expired(now) or epoch < self._floor:
                return 0
            changed = self._changed.get
            if any(changed(k, 0) > epoch for k in keys):
                return 0
            # (a listing grants ~2 keys per name: the set made only for a key no one holds,
            # and the session's keys added in one call)
            holders = self._holders
            for k in keys:
                h = holders.get(k)
                if h is None:
                    holders[k] = {sid}
                else:
                    h.add(sid)
            s.keys.update(keys)
            return s.sent + 1

    # ------------------------------------------------------------------ changes
    def changed(self, keys: typing.Iterable[Key], own_client: str = "") -> Barrier:
        """Keys one committed mutation changed (called in commit order): their holders are
        pushed an invalidation and forget them; the mutation's caller waits for the Barrier.
        own_client: the caller's client id when its reply carries the change's keys (its
        sessions are then numbered the invalidation but not pushed it: Barrier.keys)."""
        with self._lock:
            self._epoch += 1
            epoch = self._epoch
            pushes: dict[int, list[Key]] = {}
            for k in keys:
                self._changed[k] = epoch
                self._changed.move_to_end(k)
                for sid in self._holders.pop(k, ()):
                    pushes.setdefault(sid, []).append(k)
            while len(self._changed) > RECENT_KEYS:
                _, old = self._changed.popitem(last=False)
                self._floor = max(self._floor, old)
            if not pushes:
                return Barrier(epoch)
            sent: dict[int, int] = {}
            for sid, ks in pushes.items():
                s = self._sessions.get(sid)
                if s is None:
                    continue
                s.keys.difference_update(ks)
                s.sent += 1
                sent[sid] = s.sent
                if own_client and s.client_id == own_client:
                    continue   # the caller's own session: its reply brings the keys
                if s.push is not None and not s.push(_invalidation(s.sent, ks)):
                    s.push = None
        return Barrier(epoch, sent, pushes)

    def deliver(self, sid: int, seq: int, keys: list[Key]) -> None:
        """Push an invalidation numbered seq already (changed: the caller's own, meant for
        its reply) on sid's stream after all: the reply did not go out."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None and s.push is not None and not s.push(_invalidation(seq, keys)):
                s.push = None

    def wait(self, barrier: Barrier, own: int) -> int:
        """Until every session but own has acknowledged its push of barrier, or its lease
        ran out; also until the grace of a new leader is over.  Returns own's push number."""
        self.wait_grace()
        others = [(sid, seq) for sid, seq in barrier.seqs.items() if sid != own]
        if not others:
            return barrier.own_seq(own)
        with self._lock:
            for sid, seq in others:
                while True:
                    s = self._sessions.get(sid)
                    now = time.monotonic()
                    if s is None or s.acked >= seq:
                        break
                    if s.expired(now):
                        self._drop(s)
                        break
                    self._lock.wait(s.heard + s.lease_s - now + 0.001)
        return barrier.own_seq(own)

    def expire(self) -> int:
        """Drop the sessions whose lease ran out (the housekeeping); how many."""
        now = time.monotonic()
        with self._lock:
            dead = [s for s in self._sessions.values() if s.expired(now)]
            for s in dead:
                self._drop(s)
        return len(dead)

    # ------------------------------------------------------------------ internals
    def wait_grace(self) -> None:
        """A new leader's (or a started master's) first lease: wait it out before answering
        a mutation; the mounts of the previous one may cache what it changed until then."""
        if not self.enabled or (time.monotonic() >= self._grace_until and self._term() == self._seen_term):
            return
        with self._lock:
            self._new_term()
            left = self._grace_until - time.monotonic()
        if left > 0:
            time.sleep(left)

    def _new_term(self) -> None:
        """A new leader's term: forget every session and wait out their leases (lock held)."""
        term = self._term()
        if term == self._seen_term:
            return
        self._seen_term = term
        for s in list(self._sessions.values()):
            self._drop(s)
        self._grace_until = time.monotonic() + self.lease_max_s
        log.info("term %d: cache sessions start over; mutations wait %.1f s for the old leases", term,
                 self.lease_max_s)

    def _drop(self, s: Session | None) -> None:
        if s is None or self._sessions.pop(s.sid, None) is None:
            return
        for k in s.keys:
            self._release(k, s.sid)
        self._lock.notify_all()
        log.info("cache session %d ended", s.sid)

    def _release(self, k: Key, sid: int) -> None:
        holders = self._holders.get(k)
        if holders is not None:
            holders.discard(sid)
            if not holders:
                del self._holders[k]


def key_of(k: pb.CacheKey) -> Key:
    """A wire key as the table keeps it."""
    return (k.ino, k.name if k.entry else None)


def cache_keys(keys: typing.Iterable[Key]) -> list[pb.CacheKey]:
    """Keys as the wire carries them (CacheKey: entry False for an inode's attributes)."""
    return [pb.CacheKey(ino=ino, name=name or "", entry=name is not None) for ino, name in keys]


def _invalidation(seq: int, keys: list[Key]) -> pb.Invalidation:
    return pb.Invalidation(seq=seq, keys=cache_keys(keys))
