"""Which process runs a sweep's Prefect flow run, so that ``tunelab clean`` can tell an orphaned run from a live one.

Why: a sweep killed with SIGKILL (``kill -9``, the OOM killer) never reports its end to Prefect; its flow run and
the trial subflow it was in stay "Running" for ever. Prefect cannot tell: a run started by ``tunelab run`` has no
worker or infrastructure that watches its process. So the sweep records itself while it runs, one small JSON file
per flow run under ``<tunelab home>/state/runs/``: flow run id, PID, host name, the process's start time and
the kernel's boot id (the same facts as a slot holder's, ``tunelab.host.slot_holders``, and judged the same way by
``slot_holders.holder_is_dead``: same host, and the PID gone, reused, a zombie, or the host rebooted since).
The file is removed when the sweep ends in any way Python sees; one left behind whose process is dead names an
orphaned run.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

from tunelab.host import paths
from tunelab.host.slot_holders import SlotHolder, holder_is_dead, this_process

__all__ = ["orphaned_runs", "record_path", "record_run", "forget_run"]


def record_path(flow_run_id: str) -> Path:
    """``<tunelab home>/state/runs/<flow_run_id>.json``."""
    return paths.state_dir() / "runs" / f"{flow_run_id}.json"


@contextlib.contextmanager
def record_run(flow_run_id: str | None, sweep_id: str | None = None) -> Iterator[None]:
    """Record this process as the runner of ``flow_run_id`` for the block (nothing when it is None: no flow run).
    A record that cannot be written is skipped: it only serves ``tunelab clean``."""
    if not flow_run_id:
        yield
        return
    p = record_path(str(flow_run_id))
    rec = this_process(f"run-{flow_run_id}", sweep_id=sweep_id, flow_run_id=str(flow_run_id), lease_id=None,
                       lease_duration_s=0.0)
    written = False
    with contextlib.suppress(OSError):
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(rec)))
        os.replace(tmp, p)
        written = True
    try:
        yield
    finally:
        if written:
            forget_run(str(flow_run_id))


def forget_run(flow_run_id: str) -> None:
    """Remove the record of ``flow_run_id`` (no error when there is none)."""
    with contextlib.suppress(OSError):
        record_path(flow_run_id).unlink()


def orphaned_runs() -> list[tuple[SlotHolder, str]]:
    """The recorded flow runs whose process is provably dead, with the reason (``holder_is_dead``'s), oldest
    first. Records of live processes, of other hosts and unreadable ones are left out (and left alone)."""
    d = paths.state_dir() / "runs"
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            h = SlotHolder(**json.loads(f.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        dead, why = holder_is_dead(h)
        if dead:
            out.append((h, why))
    return sorted(out, key=lambda x: x[0].taken_at)
