"""FAKE vLLM for command-line tests of a whole trial: runs the real ``tunelab`` command (``tunelab.cli.app``) with
the real sweep and trial flows (clean, boot, warm-up, windows, teardown, bundle, load), but each trial's server
is the FAKE timed OpenAI server (``timed_openai_server.FakeServerProcess``) instead of ``vllm serve``: no
runtime or model pre-flight, no GPU. The fake server is recorded in tunelab's state file and started in its own
process group with its ``TUNELAB_SERVER_ID``, as the engine does for a real server, so that ``tunelab clean``
recognises it as a leftover of a killed sweep.

    python tests/fakes/fake_server_sweep_cli.py run PLAN.yaml [options]

Environment: ``FAKE_ITL_S`` (seconds per token of the fake, default 0.05), ``FAKE_TTFT_S`` (default 0.05).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import types
import uuid
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

MODEL = "fake-model"


@dataclass
class _Boot:
    boot_s: float
    health_s: float
    port: int


@dataclass
class _Teardown:
    total_s: float
    clean: bool = True
    detail: str = ""


class FakeEngineServer:
    """FAKE ``tasks.engine.EngineServer``: the same attributes and calls the trial flow uses, serving with the
    FAKE timed server."""

    def __init__(self, trial_id: str, log_path: Path, **_: object) -> None:
        self.trial_id, self.log_path = trial_id, Path(log_path)
        self.api_key, self.served_model_name = "fake-key", MODEL
        self.command = ["fake-vllm", "serve", "--served-model-name", MODEL, "--api-key", self.api_key]
        self.fake = None
        self.proc = None
        self.boot = None

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def redacted_command(self) -> str:
        return " ".join("***" if a == self.api_key else a for a in self.command)

    def start(self) -> None:
        import timed_openai_server as T
        from tunelab.tasks import processes as PR

        self.t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("FAKE vllm serve\n")
        timing = T.FakeTiming(ttft_s=float(os.environ.get("FAKE_TTFT_S", "0.05")),
                              itl_s=float(os.environ.get("FAKE_ITL_S", "0.05")))
        server_id = uuid.uuid4().hex
        # Its own process group and the server id in its environment, as the engine starts vllm serve.
        shim = types.ModuleType("subprocess")
        shim.__dict__.update(subprocess.__dict__)
        shim.Popen = functools.partial(subprocess.Popen, start_new_session=True)
        T.subprocess, saved = shim, T.subprocess
        os.environ[PR.SERVER_ID_ENV] = server_id
        try:
            self.fake = T.FakeServerProcess(timing, model=MODEL).start()
        finally:
            os.environ.pop(PR.SERVER_ID_ENV, None)
            T.subprocess = saved
        self.proc = self.fake.proc
        PR._state_add({"pid": self.proc.pid, "pgid": self.proc.pid, "port": self.fake.port,
                       "trial_id": self.trial_id, "server_id": server_id, "run_dir": str(self.log_path.parent),
                       "start_ticks": PR._proc_start_ticks(self.proc.pid), "owner_pid": os.getpid(),
                       "owner_start_ticks": PR._proc_start_ticks(os.getpid()), "started_at": time.time()})

    def wait_ready(self) -> _Boot:
        self.boot = _Boot(boot_s=time.monotonic() - self.t0, health_s=time.monotonic() - self.t0,
                          port=self.fake.port)
        return self.boot

    def stop(self) -> _Teardown:
        from tunelab.tasks import processes as PR

        t0 = time.monotonic()
        if self.fake is not None:
            self.fake.stop()
            PR._state_remove(self.proc.pid)
            self.fake = None
        return _Teardown(total_s=time.monotonic() - t0)


def _install_fakes() -> None:
    import tunelab.flows.sweep as S
    import tunelab.flows.trial as TR
    from tunelab.host.runtime import Runtime
    from tunelab.tasks.gpu import Inventory

    rt = Runtime(name="cpu", device="cpu", python=sys.executable, versions={"vllm": "0.0.0+fake"})
    S.preflight = lambda plan: {"cpu": rt}
    S.inventory = lambda: Inventory(False, reason="FAKE host: no GPU")
    TR._boot_once = lambda trial, runtime, plan, log_path, trial_id, *_, **__: \
        FakeEngineServer(trial_id=trial_id, log_path=log_path)


if __name__ == "__main__":
    from tunelab.host import prefect_env

    prefect_env.configure()
    _install_fakes()
    from tunelab.cli import app

    sys.exit(app())
