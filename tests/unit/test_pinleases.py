"""master/pinleases.py: expiring pins keyed by (client, inode), on a clock we move."""
from __future__ import annotations

from curvine_py.master.pinleases import PinLeases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pins_expire_unless_renewed_and_are_per_holder() -> None:
    clock = Clock()
    pins = PinLeases(clock)
    pins.hold("a", [1, 2], 10)
    pins.hold("b", [2], 30)
    assert pins.pinned(1) and pins.pinned(2) and not pins.pinned(3)
    clock.now += 9
    pins.hold("a", [1], 10)           # renewed: 10 s from now
    clock.now += 2
    assert pins.pinned(1) and pins.pinned(2)   # 2: a's pin ran out, b's holds
    pins.release("b", [2])
    assert not pins.pinned(2)
    pins.release("b", [1])            # another holder's release leaves a's pin
    assert pins.pinned(1) and len(pins) == 1
    clock.now += 10
    assert not pins.pinned(1) and len(pins) == 0   # nobody released it: it ran out
