"""Boot orders of a sweep: which config boots when, so that drift over the sweep does not look like an effect.

Pure functions over the positions of one boot round (every config, and the anchor, once). A sweep of ``R``
rounds of ``k`` units is one of:

* ``round_robin``: every round in plan order, A B C | A B C | ... A linear drift over the sweep favours the
  units late in the round (each is always (k - 1)/k rounds behind the last one).
* ``balanced`` (the default): ABBA counterbalancing. Rounds come in pairs, the plan order and its reverse
  (A B C | C B A | A B C | C B A); over every complete pair of rounds each unit's mean position is the same,
  ``(k - 1) / 2``, so a linear drift adds the same to every unit's mean and cancels from any difference
  (Cochran and Cox, "Experimental Designs", 1957, ch. 4: reversal designs). With an odd number of rounds the
  last round leaves at most ``(k - 1) / (2 R)`` of a round's drift between units. The anchor sits in the
  middle of each round (A anchor B | B anchor A), so it stays there under reversal and every candidate boot
  has an anchor boot within ``ceil(k / 2)`` positions.
* ``shuffle``: randomised blocks. Each round a seeded permutation (``random.Random(seed * 1000 + round)``),
  the seed recorded in the plan: drift cancels in expectation, not in every sweep.

The order position of each boot is its index in the returned list; the warehouse keeps it as the rank of
``trials.started_at`` within the sweep, which is what ``stats.anchored`` models drift on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["ORDERS", "boot_order"]

ORDERS = ("balanced", "round_robin", "shuffle")

T = TypeVar("T")


def boot_order(rounds: Sequence[Sequence[T]], order: str = "balanced", *, seed: int = 0,
               anchor: T | None = None) -> list[T]:
    """The sweep's boots in run order.

    Args:
        rounds: per boot round, its units in plan order (each config once; the same configs in every round).
        order: one of :data:`ORDERS` (module doc).
        seed: the plan's seed, for ``shuffle``.
        anchor: a unit that is in every round (the plan's ``anchor:``); ``balanced`` moves it to the middle of
            each round (ignored by the other orders, and where it is absent from a round).

    Returns:
        Every unit of every round once, flattened in run order.

    Raises:
        ValueError: an unknown order (names the choices).
    """
    if order not in ORDERS:
        raise ValueError(f"interleave: {order!r} is not a boot order; use one of {list(ORDERS)}")
    out: list[T] = []
    for r, rnd in enumerate(rounds):
        units = list(rnd)
        if order == "shuffle":
            random.Random(seed * 1000 + r).shuffle(units)
        elif order == "balanced":
            if anchor is not None and anchor in units:
                units.remove(anchor)
                units.insert(len(units) // 2, anchor)
            if r % 2 == 1:
                units.reverse()
        out += units
    return out
