"""Request arrival schedules for rate-driven load (open-loop benchmarking).

A trial measured at a *request rate* sends requests at pre-computed offsets from
the start of the measurement, independent of how fast the server answers. This
module computes those offsets, with the same statistical model as
``vllm bench serve --request-rate R --burstiness B`` (vllm/benchmarks/serve.py,
``get_request``): the gaps between successive requests are independent draws

* from an exponential distribution with mean ``1/R`` when ``B == 1``
  (a Poisson process), or
* from a gamma distribution with shape ``B`` and scale ``1/(R*B)`` otherwise, so the
  mean gap stays ``1/R`` and the coefficient of variation of the gaps is
  ``1/sqrt(B)``: ``B < 1`` is burstier than Poisson, ``B > 1`` more regular,
  ``B = inf`` perfectly regular (every gap exactly ``1/R``).

``R = inf`` sends everything at once (all offsets 0), as in vLLM.

Offsets are the cumulative sums of the gaps, so the first request also waits one
gap, as vLLM's scheduler does. Unlike vLLM (which draws from numpy's global
random state), draws come from a seeded ``numpy.random.Generator`` so a schedule
is reproducible and identical across configs being compared.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["arrival_offsets"]


def arrival_offsets(
    n: int,
    rate_per_s: float,
    burstiness: float = 1.0,
    seed: int = 0,
    *,
    match_total_duration: bool = False,
) -> np.ndarray:
    """Send offsets, in seconds from the start of the measurement, of ``n`` requests.

    Args:
        n: number of requests (>= 0).
        rate_per_s: mean request rate in requests/s (> 0); ``float('inf')`` sends
            all requests at offset 0.
        burstiness: shape of the gamma distribution of the gaps (> 0), as
            ``vllm bench serve --burstiness``. 1.0 gives a Poisson process
            (exponential gaps); ``float('inf')`` gives constant gaps ``1/rate``.
        seed: seed of the ``numpy.random.default_rng`` generator; the same
            arguments always give the same offsets.
        match_total_duration: if True, rescale the offsets so the last one is
            exactly ``n / rate_per_s`` (what recent ``vllm bench serve`` versions do
            "to stabilise throughput across seeds"). This conditions the process
            on its total length; the default False keeps an unconditioned renewal
            process, whose realised mean rate differs from ``rate_per_s`` by
            about ``1/sqrt(n * burstiness)`` relative.

    Returns:
        ``numpy.ndarray`` of shape ``(n,)``, dtype float64, non-decreasing, >= 0.

    Raises:
        ValueError: when ``n`` is not a non-negative integer, ``rate_per_s`` is not
            a positive number (``inf`` allowed), ``burstiness`` is not positive
            (``inf`` allowed), or ``seed`` is not an integer.

    Source: vLLM ``vllm/benchmarks/serve.py::get_request`` (gamma with
    ``shape=burstiness, scale=1/(rate*burstiness)``; exponential when burstiness is 1).
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"arrival_offsets: n must be a non-negative integer (number of requests), got {n!r}")
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, numbers.Real) or math.isnan(rate_per_s) or rate_per_s <= 0:
        raise ValueError(
            f"arrival_offsets: rate_per_s must be a positive number of requests/s "
            f"(float('inf') to send all at once), got {rate_per_s!r}"
        )
    if isinstance(burstiness, bool) or not isinstance(burstiness, numbers.Real) or math.isnan(burstiness) or burstiness <= 0:
        raise ValueError(
            f"arrival_offsets: burstiness must be > 0 (1 = Poisson, <1 burstier, >1 more regular, "
            f"inf = constant gaps), got {burstiness!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"arrival_offsets: seed must be an integer, got {seed!r}")

    n = int(n)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    if math.isinf(rate_per_s):
        return np.zeros(n, dtype=np.float64)

    mean_gap_s = 1.0 / float(rate_per_s)
    if math.isinf(burstiness):
        gaps = np.full(n, mean_gap_s, dtype=np.float64)
    else:
        rng = np.random.default_rng(int(seed))
        if burstiness == 1.0:
            gaps = rng.exponential(scale=mean_gap_s, size=n)
        else:
            gaps = rng.gamma(shape=float(burstiness), scale=mean_gap_s / float(burstiness), size=n)
    offsets = np.cumsum(gaps, dtype=np.float64)
    if match_total_duration and offsets[-1] > 0:
        offsets *= (n * mean_gap_s) / offsets[-1]
    return offsets
