"""Where tunelab keeps its state: one home folder, overridable with ``TUNELAB_HOME``.

Default: the nearest ``.tunelab`` folder of the current directory or its parents, else the source checkout's
``.tunelab`` (the repository root when set up with the README), else ``./.tunelab``.
Layout::

    runtimes/<name>/          one vLLM installation (venv + runtime.json)
    models/<name>/            locally built models
    results/<sweep>/<trial>/  result bundles (written before loading)
    logs/<sweep>/             vllm serve logs per trial
    state/servers.json        servers tunelab started and has not yet seen stopped
    prefect/                  PREFECT_HOME for ephemeral runs
    warehouse.duckdb          the warehouse (``TUNELAB_DB`` overrides)

Device locks and slot-holder records are the host's, not the home's (:func:`host_locks_dir`): two clones (two
homes) on one host share its GPUs, so they must see each other's locks.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["home", "runtimes_dir", "models_dir", "results_dir", "logs_dir", "state_dir", "db_path", "prefect_home",
           "host_locks_dir"]


def _default_home() -> Path:
    # Like git: the nearest existing .tunelab in this folder or a parent; else, for a source checkout (the
    # README's set-up), the checkout's .tunelab, so commands work from any sub-folder; else ./.tunelab.
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / ".tunelab").is_dir():
            return d / ".tunelab"
    checkout = Path(__file__).resolve().parents[2]  # tunelab/host/paths.py -> the checkout
    if (checkout / "pyproject.toml").exists():
        return checkout / ".tunelab"
    return cwd / ".tunelab"


def home() -> Path:
    """The tunelab home folder: ``TUNELAB_HOME`` if set, else the nearest ``.tunelab`` of the current folder
    or its parents, else the source checkout's ``.tunelab`` (created on first use)."""
    env = os.environ.get("TUNELAB_HOME")
    p = Path(env).resolve() if env else _default_home()
    p.mkdir(parents=True, exist_ok=True)
    return p


def _sub(name: str) -> Path:
    p = home() / name
    p.mkdir(parents=True, exist_ok=True)
    return p


def runtimes_dir() -> Path:
    return _sub("runtimes")


def models_dir() -> Path:
    return _sub("models")


def results_dir() -> Path:
    return Path(os.environ["TUNELAB_RESULTS"]).resolve() if os.environ.get("TUNELAB_RESULTS") else _sub("results")


def logs_dir() -> Path:
    return _sub("logs")


def state_dir() -> Path:
    return _sub("state")


def prefect_home() -> Path:
    return _sub("prefect")


def db_path() -> Path:
    return Path(os.environ["TUNELAB_DB"]).resolve() if os.environ.get("TUNELAB_DB") else home() / "warehouse.duckdb"


def host_locks_dir() -> Path:
    """The host-wide folder of device locks (``<name>.lock``, ``fcntl.flock``) and slot-holder records
    (``slots/<name>.json``), shared by every tunelab home on this host so that two clones, or two
    ``TUNELAB_HOME`` values, never boot servers on one device at once.

    ``TUNELAB_LOCK_DIR`` when set (a folder every user of the devices can write, e.g. for several users of one
    GPU host); else ``$XDG_RUNTIME_DIR/tunelab-locks`` (per user, on a tmpfs: gone at reboot, like the locks);
    else ``<tmp>/tunelab-locks-<uid>``. Created on first use (mode 0700 for the per-user defaults).
    """
    env = os.environ.get("TUNELAB_LOCK_DIR")
    if env:
        p = Path(env).resolve()
        p.mkdir(parents=True, exist_ok=True)
        return p
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir() and os.access(xdg, os.W_OK):
        p = Path(xdg) / "tunelab-locks"
    else:
        import tempfile

        p = Path(tempfile.gettempdir()) / f"tunelab-locks-{os.getuid()}"
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    return p
