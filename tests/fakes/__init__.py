"""Fakes for tests that need exact timing or injected faults. Each is named as a fake; none is used outside tests.

- ``fake_openai_server.py``: a FAKE OpenAI-compatible server (a script) with injected faults.
- ``FakeServerRuntime``: a ``Runtime`` whose ``serve_command()`` launches that fake instead of ``vllm serve``,
  so ``tasks.engine.EngineServer`` runs unchanged against it.
- ``fake_nvml.FakeNvml``: a FAKE NVML module (the ``pynvml`` surface tunelab uses).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tunelab.host.runtime import Runtime

__all__ = ["FAKE_SERVER", "FakeServerRuntime", "fake_server_runtime"]

FAKE_SERVER = Path(__file__).resolve().parent / "fake_openai_server.py"


class FakeServerRuntime(Runtime):
    """A runtime record that launches the FAKE OpenAI server with ``fake_args`` (see the fake's docstring)."""

    fake_args: list[str] = []

    def serve_command(self) -> list[str]:
        return [sys.executable, str(FAKE_SERVER), *self.fake_args]


def fake_server_runtime(*fake_args: str, device: str = "cpu") -> FakeServerRuntime:
    """A :class:`FakeServerRuntime` named ``fake`` running this interpreter."""
    return FakeServerRuntime(name="fake", python=sys.executable, device=device, fake_args=list(fake_args))
