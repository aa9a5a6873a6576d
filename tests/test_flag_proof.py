"""Positive proof that VLLM_USE_FASTOKENS took effect: the API-server processes map fastokens' native extension.

Real processes stand in for the server: a child Python that loads a shared object at a path named like
fastokens' (``<tmp>/fastokens/_native.abi3.so``, a copy of the C math library, loaded with ctypes) and one that
does not. Their /proc/<pid>/maps is read as the server's would be."""

from __future__ import annotations

import ctypes.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tunelab.tasks.flag_proof import ab_flag_proof, mapped_paths, prove_flags


def _libm() -> Path:
    name = ctypes.util.find_library("m")
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        if name and (Path(d) / name).exists():
            return Path(d) / name
    pytest.skip("no libm shared object to stand in for fastokens' extension")


def _child(tmp_path: Path, load: bool) -> subprocess.Popen:
    so = tmp_path / "fastokens" / "_native.abi3.so"
    if load and not so.exists():
        so.parent.mkdir(parents=True)
        shutil.copy(_libm(), so)
    code = (f"import ctypes, sys; ctypes.CDLL({str(so)!r}) if {load} else None; "
            "print('ready', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.fixture
def servers(tmp_path):
    on, off = _child(tmp_path, True), _child(tmp_path, False)
    yield on, off
    for p in (on, off):
        p.stdin.close()
        p.wait(10)


def test_fastokens_loaded_is_proven_and_a_flag_that_did_nothing_is_contradicted(servers):
    on, off = servers
    assert any("fastokens/_native" in x for x in mapped_paths(on.pid))
    got = prove_flags({"VLLM_USE_FASTOKENS": "1"}, on.pid)["VLLM_USE_FASTOKENS"]
    assert got["status"] == "proven" and f"pid {on.pid}" in got["evidence"]
    # The flag set, the extension not loaded (a fastokens too old, a path not taken): not what the A/B claims.
    bad = prove_flags({"VLLM_USE_FASTOKENS": "1"}, off.pid)["VLLM_USE_FASTOKENS"]
    assert bad["status"] == "contradicted" and "none of 1" in bad["evidence"]
    # The off side of an A/B, the flag unset: proven off when nothing is mapped.
    unset = prove_flags({}, off.pid)["VLLM_USE_FASTOKENS"]
    assert unset == {**unset, "value": "unset", "status": "proven"}
    assert prove_flags({"VLLM_USE_FASTOKENS": "0"}, on.pid)["VLLM_USE_FASTOKENS"]["status"] == "contradicted"


def test_a_flag_without_a_probe_or_a_server_out_of_reach_is_unprovable(servers):
    on, _ = servers
    got = prove_flags({"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}, on.pid)
    assert got["VLLM_ATTENTION_BACKEND"]["status"] == "unprovable"
    assert "no probe" in got["VLLM_ATTENTION_BACKEND"]["evidence"]
    assert prove_flags({"VLLM_USE_FASTOKENS": "1"}, None)["VLLM_USE_FASTOKENS"]["status"] == "unprovable"


def test_ab_of_a_flag_says_whether_its_effect_was_proven(servers):
    on, off = servers
    a = json.dumps(prove_flags({}, off.pid))
    b = json.dumps(prove_flags({"VLLM_USE_FASTOKENS": "1"}, on.pid))
    assert ab_flag_proof("VLLM_USE_FASTOKENS", a, b) == "proven"
    did_nothing = json.dumps(prove_flags({"VLLM_USE_FASTOKENS": "1"}, off.pid))
    assert ab_flag_proof("VLLM_USE_FASTOKENS", a, did_nothing).startswith("contradicted: B:")
    assert ab_flag_proof("VLLM_ATTENTION_BACKEND", a, b).startswith("unprovable")
    assert ab_flag_proof("VLLM_USE_FASTOKENS", None, b).startswith("unprovable: side A")
