"""A failed measurement says what the server was doing (tasks.steps.measure_windows.server_state): httpx's ReadError and
ReadTimeout carry no text, so "ReadError: " alone did not tell a killed server from a hung one."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

from tunelab.tasks.steps.measure_windows import server_state as _server_state


def test_a_killed_server_is_named_with_its_signal():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    state = _server_state(SimpleNamespace(proc=proc, base_url="http://127.0.0.1:9"))
    assert state == "server process exited during the measurement (killed by signal 9)", state


def test_a_live_server_that_does_not_answer_is_called_hung():
    # A listening socket that never answers: connections are accepted by the kernel, /health gets no reply.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        state = _server_state(SimpleNamespace(proc=proc, base_url=f"http://127.0.0.1:{lsock.getsockname()[1]}"))
        assert state.startswith("server process alive but /health did not answer within 2 s"), state
        assert "hung or stopped" in state
    finally:
        proc.kill()
        proc.wait(10)
        lsock.close()


def test_measurement_notes_are_kept_as_whole_lines():
    """A busy run wrote more notes than the row kept; cutting mid-line made 'lon' a cause of its own."""
    from tunelab.flows.trial import _kept_notes
    from tunelab.reports.notes import group_notes

    notes = [f"long_summary c=4 repeat {i}/40: load generator event loop lagged (p99 {i}.0 ms)" for i in range(40)]
    kept = _kept_notes(notes, max_chars=500)
    lines = kept.splitlines()
    assert all(ln in notes for ln in lines[:-1]) and lines[-1].endswith("more note(s) not kept)")
    causes = {g.cause for g in group_notes([("cfg", 0, kept)])}
    assert "load generator event loop lagged" in causes
    assert all(c.endswith("not kept)") for c in causes - {"load generator event loop lagged"}), causes
    assert _kept_notes(notes[:3]) == "\n".join(notes[:3])
