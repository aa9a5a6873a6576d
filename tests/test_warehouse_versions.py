"""vLLM version parsing and ordering (warehouse/versions.py)."""

import random

import pytest
from packaging.version import Version

from warehouse.versions import parse_vllm_version, version_columns


@pytest.mark.parametrize(
    "raw, release, pre, dev, commit, local",
    [
        ("0.32.0", (0, 32, 0), None, None, None, None),
        ("0.32.0+cpu", (0, 32, 0), None, None, None, "cpu"),
        ("0.11.0rc1", (0, 11, 0), "rc1", None, None, None),
        ("0.10.2.dev123+g1a2b3c4", (0, 10, 2), None, 123, "1a2b3c4", "g1a2b3c4"),
        ("0.25.1+cu130", (0, 25, 1), None, None, None, "cu130"),
        ("0.10.2.dev123.g1a2b3c4", (0, 10, 2), None, 123, "1a2b3c4", "g1a2b3c4"),
        ("0.11.1rc2.dev31+gabcdef12.cu129", (0, 11, 1), "rc2", 31, "abcdef12", "gabcdef12.cu129"),
    ],
)
def test_parse(raw, release, pre, dev, commit, local):
    v = parse_vllm_version(raw)
    assert (v.release, v.pre, v.dev, v.commit, v.local) == (release, pre, dev, commit, local)
    cols = version_columns(raw)
    assert cols["vllm_release"] == ".".join(map(str, release))
    assert (cols["vllm_release_major"], cols["vllm_release_minor"], cols["vllm_release_patch"]) == release


def test_order_is_numeric_not_string():
    assert "0.9.2" > "0.10.0"  # why the raw string must never be used
    assert parse_vllm_version("0.9.2") < parse_vllm_version("0.10.0")
    assert version_columns("0.9.2")["vllm_version_key"] < version_columns("0.10.0")["vllm_version_key"]


def test_sort_key_matches_pep440_order():
    raws = ["0.9.2", "0.10.0", "0.10.2.dev123+g1a2b3c4", "0.10.2rc1.dev5", "0.10.2rc1", "0.10.2",
            "0.10.2.post1", "0.11.0a1", "0.11.0b2", "0.11.0rc1", "0.11.0rc10", "0.11.0", "0.11.0+cpu",
            "0.25.1+cu130", "0.32.0", "1.0.0.dev1", "1.0.0"]
    shuffled = raws[:]
    random.Random(3).shuffle(shuffled)
    by_key = sorted(shuffled, key=lambda s: parse_vllm_version(s).sort_key)
    by_pep440 = sorted(shuffled, key=Version)
    assert by_key == by_pep440
    assert sorted(shuffled, key=parse_vllm_version) == by_pep440


@pytest.mark.parametrize("bad", ["", "latest", "0.x", None])
def test_bad_version_names_the_field(bad):
    with pytest.raises(ValueError, match="vllm_version"):
        parse_vllm_version(bad)
