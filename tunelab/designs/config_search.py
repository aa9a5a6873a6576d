"""``search:``: the plan's default config, then the configs optuna's TPE sampler asks for, one boot per answer, until
the budget is spent (``tunelab.core.search.config_tpe.run_search`` decides; this module turns its calls into the design protocol).

``run_search`` is written as a loop that calls ``boot(request)`` and waits for the boot's outcome. To answer the
sweep's "which trial next" it runs in a helper thread: each ``boot`` call hands its request to :meth:`next_trials`
and waits there for the trial's result, which the next :meth:`next_trials` call brings. One of the two threads runs
at a time. Each boot's prune rule (``SearchBoot.window_check``) travels with its :class:`TrialSpec`.
"""

from __future__ import annotations

import json
import queue
import threading
from typing import Any, Sequence

from tunelab.designs.base import TrialResult, TrialSpec
from tunelab.core.plan import Plan, Trial, config_key
from tunelab.core.search.config_tpe import BootOutcome, SearchBoot, SearchOutcome, flagged_bottlenecks, run_search

__all__ = ["SearchDesign"]

_END = object()  # the search thread's last message: run_search returned or raised


class SearchDesign:
    """The ``search:`` design: one boot per answer, as ``tunelab.core.search.config_tpe.run_search`` asks for them.

    Args:
        plan: the plan with ``search:``; its one trial (``plan.trials()[0]``) is the default config and the template
            of every other boot.
        logger: a logger (``info``/``warning``) for the search's lines.
        outcome: filled in as the search goes (default: a new one): after an interruption it holds what the search
            knew (``stop_reason`` ``interrupted``, the boot it ended ``cancelled``).

    Attributes:
        outcome: the :class:`tunelab.core.search.config_tpe.SearchOutcome`.

    Raises:
        From :meth:`next_trials`: whatever ``run_search`` raised (a bug, an optuna error).
    """

    gate_each_trial = True

    def __init__(self, plan: Plan, logger: Any, outcome: SearchOutcome | None = None):
        assert plan.search is not None
        self.plan, self.logger = plan, logger
        self.outcome = outcome if outcome is not None else SearchOutcome()
        self.trials_total: int | None = plan.search.budget.boots
        self.base: Trial = plan.trials()[0]
        self.workload, self.load = plan.search_cell()
        self._asks: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._waiting = False  # a boot was handed out and its result is due
        self._error: BaseException | None = None
        self._ended = False  # the search has returned (or raised)

    # -- the protocol -------------------------------------------------------------------------------------------
    def next_trials(self, done: Sequence[TrialResult]) -> list[TrialSpec]:
        """The next boot the search asks for (the default first); nothing once the search stopped."""
        if self._ended:
            return []
        if self._thread is None:
            self._start()
        elif self._waiting:
            self._waiting = False
            self._answers.put(self._boot_outcome(done[-1]))
        req = self._asks.get()
        if req is _END:
            self._ended = True
            self._thread.join()
            if self._error is not None:
                raise self._error
            return []
        self._waiting = True
        return [self._spec(req)]

    def interrupted(self, exc: BaseException) -> None:
        """The boot that ran is told ``exc``: ``run_search`` records it ``cancelled`` and stops
        (``stop_reason`` ``interrupted``)."""
        if self._waiting and self._thread is not None:
            self._waiting = False
            self._answers.put(exc)
            self._thread.join(timeout=60)

    # -- the search's side ----------------------------------------------------------------------------------------
    def _start(self) -> None:
        plan, spec = self.plan, self.plan.search
        self.logger.info("search: %s %s at %s %s under SLO %s; budget %s; space: %s", spec.objective.direction,
                         spec.objective.metric, self.workload, self.load,
                         {k: v for k, v in plan.slo.model_dump().items() if v is not None} or "none",
                         ", ".join(f"{k} {v:g}" for k, v in spec.budget.model_dump().items() if v is not None),
                         json.dumps(spec.space.model_dump(exclude_defaults=True), default=str))
        longest = max(w.prompt_tokens + w.output_tokens for w in plan.workloads)
        base = self.base

        def search() -> None:
            try:
                run_search(spec, base_args=dict(base.engine_args), base_env=dict(base.env), seed=plan.seed,
                           workload=self.workload, load=self.load, slo=plan.slo.model_dump(), boot=self._boot,
                           min_model_len=longest, key=lambda a, e: config_key(plan.model_id(), a, e),
                           log=self.logger.info, outcome=self.outcome)
            except BaseException as e:  # noqa: BLE001 - an interruption told by interrupted() ends here too
                if isinstance(e, Exception):
                    self._error = e
            finally:
                self._asks.put(_END)

        self._thread = threading.Thread(target=search, name="tunelab-search", daemon=True)
        self._thread.start()

    def _boot(self, req: SearchBoot) -> BootOutcome:
        """``run_search``'s ``boot``: hand the request to the sweep, wait for its outcome (an interruption is
        raised here, as a boot that was interrupted raises)."""
        self._asks.put(req)
        ans = self._answers.get()
        if isinstance(ans, BaseException):
            raise ans
        return ans

    def _spec(self, req: SearchBoot) -> TrialSpec:
        if req.walked:
            self.logger.info("search: memory walk-down: %s", req.walked)
        if req.role == "default":
            return TrialSpec(self.base, window_check=req.window_check)
        # The label shows the space's names and whatever a walk-down changed beside them.
        space, base = self.plan.search.space, self.base
        axes = list(space.engine_args) + list(space.env)
        axes += [k for k, v in req.engine_args.items() if k not in axes and base.engine_args.get(k) != v]
        t = base.model_copy(update={"engine_args": req.engine_args, "env": req.env, "name": None,
                                    "axes": tuple(axes)})
        return TrialSpec(t, window_check=req.window_check)

    def _boot_outcome(self, r: TrialResult) -> BootOutcome:
        st = r.status
        tables = r.tables()
        # The diagnosis of its windows at the objective's cell: what the search may try next (search.guide).
        return BootOutcome(status=st.get("status") or "failed", failure_class=st.get("failure_class"),
                           measurements=tables.get("measurements"), usable=st.get("verdict") in ("pass", "warn"),
                           gpu_minutes=r.gpu_minutes, trial_id=r.trial_id,
                           bottlenecks=flagged_bottlenecks(tables.get("window_diagnoses"), self.workload, self.load))
