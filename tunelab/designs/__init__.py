"""Designs of a sweep: which trials to boot next, given the results so far.

One protocol (:class:`tunelab.designs.base.Design`), one module per design:

- :mod:`tunelab.designs.grid`: the plan's fixed grid, replicates interleaved in plan order (every trial at once);
- :mod:`tunelab.designs.sequential_ab`: ``replicates: auto``, A and B in pairs until the A/B is decided;
- :mod:`tunelab.designs.config_search`: ``search:``, the configs optuna's TPE sampler asks for, one boot at a time.

The sweep (``flows.sweep``) owns the one loop that asks a design for trials and dispatches them to devices; a design
knows nothing of devices, locks, Prefect or the warehouse. Adding a design touches its module, its plan field, its
tests and its doc.
"""

from tunelab.designs.base import Design, TrialResult, TrialSpec

__all__ = ["Design", "TrialResult", "TrialSpec"]
