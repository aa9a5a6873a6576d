"""Seeded simulation of boots in several sweeps, with sweep shifts and drift in boot order (A/A by default).

Used by ``benchmarks/calibration_aa.py`` and ``tests/test_anchored.py`` to check the anchored comparison
(``stats.anchored``) against known variance components. Model of a boot's log value::

    log y = log base + effect [config is the candidate] + u_sweep + drift_per_sweep * t + e

with ``u_sweep ~ N(0, sd_sweep^2)`` per sweep, ``t`` the boot's position in its sweep as a fraction from -0.5
(first) to +0.5 (last), and ``e ~ N(0, sd_boot^2)`` per boot.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["simulate_sweeps"]


def simulate_sweeps(layout: list[list[str]], *, sd_boot: float, sd_sweep: float, drift: float = 0.0,
                    effects: dict[str, float] | None = None, base: float = 1000.0,
                    rng: np.random.Generator) -> pd.DataFrame:
    """One history of sweeps: ``layout[s]`` is sweep s's boot order (config names, e.g. ``["anchor", "a",
    "a", "anchor"]``).

    Args:
        sd_boot, sd_sweep: SDs of log values (about the CV) of a boot and of a sweep's shift.
        drift: log change over a sweep, first boot to last (the same in every sweep; its sign random per sweep
            when negative values are wanted, pass them in per call).
        effects: true relative effect per config (b/base - 1); missing configs have none (A/A).
        rng: a numpy Generator (seeded by the caller).

    Returns:
        DataFrame, one row per boot: ``config``, ``sweep`` (``s0``, ``s1``, ...), ``order`` (0-based within
        the sweep), ``value`` (> 0).

    Raises:
        ValueError: an empty sweep, negative SDs, an effect <= -1.
    """
    if sd_boot < 0 or sd_sweep < 0:
        raise ValueError(f"sd_boot and sd_sweep must be >= 0, got {sd_boot}, {sd_sweep}")
    effects = effects or {}
    if any(e <= -1 for e in effects.values()):
        raise ValueError(f"effects must be > -1 (a ratio - 1), got {effects}")
    rows = []
    for s, order in enumerate(layout):
        if not order:
            raise ValueError(f"sweep {s} of the layout has no boots")
        u = rng.normal(0.0, sd_sweep)
        n = len(order)
        for k, cfg in enumerate(order):
            t = (k / (n - 1) - 0.5) if n > 1 else 0.0
            y = math.log(base) + math.log1p(effects.get(cfg, 0.0)) + u + drift * t + rng.normal(0.0, sd_boot)
            rows.append({"config": cfg, "sweep": f"s{s}", "order": k, "value": math.exp(y)})
    return pd.DataFrame(rows, columns=["config", "sweep", "order", "value"])
