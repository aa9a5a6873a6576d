"""What a plan will cost before it runs: boots, windows, requests, the largest window's prompts and an estimate
of the time, made from the plan alone (``tunelab plan check`` prints it, ``tunelab run``'s display starts from it).

How the time is estimated (a rough guide, not a measurement; the first sweep's own numbers say more):

    boots x typical boot seconds of the device
    + per window: its requests / expected rate (warm-up requests too), or its ``window.duration_s``

with the typical figures of :data:`TYPICAL`: boots of 15-40 s on a 2-core CPU host with the tiny model and
45-110 s on an H200 with an 8B model (seen in the sweeps of docs/measurement.md and the evidence reports; the
middle is taken). Where this host's warehouse holds boots of a runtime (``warehouse.boot_history``, passed in as
``history``), their mean warm boot replaces the typical one; and a GPU runtime whose compile cache is empty
(``cold_runtimes``: ``tasks.compile_cache.has_compiled`` false) pays for one cold compile on top, the history's
cold-minus-warm mean or :data:`COLD_COMPILE_S` (cold boots were 56-71 s longer than warm ones on the H100 and
H200 runs of 2026-12-03 and 2026-12-07; one compile a runtime: configs that differ only in env share it). Expected rate: a request-rate level sends its rate, a trace level its replay's mean rate
(requests over the trace's span / speedup); a concurrency level ``c`` keeps ``c``
requests in flight, each lasting ``TTFT + output_tokens x TPOT`` with the device's typical TTFT and TPOT, so
``c / (ttft_s + output_tokens x tpot_s)`` requests/s. ``output_tokens`` is the workload's longest output, except
for a dataset workload (ShareGPT and the like), whose requests ask for their own lengths: there it is the mean
of the file's output lengths (:func:`dataset_output_tokens`: a record's ``output_tokens``, else its reference
answer at about :data:`CHARS_PER_TOKEN` characters a token, else ``max_output_tokens``; each capped at
``max_output_tokens``), and the ``how`` line says which.

Limits (:data:`MAX_WINDOW_REQUESTS`, :data:`MAX_WINDOW_PROMPT_TOKENS`) are enforced by the plan's validation
(``tunelab.core.plan``): a window's prompts are built before it starts (building them while it runs would put
``/tokenize`` calls on the server being measured) and held while it runs, so a window's size bounds memory.
The warnings (:data:`WARN_SWEEP_S`, :data:`WARN_REQUESTS`, :func:`sla_reach_warnings`) are only printed: a long
plan may be meant.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

# The limits live with the plan's validation, which enforces them; named here too, where they are explained.
from tunelab.core.plan import MAX_WINDOW_PROMPT_TOKENS, MAX_WINDOW_REQUESTS, Plan, requests_for_level

__all__ = ["CHARS_PER_TOKEN", "COLD_COMPILE_S", "MAX_WINDOW_PROMPT_TOKENS", "MAX_WINDOW_REQUESTS", "TYPICAL", "WARN_REQUESTS",
           "WARN_SWEEP_S", "DeviceFigures", "PlanCost", "cost_lines", "dataset_output_tokens", "load_note", "load_now",
           "plan_cost", "sla_reach_warnings"]

#: A plan estimated to run longer than this many seconds gets a warning (a day).
WARN_SWEEP_S = 24 * 3600.0
#: A plan sending more requests than this in all gets a warning.
WARN_REQUESTS = 1_000_000


@dataclass(frozen=True)
class DeviceFigures:
    """Typical figures of a device kind, seconds: a boot, a TTFT, a TPOT. Assumptions, see the module docstring."""

    boot_s: float
    ttft_s: float
    tpot_s: float


#: ``'cpu'``: the tiny model on a 2-core host; ``'cuda'``: an 8B model on one H200 (module docstring).
TYPICAL = {"cpu": DeviceFigures(boot_s=30.0, ttft_s=0.05, tpot_s=0.02),
           "cuda": DeviceFigures(boot_s=80.0, ttft_s=0.05, tpot_s=0.01)}
#: Seconds a GPU runtime's first boot adds when its compile cache is empty and the warehouse has no cold boot of it
#: to say better (module docstring). The CPU runtime keeps no torch.compile cache: nothing is added there.
COLD_COMPILE_S = 60.0


@dataclass
class PlanCost:
    """What a plan will do and an estimate of how long it takes.

    Attributes:
        boots: trials (one server boot each). windows: measured windows over all trials.
        measured_requests, warmup_requests: requests over all trials.
        largest_window_requests, largest_window_prompt_tokens: the biggest window (prompts held in memory).
        boot_s, requests_s: the two parts of the estimate, seconds; estimate_s: their sum.
        how: one line saying how the estimate was made (devices and figures).
        warnings: lines for a plan that may not fit (a day or more, millions of requests).
    """

    boots: int
    windows: int
    measured_requests: int
    warmup_requests: int
    largest_window_requests: int
    largest_window_prompt_tokens: int
    boot_s: float
    requests_s: float
    how: str
    warnings: list[str] = field(default_factory=list)

    @property
    def estimate_s(self) -> float:
        """``boot_s + requests_s``, seconds."""
        return self.boot_s + self.requests_s


#: Characters a token, to estimate a reference answer's length before the runtime's tokenizer counts it (the
#: measurement counts it exactly; English text under a BPE tokenizer runs about 4).
CHARS_PER_TOKEN = 4


def dataset_output_tokens(profile) -> tuple[float, str] | None:
    """The mean output length a dataset workload asks for, tokens, and where it came from in words.

    Args:
        profile: a workload's type (``Workload.profile``); anything but a dataset gives None.

    Returns:
        ``(mean tokens, source)``: per usable record, its ``output_tokens``, else its reference answer's length at
        :data:`CHARS_PER_TOKEN` characters a token, else ``max_output_tokens`` (the request asks for the cap), each
        capped at ``max_output_tokens`` as the requests are (``workloads.DatasetWorkload``); the source names
        how many records gave each. None for a workload that is not a dataset or has no records.
    """
    if getattr(profile, "type", None) != "dataset":
        return None
    cap = profile.max_output_tokens
    lengths, known, answers, capped = [], 0, 0, 0
    for e in profile.entries():
        if e.output_tokens is not None:
            lengths.append(min(e.output_tokens, cap))
            known += 1
        elif e.output_text:
            lengths.append(min(max(1, len(e.output_text) // CHARS_PER_TOKEN), cap))
            answers += 1
        else:
            lengths.append(cap)
            capped += 1
    if not lengths:
        return None
    parts = [f"{known} records' output_tokens"] if known else []
    parts += [f"{answers} reference answers at ~{CHARS_PER_TOKEN} characters a token"] if answers else []
    parts += [f"{capped} records without a length at max_output_tokens"] if capped else []
    source = (f"mean of the file's output lengths ({', '.join(parts)}; capped at {cap})" if known or answers
              else f"max_output_tokens {cap} (the file gives no output lengths)")
    return sum(lengths) / len(lengths), source


def _rate_per_s(profile, output_tokens: int, fig: DeviceFigures, arrivals_s: list[float] | None = None) -> float:
    """Expected requests/s of a window at ``profile`` (module docstring); ``arrivals_s``: the workload's own
    arrival offsets (a trace), which a trace level replays."""
    c = profile.target_concurrency
    if c:
        return c / (fig.ttft_s + output_tokens * fig.tpot_s)
    # open loop: the rate the level offers (a trace level: its replay's); else its value
    return profile.offered_rate_per_s(arrivals_s) or float(profile.value)


def plan_cost(plan: Plan, devices: dict[str, str] | None = None, history: Mapping[str, Any] | None = None,
              cold_runtimes: Collection[str] = ()) -> PlanCost:
    """The cost of ``plan``: counts from its expansion, the time from :data:`TYPICAL` or this host's history.

    Args:
        plan: a validated plan.
        devices: runtime name -> ``'cpu'`` | ``'cuda'`` (``Runtime.device``) for the runtimes known here; a
            runtime not in it is taken as ``'cpu'`` when it is named ``cpu`` or starts with ``cpu``, else ``'cuda'``.
        history: runtime name -> its measured boots (``warehouse.boot_history.BootHistory``: ``warm_boot_s``,
            ``warm_boots``, ``cold_extra_s``, ``cold_boots``); a runtime with a measured warm boot uses it.
        cold_runtimes: GPU runtimes whose compile cache is empty: one cold compile each is added to the boots.

    Returns:
        :class:`PlanCost`; its ``how`` says which figures were measured here and which are typical.
    """
    devices = dict(devices or {})
    history = dict(history or {})
    trials = plan.trials()
    profiles = plan.load_profiles()
    duration_s = plan.window.duration_s if getattr(plan, "window", None) else None
    per_trial_windows = len(plan.workloads) * len(profiles) * plan.repeats
    measured = warm = 0
    biggest_n = biggest_tok = 0
    boot_s = req_s = 0.0
    used: dict[str, str] = {}
    # A dataset's requests ask for their own output lengths: its mean, not its longest, sets a request's time.
    ds_out = {w.name: d for w in plan.workloads if (d := dataset_output_tokens(w.profile)) is not None}
    for t in trials:
        dev = devices.get(t.runtime) or ("cpu" if t.runtime.startswith("cpu") else "cuda")
        used[t.runtime] = dev
        fig = TYPICAL.get(dev, TYPICAL["cuda"])
        h = history.get(t.runtime)
        boot_s += h.warm_boot_s if h is not None and h.warm_boot_s else fig.boot_s
        for w in plan.workloads:
            for lv in profiles:
                n = requests_for_level(plan, w, lv)
                n_warm = lv.warmup_requests(plan.warmup_requests)
                arrivals = ([sp.arrival_offset_s for sp in w.profile.request_specs(n, plan.seed)]
                            if w.profile.has_arrivals else None)
                rate = _rate_per_s(lv, ds_out[w.name][0] if w.name in ds_out else w.output_tokens, fig, arrivals)
                warm += n_warm
                req_s += n_warm / rate
                if duration_s is not None:
                    n = int(rate * duration_s)
                    req_s += plan.repeats * duration_s
                else:
                    req_s += plan.repeats * n / rate
                measured += plan.repeats * n
                biggest_n = max(biggest_n, n)
                biggest_tok = max(biggest_tok, n * w.prompt_tokens)
    booted_here = {rt for rt in used if rt in history and history[rt].warm_boot_s}
    figs = "; ".join(f"{rt}: {dev} ({'' if rt in booted_here else f'boot ~{TYPICAL[dev].boot_s:g} s, '}"
                     f"TTFT ~{TYPICAL[dev].ttft_s:g} s, TPOT ~{TYPICAL[dev].tpot_s:g} s)" for rt, dev in used.items())
    # "warm" only where cold boots were recorded apart (the CPU runtime keeps no compile cache to be cold)
    measured_here = [f"{rt} ~{history[rt].warm_boot_s:.0f} s, the mean of {history[rt].warm_boots} "
                     f"{'warm ' if history[rt].cold_boots else ''}boot(s)" for rt in used if rt in booted_here]
    cold_notes = []
    for rt in used:
        if rt in cold_runtimes and used[rt] == "cuda":
            h = history.get(rt)
            extra = h.cold_extra_s if h is not None and h.cold_extra_s is not None else COLD_COMPILE_S
            boot_s += extra
            cold_notes.append(f"{rt} +{extra:.0f} s (" + (f"cold minus warm boots here, {h.cold_boots} cold"
                              if h is not None and h.cold_extra_s is not None else "typical") + ")")
    how = (f"boots x {'boot' if measured_here else 'typical boot'} + each window's requests / expected rate "
           f"(concurrency c: c / (TTFT + output_tokens x TPOT); a rate level: its rate)"
           f"{'; duration windows: their duration' if duration_s else ''}"
           + (f"; boots measured in this warehouse: {', '.join(measured_here)}" if measured_here else "")
           + (f"; first boot compiles, the compile cache being empty: {', '.join(cold_notes)}" if cold_notes else "")
           + f"; typical figures, not measured here: {figs}")
    for name, (mean, source) in ds_out.items():
        how += f"; output_tokens of dataset workload {name}: ~{mean:.0f}, the {source}"
    if getattr(plan, "replicates", None) == "auto":
        how += ("; replicates: auto: every boot the A/B's budget allows, an upper bound (the sweep stops when the "
                "A/B is decided)")
    sla = getattr(plan, "sla_search", None)
    if sla is not None:
        how += (f"; sla_search not included: up to {sla.max_levels()} levels x {sla.max_windows_per_level} windows "
                "per workload and trial on top (docs/sla_search.md; typically about half of that)")
    n_boots = len(trials)
    search = getattr(plan, "search", None)
    if search is not None and trials:
        # The plan's trials are the default config only; the search boots up to its budget, each costing about
        # what the default costs (an upper bound: pruned boots stop after their first windows).
        budget = search.budget
        if budget.boots:
            f = budget.boots / len(trials)
            n_boots, boot_s, req_s, measured, warm = budget.boots, boot_s * f, req_s * f, int(measured * f), int(warm * f)
            how += f"; search: the budget's {budget.boots} boots at the default's cost, an upper bound"
        if budget.gpu_minutes:
            how += f"; search: stops before {budget.gpu_minutes:g} GPU-minutes"
    cost = PlanCost(boots=n_boots, windows=per_trial_windows * n_boots, measured_requests=measured,
                    warmup_requests=warm, largest_window_requests=biggest_n,
                    largest_window_prompt_tokens=biggest_tok, boot_s=boot_s, requests_s=req_s, how=how)
    if cost.estimate_s > WARN_SWEEP_S:
        cost.warnings.append(f"estimated {cost.estimate_s / 3600:.1f} h, more than {WARN_SWEEP_S / 3600:g} h: "
                             "fewer repeats, replicates, levels or num_requests make it shorter")
    if measured + warm > WARN_REQUESTS:
        cost.warnings.append(f"{measured + warm:,} requests in all, more than {WARN_REQUESTS:,}: check "
                             "num_requests, requests_per_concurrency and repeats")
    cost.warnings.extend(sla_reach_warnings(plan))
    return cost


def sla_reach_warnings(plan: Plan) -> list[str]:
    """Warnings for an ``sla_search: {load: concurrency}`` whose windows cannot reach the top of its range: a
    window of ``n <= c`` requests at concurrency ``c`` sends them all at once and drains, with no steady part,
    so the client never keeps ``c`` in flight and the search fails that level on its load
    (``sla_search.load_shortfall``). One line per workload, naming the window's size, the highest level its
    windows can reach and the fix; none for a rate search or a range every window of which is larger than its
    concurrency."""
    from tunelab.core.load_profiles import ConcurrencyProfile

    spec = getattr(plan, "sla_search", None)
    if spec is None or spec.load != "concurrency":
        return []
    out = []
    top, start = int(spec.max), int(spec.start)
    for w in plan.workloads:
        def n_at(c: int) -> int:
            return requests_for_level(plan, w, ConcurrencyProfile(concurrency=c))

        n = n_at(top)
        if n > top:
            continue
        reach = next((c for c in range(top - 1, start - 1, -1) if n_at(c) > c), None)
        lower = (f"lower sla_search.max to {reach}" if reach is not None
                 else f"no level from sla_search.start ({start}) up can be reached")
        out.append(f"sla_search: the window of {w.name} at c={top} holds {n} request{'s' if n != 1 else ''}, not "
                   f"more than its {top} in flight: it has no steady part, the client cannot keep c={top} in "
                   f"flight, and the search will not pass that level (load not reached, under "
                   f"{plan.quality.min_concurrency_ratio:g} x the level); raise {w.name}'s num_requests above "
                   f"{top} (or set requests_per_concurrency: 2 or more), or {lower}")
    return out


def _fmt_s(seconds: float) -> str:
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def _load_and_cores(load_1min: float | None, cores: int | None) -> tuple[float, int] | None:
    """(1-minute load average, CPUs this process may use), defaults read from the OS; None without a load."""
    if load_1min is None:
        try:
            load_1min = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
    return load_1min, cores


def load_now(load_1min: float | None = None, cores: int | None = None) -> str | None:
    """The machine's load now in words, e.g. ``"load now 8.2 on 2 cores"``; None where the OS gives no load.

    Args:
        load_1min: the 1-minute load average (default: ``os.getloadavg()``).
        cores: CPUs this process may use (default: ``len(os.sched_getaffinity(0))`` or ``os.cpu_count()``).
    """
    got = _load_and_cores(load_1min, cores)
    if got is None:
        return None
    load, n = got
    return f"load now {load:.1f} on {n} core{'s' if n != 1 else ''}"


def load_note(load_1min: float | None = None, cores: int | None = None) -> str:
    """The estimate's assumption in words, with the machine's load now: the typical figures are for an otherwise
    idle machine, and on a busy one boots and windows take longer (a sweep of the README's demo took 3.5-4 min
    idle and 62-74 min at a load average of 8-18 on 2 cores).

    Args: as :func:`load_now`.
    Returns: one phrase, e.g. ``"assumes an otherwise idle machine; load now 8.2 on 2 cores: expect longer"``.
    """
    got = _load_and_cores(load_1min, cores)
    if got is None:
        return "assumes an otherwise idle machine"
    # A load above the cores means runnable work is queueing for CPU: boots and windows stretch with it.
    return (f"assumes an otherwise idle machine; {load_now(*got)}"
            + (": expect longer" if got[0] > got[1] else ""))


def cost_lines(cost: PlanCost) -> list[str]:
    """What ``tunelab plan check`` prints about the cost: counts, the estimate and how it was made."""
    return [
        f"cost: {cost.boots} boot(s), {cost.windows} measured window(s), {cost.measured_requests:,} measured + "
        f"{cost.warmup_requests:,} warm-up requests; largest window {cost.largest_window_requests:,} requests "
        f"({cost.largest_window_prompt_tokens:,} prompt tokens)",
        f"estimated time: ~{_fmt_s(cost.estimate_s)} (boots ~{_fmt_s(cost.boot_s)}, requests ~{_fmt_s(cost.requests_s)}; "
        f"{load_note()})",
        f"how: {cost.how}",
    ]
