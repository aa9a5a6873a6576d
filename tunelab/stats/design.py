"""Design from the noise model: windows per boot and boots per config for a target precision at least cost.

Kalibera and Jones ("Rigorous benchmarking in reasonable time", ISMM 2013): with between-boot variance
``var_boot``, between-window variance ``var_window`` (log scale), a boot costing ``boot_s`` seconds and a
window ``window_s``, the mean over ``n_b`` boots of ``n_w`` windows has variance
``(var_boot + var_window / n_w) / n_b`` at cost ``n_b (boot_s + n_w window_s)``; the cost-optimal ``n_w`` is
``sqrt(var_window boot_s / (var_boot window_s))`` whatever the target. An A/B compares two such means, so the
log ratio's variance is twice that, and the 95 % half-width is ``t * sqrt(2 (var_boot + var_window/n_w)/n_b)``.
Integer ``n_w`` around the optimum are searched, and for each the least ``n_b`` reaching the target.

A config with no history has no components: :func:`pilot_design` (3 boots x 3 windows) measures them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from tunelab.stats.bounds import t_half_width

__all__ = ["Design", "ab_half_width", "optimal_design", "pilot_design"]


@dataclass(frozen=True)
class Design:
    """A design for one config (an A/B runs it on both sides).

    Attributes:
        windows_per_boot, boots_per_config: counts.
        half_width: expected relative half-width of the A/B ratio's interval (e.g. 0.03 = +-3 %), nan for a pilot.
        gpu_s_per_config: boots x (boot_s + windows x window_s), seconds.
        measuring_fraction: share of that time inside measurement windows.
        reachable: whether the target half-width is reached within the limits.
        pilot: True for a pilot design (no history).
        note: a sentence for reports.
    """

    windows_per_boot: int
    boots_per_config: int
    half_width: float
    gpu_s_per_config: float
    measuring_fraction: float
    reachable: bool
    pilot: bool
    note: str


def ab_half_width(var_boot: float, var_window: float, boots: int, windows: int, *,
                  confidence: float = 0.95) -> float:
    """Expected relative half-width (``exp(hw) - 1``) of an A/B with ``boots`` per side, ``windows`` per boot.

    The t quantile has ``2 (boots - 1)`` df (no history). Raises ValueError for boots < 2 or windows < 1.
    """
    if boots < 2 or windows < 1:
        raise ValueError(f"boots must be >= 2 and windows >= 1, got {boots}, {windows}")
    se = math.sqrt(2.0 * (var_boot + var_window / windows) / boots)
    return math.expm1(t_half_width(se, 2 * (boots - 1), 0.5 + confidence / 2))


def optimal_design(var_boot: float, var_window: float, boot_s: float, window_s: float, half_width: float, *,
                   confidence: float = 0.95, max_windows: int = 20, max_boots: int = 40) -> Design:
    """The least-GPU-time design whose A/B interval reaches ``half_width`` (relative, e.g. 0.03).

    Args:
        var_boot, var_window: log-scale components of the noise model (``stats.noise_model.variance_components``).
        boot_s: seconds per boot (start to ready plus teardown); window_s: seconds per window (with warm-up).
        half_width: target relative half-width of the 95 % interval of candidate/baseline - 1.
        max_windows, max_boots: limits; when the target is out of reach the design at the limits is returned
            with ``reachable=False`` and the half-width it does reach.

    Raises:
        ValueError: negative or non-finite variances, non-positive costs or half-width.
    """
    for name, v in (("var_boot", var_boot), ("var_window", var_window)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite variance >= 0 of log values, got {v}")
    for name, v in (("boot_s", boot_s), ("window_s", window_s), ("half_width", half_width)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be > 0, got {v}")
    best: Design | None = None
    for nw in range(1, max_windows + 1):
        for nb in range(2, max_boots + 1):
            hw = ab_half_width(var_boot, var_window, nb, nw, confidence=confidence)
            if hw <= half_width:
                cost = nb * (boot_s + nw * window_s)
                if best is None or cost < best.gpu_s_per_config:
                    best = Design(nw, nb, hw, cost, nw * window_s / (boot_s + nw * window_s), True, False,
                                  f"{nb} boots x {nw} windows per config reach +-{hw:.1%} "
                                  f"({2 * cost / 60:.1f} GPU-min per A/B pair)")
                break
    if best is not None:
        return best
    nw_opt = math.sqrt(var_window * boot_s / (var_boot * window_s)) if var_boot > 0 else max_windows
    nw = max(1, min(max_windows, round(nw_opt)))
    hw = ab_half_width(var_boot, var_window, max_boots, nw, confidence=confidence)
    cost = max_boots * (boot_s + nw * window_s)
    floor = math.expm1(float(stats.norm.ppf(0.5 + confidence / 2)) * math.sqrt(2 * var_boot / max_boots))
    return Design(nw, max_boots, hw, cost, nw * window_s / (boot_s + nw * window_s), False, False,
                  f"+-{half_width:.1%} is out of reach: {max_boots} boots x {nw} windows give +-{hw:.1%} "
                  f"({2 * cost / 60:.0f} GPU-min per pair); boot-to-boot noise alone limits {max_boots} boots "
                  f"to +-{floor:.1%}")


def pilot_design(boot_s: float = 90.0, window_s: float = 10.0) -> Design:
    """The design for a config with no history: 3 boots x 3 windows, enough to estimate both components
    (2 df between boots, 6 within) before :func:`optimal_design` takes over. Costs as in :class:`Design`."""
    cost = 3 * (boot_s + 3 * window_s)
    return Design(3, 3, math.nan, cost, 3 * window_s / (boot_s + 3 * window_s), False, True,
                  "pilot: no history for this config; 3 boots x 3 windows measure its noise")
