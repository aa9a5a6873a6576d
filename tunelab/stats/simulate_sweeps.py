"""Seeded simulation of boots in several sweeps, with sweep shifts and drift in boot order (A/A by default).

Used by ``benchmarks/calibration_aa.py`` and ``tests/test_anchored.py`` to check the anchored comparison
(``stats.anchored``) against known variance components. Model of a boot's log value::

    log y = log base + effect [config is the candidate] + u_sweep + drift_per_sweep * t + w_k + e

with ``u_sweep ~ N(0, sd_sweep^2)`` per sweep, ``t`` the boot's position in its sweep as a fraction from -0.5
(first) to +0.5 (last), ``e`` the boot noise with SD ``sd_boot``: normal by default, Student t with ``noise_df``
degrees of freedom (heavy tails), or drawn from given standardised residuals (``noise_pool``: a runtime's own
boots, resampled), and ``w_k`` an optional wander: a Gaussian random walk over the sweep's boot order (the host's
state moving slowly and not in a line, which a linear drift term cannot remove), centred in each sweep and scaled
so that its SD over the sweep's boots is ``sd_wander`` in expectation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["simulate_sweeps"]


def simulate_sweeps(layout: list[list[str]], *, sd_boot: float, sd_sweep: float, drift: float = 0.0,
                    effects: dict[str, float] | None = None, base: float = 1000.0,
                    noise_df: float | None = None, noise_pool: np.ndarray | None = None,
                    sd_wander: float = 0.0, rng: np.random.Generator) -> pd.DataFrame:
    """One history of sweeps: ``layout[s]`` is sweep s's boot order (config names, e.g. ``["anchor", "a",
    "a", "anchor"]``).

    Args:
        sd_boot, sd_sweep: SDs of log values (about the CV) of a boot and of a sweep's shift.
        drift: log change over a sweep, first boot to last (the same in every sweep; its sign random per sweep
            when negative values are wanted, pass them in per call).
        effects: true relative effect per config (b/base - 1); missing configs have none (A/A).
        noise_df: Student t boot noise with these degrees of freedom (> 2), scaled to SD ``sd_boot``; None: normal.
        noise_pool: standardised residuals (mean 0, SD 1; e.g. a runtime's boot values less their config's mean,
            divided by their SD) drawn with replacement and scaled by ``sd_boot``; excludes ``noise_df``.
        sd_wander: SD (log scale) of the random-walk wander over each sweep's boots; 0: none.
        rng: a numpy Generator (seeded by the caller).

    Returns:
        DataFrame, one row per boot: ``config``, ``sweep`` (``s0``, ``s1``, ...), ``order`` (0-based within
        the sweep), ``value`` (> 0).

    Raises:
        ValueError: an empty sweep, negative SDs, an effect <= -1, ``noise_df`` <= 2, both noise options, or a
            ``noise_pool`` with fewer than 2 finite values.
    """
    if sd_boot < 0 or sd_sweep < 0 or sd_wander < 0:
        raise ValueError(f"sd_boot, sd_sweep and sd_wander must be >= 0, got {sd_boot}, {sd_sweep}, {sd_wander}")
    if noise_df is not None and noise_pool is not None:
        raise ValueError("give noise_df (Student t noise) or noise_pool (resampled residuals), not both")
    if noise_df is not None and not noise_df > 2:
        raise ValueError(f"noise_df must be > 2 (a finite variance to scale to sd_boot), got {noise_df}")
    pool = None
    if noise_pool is not None:
        pool = np.asarray(noise_pool, float)
        pool = pool[np.isfinite(pool)]
        if pool.size < 2:
            raise ValueError(f"noise_pool needs at least 2 finite residuals, got {pool.size}")
        pool = (pool - pool.mean()) / pool.std()
    effects = effects or {}
    if any(e <= -1 for e in effects.values()):
        raise ValueError(f"effects must be > -1 (a ratio - 1), got {effects}")
    rows = []
    for s, order in enumerate(layout):
        if not order:
            raise ValueError(f"sweep {s} of the layout has no boots")
        u = rng.normal(0.0, sd_sweep)
        n = len(order)
        wander = np.zeros(n)
        if sd_wander > 0 and n > 1:
            walk = np.cumsum(rng.normal(0.0, 1.0, n))
            walk -= walk.mean()
            # E[sample variance of a centred n-step walk] = (n + 1) / 6 (unit steps): scale it to sd_wander
            wander = walk * sd_wander / math.sqrt((n + 1) / 6.0)
        for k, cfg in enumerate(order):
            t = (k / (n - 1) - 0.5) if n > 1 else 0.0
            if pool is not None:
                e = sd_boot * float(rng.choice(pool))
            elif noise_df is not None:
                e = sd_boot * float(rng.standard_t(noise_df)) / math.sqrt(noise_df / (noise_df - 2.0))
            else:
                e = rng.normal(0.0, sd_boot)
            y = math.log(base) + math.log1p(effects.get(cfg, 0.0)) + u + drift * t + wander[k] + e
            rows.append({"config": cfg, "sweep": f"s{s}", "order": k, "value": math.exp(y)})
    return pd.DataFrame(rows, columns=["config", "sweep", "order", "value"])
