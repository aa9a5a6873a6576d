"""The compile cache of a runtime, shared by its parallel boots without races.

Why: every server of one runtime uses the runtime's ``VLLM_CACHE_ROOT`` (``<runtimes>/<name>/vllm-cache``), so a
config compiled once boots warm afterwards. Two servers compiling the same graphs into it at once can leave a
half-written artefact that the other, and every later boot, reads: reported upstream as an ``UnpicklingError``
when several servers of one model start together (vllm-project/vllm#31199) and as a "corrupted compilation
artifact" after a failed compile (vllm-project/vllm#18956). Two rules keep that from happening:

- :func:`first_compile` — the first boot of a *compile key* (runtime + ``plan.config_key``: model, engine args
  and env, what vLLM's compile hash is computed from) runs alone: it holds a host-level file lock
  (``<tunelab home>/state/locks/compile-<runtime>-<key>.lock``) from Popen to ready. A second boot of the same
  key waits for the lock, finds the key warm and boots warm, in parallel with everything else. A key is warm
  once a boot of it became ready: a marker file in the cache root (``tunelab-warm/<key>``), so that deleting
  the cache also forgets the marks. Boots of different keys never wait for each other (different hashes,
  different cache folders). Configs whose keys differ but whose compile hashes are equal (an engine arg that
  vLLM leaves out of the hash) may still compile together; the recovery below covers that case.
- :func:`move_aside` — a boot that failed as ``compile_cache_corrupt`` (``tasks.bootlog``) moves the folder its
  log names (else the runtime's whole ``torch_compile_cache``) to ``<folder>.corrupt-<UTC time>`` and forgets
  the key's mark; the trial then boots once more, cold (``flows.trial``). Moved, not deleted: the bad artefact
  stays for a bug report.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from tunelab.host import paths

__all__ = ["CompileSlot", "cache_root", "first_compile", "has_compiled", "is_warm", "uncompiled", "mark_warm", "move_aside"]


def cache_root(runtime_name: str) -> Path:
    """The runtime's ``VLLM_CACHE_ROOT`` (``tasks.engine`` gives it to every server of that runtime)."""
    return paths.runtimes_dir() / runtime_name / "vllm-cache"


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-") or "x"


def _marker(runtime_name: str, key: str) -> Path:
    return cache_root(runtime_name) / "tunelab-warm" / _safe(key)


def has_compiled(runtime_name: str) -> bool:
    """Whether any boot of this runtime has left torch.compile artefacts (``<cache root>/torch_compile_cache`` holds
    something): false on a fresh host, where the first boot compiles from scratch. ``tunelab plan check`` adds a
    cold compile to its estimate for a GPU runtime without them (``core.plan_cost``). The CPU runtime leaves none."""
    d = cache_root(runtime_name) / "torch_compile_cache"
    return d.is_dir() and any(d.iterdir())


def uncompiled(runtimes: Mapping[str, Any]) -> list[str]:
    """The GPU runtimes (``Runtime.device == 'cuda'``) of ``runtimes`` (name -> Runtime) with no compile artefacts
    yet (:func:`has_compiled`): the ones whose first boot in a sweep compiles from scratch."""
    return [n for n, r in runtimes.items() if getattr(r, "device", None) == "cuda" and not has_compiled(n)]


def is_warm(runtime_name: str, key: str) -> bool:
    """Whether a boot of compile key ``key`` on this runtime has become ready since the cache was last cleared."""
    return _marker(runtime_name, key).exists()


def mark_warm(runtime_name: str, key: str) -> None:
    """Record that a boot of ``key`` became ready: its compile artefacts are complete in the cache."""
    m = _marker(runtime_name, key)
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(dt.datetime.now(dt.timezone.utc).isoformat())


@dataclass
class CompileSlot:
    """What :func:`first_compile` decided: ``cold`` (this boot compiles, alone), ``waited_s`` (seconds spent
    waiting for another boot of the key; 0 when none ran)."""

    cold: bool
    waited_s: float = 0.0


@contextlib.contextmanager
def first_compile(runtime_name: str, key: str, log: Callable[[str], object] | None = None,
                  poll_s: float = 0.5) -> Iterator[CompileSlot]:
    """Hold the compile lock of ``(runtime_name, key)`` while the key is cold; yield at once when it is warm.

    Use around one boot (Popen .. ready); call :func:`mark_warm` when the boot became ready. Boots in threads of
    one process and in other processes of the host exclude each other alike (``flock`` on a file opened per
    call). The OS releases the lock when its holder dies, so a killed sweep never blocks a key.
    """
    if is_warm(runtime_name, key):
        yield CompileSlot(cold=False)
        return
    d = paths.state_dir() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(d / f"compile-{_safe(runtime_name)}-{_safe(key)}.lock", "a+") as f:
        said = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if log and not said:
                    log(f"waiting for the first compile of {key} on {runtime_name} (another boot compiles it)")
                    said = True
                time.sleep(poll_s)
        waited = time.monotonic() - t0 if said else 0.0
        try:
            if is_warm(runtime_name, key):  # the boot we waited for made it warm: boot warm, in parallel
                fcntl.flock(f, fcntl.LOCK_UN)
                yield CompileSlot(cold=False, waited_s=waited)
            else:
                yield CompileSlot(cold=True, waited_s=waited)
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_UN)


def move_aside(runtime_name: str, key: str, named_dir: str | None) -> Path | None:
    """Move a corrupted compile cache aside and forget that ``key`` is warm.

    Args:
        named_dir: the ``torch_compile_cache/<hash>`` folder the failed boot's log names
            (``bootlog.corrupt_cache_dir``); moved when it lies inside this runtime's cache root, else the
            runtime's whole ``torch_compile_cache`` is moved.

    Returns:
        The new path of what was moved, or None when there was nothing to move.
    """
    root = cache_root(runtime_name)
    _marker(runtime_name, key).unlink(missing_ok=True)
    target: Path | None = None
    if named_dir:
        p = Path(named_dir)
        with contextlib.suppress(ValueError):
            p.resolve().relative_to(root.resolve())
            target = p
    if target is None:
        target = root / "torch_compile_cache"
    if not target.exists():
        return None
    dest = target.with_name(f"{target.name}.corrupt-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S%fZ}")
    target.rename(dest)
    return dest
