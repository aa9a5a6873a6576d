"""Statistics of tunelab's verdicts: the only place where intervals, noise models and designs are computed.

Pure domain code (numpy, scipy, pandas; no warehouse, no Prefect), so the warehouse, the sweep flow and the
benchmarks share one implementation:

* :mod:`tunelab.stats.intervals` - fixed-design A/B intervals of a relative effect on the log scale, with a
  variance that borrows strength across cells (empirical Bayes) and the minimum detectable effect (MDE).
* :mod:`tunelab.stats.verdict` - one cell's A/B verdict for the fixed and paired designs and the typed A/B
  record (``ABRecord``); the token-count check of two sides.
* :mod:`tunelab.stats.bounds` - what every verdict shares: the interval-to-call rule (the sequential A/B uses
  it too), Welch's interval (scipy), the t half-width, the 80 %-power z.
* :mod:`tunelab.stats.family` - the family of a report's verdicts: Holm's adjustment of the headline verdicts.
* :mod:`tunelab.stats.sequential` - the sequential A/B rule for ``replicates: auto``: paired log ratios of
  adjacent boots and an always-valid confidence sequence.
* :mod:`tunelab.stats.noise_model` - variance components per cell (between boots, between windows of a boot,
  within a window) by the method of moments (Kalibera and Jones 2013).
* :mod:`tunelab.stats.regressions` - regressions along releases or sweeps: the noise band, the
  consecutive-violation rule (PyTorch HUD) and the MDE of each point.
* :mod:`tunelab.stats.design` - windows per boot and boots per config for a target half-width at least cost.

The method, its assumptions and its measured error rates are in ``docs/statistics.md``.
"""
