"""A sweep whose trials run on several GPU hosts: one Prefect server, one process work pool, one worker per host.

    coordinator (any host; flow ``multi_host_sweep``)
      -> one flow run of deployment ``host-trial/host-trial`` per trial, in plan order, into the work pool
    every GPU host: ``prefect worker start --pool tunelab-gpu --type process --limit <its GPUs>``
      -> runs ``host_trial``: takes a free local device (host file lock + Prefect slot ``tunelab-<host>-gpu<i>``),
         runs the ``trial`` flow on it (clean GPU, boot, measure, teardown, bundle in its own tunelab home),
         validates the bundle and copies it into the results store
    coordinator, when every trial run is final:
      -> ``load_pending(db, store)``: the one loader, the single writer of the DuckDB file

Why this shape. Workers pull work, so a host takes a trial only when it has a free device (its ``--limit`` is
its GPU count); trials of one sweep thus spread over the hosts in plan order, and a host that is lost only
loses its running trials. Bundles are the interface: each host writes complete bundles (``tunelab.core.bundle``,
atomic) in its own home, then copies them into the store under a temporary name and renames them there, so
the loader never reads half a bundle. The store is a folder every host can write (NFS, a mounted bucket);
docs/multi_host.md gives the deployment, the ports and the alternatives. Only the coordinator opens the
warehouse: DuckDB allows one writer process.

Lost hosts and a stopped coordinator. Prefect leaves a run Running when the process worker that ran it is killed
(Prefect issues 16746, 16515: nothing reports the end), and the coordinator's runs are not subflows, so
cancelling the coordinator leaves them running or scheduled (Prefect issues 22594, 12713). So:

- each ``host_trial`` writes a heartbeat into the store (:func:`heartbeat_path`, every :data:`HEARTBEAT_S` s,
  from a thread of the run's process); the coordinator keeps, per Running run, when it last saw that heartbeat
  change, by its own clock (no clock of another host is compared). A run Running with no new beat for
  ``stale_s`` (default :data:`STALE_S`) is a zombie: the coordinator sets it Crashed (forced) with the reason
  (host, last beat, how long) and reports it in :class:`MultiHostSummary` (``crashed``) and its log;
- the coordinator, ended in any way Python sees (its ``timeout_s``, Prefect's cancel, Ctrl-C, an error), sets
  every run it submitted that is not final to Cancelled (Scheduled/Pending) or Cancelling (Running: its worker
  stops the process) and lists them (:func:`cancel_unfinished`).

Hosts are named by :func:`tunelab.flows.devices.host_name` (``TUNELAB_HOST`` or the host name): in slot names, in
``trials.host`` and in the results.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from prefect import flow, get_run_logger

from tunelab.host import paths

from tunelab.core import records
from tunelab.flows.devices import (
    SLOT_LEASE_S,
    Device,
    free_device_locks,
    gpus_needed,
    host_devices,
    host_name,
    device_env,
    ensure_slots,
    prefect_slots_enabled,
    slot_name,
)
from tunelab.flows.sweep import _sweep_row, preflight
from tunelab.tasks.steps.validate import validate_task
from tunelab.flows.trial import TrialContext, run_trial
from tunelab.core.plan import load_plan
from tunelab.host.slot_holders import hold_slots
from tunelab.tasks.gpu import inventory
from tunelab.warehouse.loader import load_pending

__all__ = ["HEARTBEAT_S", "HOST_DEPLOYMENT", "MultiHostSummary", "STALE_S", "cancel_unfinished", "heartbeat",
           "heartbeat_path", "host_trial", "multi_host_sweep", "ship_bundle", "wait_for_runs"]

#: ``<flow name>/<deployment name>`` of the per-host trial flow (docs/multi_host.md deploys it).
HOST_DEPLOYMENT = "host-trial/host-trial"
#: How often a ``host_trial`` run writes its heartbeat into the store, seconds.
HEARTBEAT_S = 10.0
#: A Running run whose heartbeat has not changed for this long (by the coordinator's clock) is a zombie, seconds:
#: 12 missed beats, far above a loaded NFS's write delay, far below the 24 h the coordinator waited before.
STALE_S = 120.0


def heartbeat_path(store: Path, sweep_id: str, trial_id: str) -> Path:
    """``<store>/<sweep_id>/.heartbeats/<trial id, '/' as '__'>.json``: a hidden folder, which the loader never
    reads (a trial id holds slashes: ``<sweep>/<runtime>/<key>/r0``)."""
    return Path(store) / sweep_id / ".heartbeats" / f"{trial_id.replace('/', '__')}.json"


@contextlib.contextmanager
def heartbeat(path: Path, every_s: float = HEARTBEAT_S):
    """While the block runs, rewrite ``path`` every ``every_s`` seconds with ``{"host", "pid", "beat": n,
    "at": ISO time}`` (atomic rename); a failed write is skipped (the store may hiccup). The thread dies with the
    process, so a killed worker's run stops beating: that is what the coordinator watches."""
    stop = threading.Event()
    path = Path(path)

    def write(n: int) -> None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"host": host_name(), "pid": os.getpid(), "beat": n,
                                       "at": dt.datetime.now(dt.timezone.utc).isoformat()}))
            os.replace(tmp, path)

    def beat() -> None:
        n = 1
        while not stop.wait(every_s):
            n += 1
            write(n)

    write(1)  # the first beat before the block starts
    t = threading.Thread(target=beat, name="tunelab-host-heartbeat", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


def ship_bundle(bundle: Path, results_dir: Path, store: Path) -> Path:
    """Copy a bundle folder into the results store at the same relative path (``<sweep_id>/<trial folder>``):
    copied under a temporary name in the target folder, then renamed, so that a reader of the store sees the
    bundle whole or not at all. A bundle already there (a re-run of the trial) is replaced.

    Returns the bundle's path in the store.

    Raises:
        ValueError: ``bundle`` is not inside ``results_dir``.
    """
    bundle, results_dir, store = Path(bundle), Path(results_dir), Path(store)
    try:
        rel = bundle.resolve().relative_to(results_dir.resolve())
    except ValueError:
        raise ValueError(f"bundle {bundle} is not inside the results folder {results_dir}") from None
    dest = store / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    shutil.copytree(bundle, tmp, dirs_exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


@flow(name="host-trial", flow_run_name="{trial_id}", log_prints=True, validate_parameters=False)
def host_trial(plan_yaml: str, sweep: dict[str, Any], trial_index: int, trial_id: str, store: str) -> dict[str, Any]:
    """One trial of a multi-host sweep, on the host whose worker picked this run.

    Args:
        plan_yaml: the plan's text (plans travel as text: hosts share no files but the store).
        sweep: the sweep's ``sweeps`` record (``records.Sweep`` fields) made by the coordinator.
        trial_index: the trial's position in ``plan.trials()``. trial_id: its id (``records.trial_id``).
        store: the results store folder, the same for every host.

    Returns ``{"trial_id", "host", "device", "status", "bundle"}`` (``bundle``: its path in the store).

    Raises:
        PlanError: the plan does not hold on this host (runtime or model missing).
    """
    sweep_id = str(sweep.get("sweep_id"))
    with heartbeat(heartbeat_path(Path(store), sweep_id, trial_id)):  # the coordinator's sign of life of this run
        return _host_trial(plan_yaml, sweep, trial_index, trial_id, store)


def _host_trial(plan_yaml: str, sweep: dict[str, Any], trial_index: int, trial_id: str, store: str) -> dict[str, Any]:
    logger = get_run_logger()
    host = host_name()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(plan_yaml)
    plan = load_plan(f.name)
    Path(f.name).unlink(missing_ok=True)
    runtimes = preflight(plan)
    trial = plan.trials()[trial_index]
    runtime = runtimes[trial.runtime]
    inv = inventory()
    on_gpu = runtime.device == "cuda"
    pool = host_devices(inv, log=logger.warning) if on_gpu else [Device("cpu", 0)]
    need = gpus_needed(trial) if on_gpu else 1
    sweep_rec = records.Sweep(**records.to_row(records.Sweep, sweep, full=False))
    results_dir = paths.results_dir()
    logs_dir = paths.logs_dir() / sweep_rec.sweep_id
    logs_dir.mkdir(parents=True, exist_ok=True)
    with free_device_locks(pool, need, log=logger.info) as devs:
        names = [slot_name(host, d) for d in devs]
        if prefect_slots_enabled():
            ensure_slots(names)  # idempotent; a host's slots exist once its first trial ran
        slots = hold_slots(names, lease_duration_s=SLOT_LEASE_S, sweep_id=sweep_rec.sweep_id, log=logger.info) \
            if prefect_slots_enabled() else _null()
        with slots:
            gpu = devs[0] if devs[0].kind == "gpu" else None
            ctx = TrialContext(sweep=sweep_rec, results_dir=str(results_dir), logs_dir=str(logs_dir),
                               driver_version=inv.driver_version, cuda_version=inv.cuda_version,
                               gpu_index=gpu.index if gpu else None,
                               gpu_indices=tuple(d.index for d in devs if d.kind == "gpu"),
                               gpu_name=gpu.name if gpu else "cpu", gpu_baseline_mib=gpu.baseline_mib if gpu else None,
                               device=" ".join(names), cuda_visible_devices=device_env(devs),
                               gpu_uuids=tuple(d.uuid for d in devs if d.uuid), host=host)
            logger.info("%s on %s: %s", trial_id, host, "+".join(d.label for d in devs))
            bundle = Path(run_trial(trial, trial_id, plan, runtime, ctx))
    verdict = validate_task(bundle, plan)
    dest = ship_bundle(bundle, results_dir, Path(store))
    from tunelab.core.bundle import read_bundle

    status = str(read_bundle(dest, verify=False)["trial"]["status"].iloc[0])
    logger.info("%s: %s (%s), bundle shipped to %s", trial_id, status, verdict, dest)
    return {"trial_id": trial_id, "host": host, "device": " ".join(names), "status": status, "bundle": str(dest)}


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


@dataclass
class MultiHostSummary:
    """What :func:`multi_host_sweep` returns: ``sweep_id``; ``runs``: per trial in plan order ``trial_id``,
    ``flow_run_id``, ``state`` (the Prefect state type of its host run) and, for a run the coordinator ended,
    ``reason``; ``crashed``: the trial ids of runs found Running with a dead worker (set Crashed, module notes);
    ``loaded``: bundles the loader loaded; ``db`` and ``store`` paths."""

    sweep_id: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)
    loaded: int = 0
    db: str = ""
    store: str = ""


_FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _beat_of(path: Path) -> tuple[Any, str | None]:
    """(the heartbeat's counter, its host) or (None, None) when there is none (yet)."""
    try:
        d = json.loads(Path(path).read_text())
        return (d.get("pid"), d.get("beat")), d.get("host")
    except (OSError, ValueError, AttributeError):
        return None, None


def wait_for_runs(client: Any, runs: list[dict[str, Any]], *, store: Path, sweep_id: str, timeout_s: float,
                  poll_s: float, stale_s: float = STALE_S, log: Callable[[str], None] = print,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Poll ``runs`` (dicts with ``trial_id``, ``flow_run_id``, ``state``; updated in place) until every one is
    final; a Running run whose heartbeat (:func:`heartbeat_path`) has not changed for ``stale_s`` seconds of
    ``clock`` (none seen counts from when it was first seen Running) is set Crashed with the reason, which goes
    into its dict's ``reason`` and the log.

    Args:
        client: a sync Prefect client (``read_flow_run``, ``set_flow_run_state``).

    Returns:
        The trial ids of the runs set Crashed.

    Raises:
        TimeoutError: runs not final after ``timeout_s`` (the message lists them).
    """
    from prefect.states import Crashed

    t_end = clock() + timeout_s
    seen: dict[str, tuple[Any, float]] = {}  # flow run id -> (last beat, when it last changed, by our clock)
    crashed: list[str] = []
    while True:
        now = clock()
        for r in runs:
            if r["state"] in _FINAL:
                continue
            st = client.read_flow_run(r["flow_run_id"]).state
            r["state"] = st.type.value if st else None
            if r["state"] != "RUNNING":
                continue
            beat, host = _beat_of(heartbeat_path(store, sweep_id, r["trial_id"]))
            last = seen.get(r["flow_run_id"])
            if last is None or beat != last[0]:
                seen[r["flow_run_id"]] = (beat, now)
                continue
            if now - last[1] < stale_s:
                continue
            where = f"on host {host}" if host else "(no heartbeat ever written: it never got to run its trial)"
            reason = (f"its process stopped without a word {where}: Running, but no heartbeat for {now - last[1]:.0f} s "
                      f"(limit {stale_s:g} s; its worker was killed or lost); set Crashed by the coordinator, "
                      "its trial is missing from the warehouse: re-run it")
            client.set_flow_run_state(r["flow_run_id"], Crashed(message=reason[:500]), force=True)
            r.update(state="CRASHED", reason=reason)
            crashed.append(r["trial_id"])
            log(f"{r['trial_id']}: {reason}")
        if all(r["state"] in _FINAL for r in runs):
            return crashed
        if clock() > t_end:
            raise TimeoutError(f"sweep {sweep_id}: runs not final after {timeout_s:g} s: "
                               f"{[r['trial_id'] for r in runs if r['state'] not in _FINAL]}")
        sleep(poll_s)


def cancel_unfinished(client: Any, runs: list[dict[str, Any]], why: str,
                      log: Callable[[str], None] = print) -> list[str]:
    """End every run of ``runs`` that is not final: Scheduled, Pending, Paused or unknown -> Cancelled at once (no
    worker has it), Running -> Cancelling (its worker stops the process and ends it Cancelled). Forced: the
    coordinator owns these runs. A run that cannot be read or set is logged and skipped.

    Returns:
        The trial ids whose run was cancelled; each also gets ``state`` and ``reason`` in its dict.
    """
    from prefect.states import Cancelled, Cancelling

    done: list[str] = []
    for r in runs:
        try:
            st = client.read_flow_run(r["flow_run_id"]).state
            kind = st.type.value if st else None
            if kind in _FINAL:
                r["state"] = kind
                continue
            msg = f"cancelled by its coordinator: {why}"
            new = Cancelling(message=msg) if kind in ("RUNNING", "CANCELLING") else Cancelled(message=msg)
            client.set_flow_run_state(r["flow_run_id"], new, force=True)
            r.update(state=new.type.value, reason=msg)
            done.append(r["trial_id"])
        except Exception as e:  # one run that cannot be ended must not keep the others running
            log(f"{r['trial_id']}: could not cancel flow run {r['flow_run_id']}: {type(e).__name__}: {e}")
    if done:
        log(f"{len(done)} host trial run(s) cancelled ({why}): {', '.join(done)}")
    return done


@flow(name="multi-host-sweep", log_prints=True, validate_parameters=False)
def multi_host_sweep(plan_path: str, store: str | None = None, db: str | None = None,
                     deployment: str = HOST_DEPLOYMENT, timeout_s: float = 24 * 3600,
                     poll_s: float = 2.0, stale_s: float = STALE_S) -> MultiHostSummary:
    """Run a plan's trials on the hosts of a work pool and load every bundle into one warehouse.

    Needs a Prefect server (``PREFECT_API_URL``) with ``deployment`` served by the pool's workers. The
    coordinator needs neither a GPU nor the runtimes; it reads the plan, submits one ``host_trial`` run per
    trial in plan order, waits until every run is final (at most ``timeout_s`` seconds), then loads the store.

    Args:
        store: the results store (default: this host's results folder, ``paths.results_dir``).
        db: the warehouse file (default ``paths.db_path``).
        stale_s: a Running run with no new heartbeat for this long is set Crashed (module notes).

    Ended early (``timeout_s``, cancelled, interrupted, an error) it cancels every run it submitted that is not
    final (:func:`cancel_unfinished`), then raises.

    Raises:
        PlanError: a bad plan. TimeoutError: runs not final after ``timeout_s`` (their bundles stay in the
        store for ``tunelab load``).
    """
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    logger = get_run_logger()
    plan = load_plan(plan_path)
    store_p = Path(store) if store else paths.results_dir()
    db_p = Path(db) if db else paths.db_path()
    sweep = _sweep_row(plan, plan_path, host_name())
    plan_yaml = Path(plan_path).read_text()
    from tunelab.reports.design_plan import resolve_precision

    plan, design = resolve_precision(plan, db_p)
    if design is not None:  # the hosts run the counts chosen here, not their own warehouses' design
        import yaml

        for line in design.lines():
            logger.info(line)
        doc = yaml.safe_load(plan_yaml)
        doc.pop("precision", None)
        doc.update(replicates=plan.replicates, repeats=plan.repeats)
        plan_yaml = yaml.safe_dump(doc, sort_keys=False)
    sweep_d = records.to_row(records.Sweep, sweep, full=False)
    out = MultiHostSummary(sweep.sweep_id, db=str(db_p), store=str(store_p))
    try:
        for i, t in enumerate(plan.trials()):
            tid = records.trial_id(sweep.sweep_id, t.config_key, t.runtime, t.replicate)
            fr = run_deployment(deployment, parameters={"plan_yaml": plan_yaml, "sweep": sweep_d, "trial_index": i,
                                                        "trial_id": tid, "store": str(store_p)},
                                timeout=0, as_subflow=False)
            out.runs.append({"trial_id": tid, "flow_run_id": str(fr.id), "state": None})
        logger.info("sweep %s: %d trial run(s) submitted to %s", sweep.sweep_id, len(out.runs), deployment)
        with get_client(sync_client=True) as client:
            out.crashed = wait_for_runs(client, out.runs, store=store_p, sweep_id=sweep.sweep_id,
                                        timeout_s=timeout_s, poll_s=poll_s, stale_s=stale_s, log=logger.error)
    except BaseException as e:  # timeout, Prefect's cancel (TerminationSignal), Ctrl-C, an error: not subflows
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'the coordinator ended'}"[:300]
        try:
            with get_client(sync_client=True) as client:
                cancel_unfinished(client, out.runs, why, log=logger.warning)
        except Exception as e2:  # the server gone too: say so, and raise what ended the coordinator
            logger.error("could not cancel the host trial runs %s: %s: %s",
                         [r["trial_id"] for r in out.runs if r["state"] not in _FINAL], type(e2).__name__, e2)
        raise
    sweep.finished_at = dt.datetime.now(dt.timezone.utc)
    res = load_pending(db_p, store_p)
    out.loaded = len([r for r in res if r.status == "loaded"])
    for r in res:
        if r.status == "failed":
            logger.error("bundle %s not loaded: %s", r.bundle_dir, r.error)
    logger.info("sweep %s: %d bundle(s) loaded into %s", sweep.sweep_id, out.loaded, db_p)
    if out.crashed:
        logger.error("sweep %s: %d trial(s) lost with their host's worker (set Crashed, not in the warehouse: re-run "
                     "them): %s", sweep.sweep_id, len(out.crashed), ", ".join(out.crashed))
    return out
