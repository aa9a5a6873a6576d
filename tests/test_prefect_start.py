"""Prefect's temporary API server starting slowly (issue 29 item 17): tunelab waits with its own, longer bound
(``TUNELAB_PREFECT_START_TIMEOUT_S``), and when even that passes the command says so in one line and exits 4.

The first test starts a real ephemeral server under ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=1``; the
second uses a fake server process that never answers (``sleep``), the only way to make the start time out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
PLAN = Path(__file__).parent / "plans" / "one_trial.yaml"

_START = """
from tunelab.host import prefect_env
prefect_env.configure()
pid = prefect_env.start_ephemeral_server()
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as c:
    print("HEALTH", c.api_healthcheck() is None, pid is not None, flush=True)
"""


def test_a_short_prefect_start_timeout_is_outwaited(tmp_path):
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    env.pop("PREFECT_API_URL", None)
    env.pop("TUNELAB_PREFECT_START_TIMEOUT_S", None)
    r = subprocess.run([sys.executable, "-c", _START], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "HEALTH True True" in r.stdout


_NEVER_ANSWERS = """
import subprocess, sys
from prefect.server.api.server import SubprocessASGIServer
import tunelab.flows.sweep as sweep
from tunelab.cli import app

started = []

def fake_server(self):  # a fake: a process that never listens on its port
    p = subprocess.Popen(["sleep", "60"])
    started.append(p)
    return p

SubprocessASGIServer._run_uvicorn_command = fake_server
sweep.preflight = lambda plan: None  # the plan's runtime is not what this is about
try:
    app(["run", sys.argv[1]], standalone_mode=True)
finally:
    for p in started:
        p.kill()
        p.wait()
    print("FAKE_SERVERS_STOPPED", all(p.poll() is not None for p in started), len(started), flush=True)
"""


def test_a_server_that_never_answers_is_one_line_and_exit_4(tmp_path):
    """In a process of its own: Prefect's ephemeral server is one per process, so one that an earlier test of the
    session started would answer instead of the fake."""
    from tunelab.cli import EXIT_NO_PREFECT

    env = dict(os.environ, TUNELAB_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"),
               TUNELAB_PREFECT_START_TIMEOUT_S="1", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1",
               COLUMNS="200")
    env.pop("PREFECT_API_URL", None)
    r = subprocess.run([sys.executable, "-c", _NEVER_ANSWERS, str(PLAN)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == EXIT_NO_PREFECT == 4, (r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stdout + r.stderr
    # Prefect's own INFO lines about starting and stopping its server go to stderr too; tunelab's word is one line.
    err_lines = [ln for ln in r.stderr.splitlines() if ln.strip() and " | INFO " not in ln
                 and not ln.startswith("See https://www.prefect.io")]
    assert len(err_lines) == 1 and err_lines[0].startswith("error: Prefect's temporary API server did not answer "
                                                           "within 1 s"), r.stderr
    assert "TUNELAB_PREFECT_START_TIMEOUT_S" in err_lines[0] and "PREFECT_API_URL" in err_lines[0]
    assert "FAKE_SERVERS_STOPPED True" in r.stdout, r.stdout  # the fake server was stopped, not left behind


def test_the_tunelab_bound_is_kept_below_prefects_own_90_s(tmp_path):
    """TUNELAB_PREFECT_START_TIMEOUT_S=2 with Prefect's setting left alone (90 s by tunelab's default): the wait
    ends at tunelab's bound and says so; Prefect's 90 s was a floor under it (the command waited 90 s and said
    'within 90 s'). The subprocess limit (60 s) is below that floor, so a wait of 90 s fails the test."""
    from tunelab.cli import EXIT_NO_PREFECT

    env = dict(os.environ, TUNELAB_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"),
               TUNELAB_PREFECT_START_TIMEOUT_S="2", COLUMNS="200")
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", None)
    r = subprocess.run([sys.executable, "-c", _NEVER_ANSWERS, str(PLAN)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == EXIT_NO_PREFECT, (r.stdout[-2000:], r.stderr[-3000:])
    assert "error: Prefect's temporary API server did not answer within 2 s" in r.stderr, r.stderr
    assert "FAKE_SERVERS_STOPPED True" in r.stdout, r.stdout


def test_the_bound_is_tunelabs_when_set_else_the_longer_of_300_s_and_prefects(monkeypatch):
    from tunelab.host.prefect_env import start_bound_s

    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    monkeypatch.setenv("TUNELAB_PREFECT_START_TIMEOUT_S", "5")
    assert start_bound_s() == 5.0
    monkeypatch.delenv("TUNELAB_PREFECT_START_TIMEOUT_S")
    assert start_bound_s() == 300.0
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "900")
    assert start_bound_s() == 900.0
