"""vLLM version parsing and ordering (tunelab/warehouse/versions.py)."""

import datetime as dt
import random

import pytest
from packaging.version import Version

from tunelab.warehouse.versions import parse_vllm_version, version_columns


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
    # the key orders public versions (builds of one release tie, "0.11.0" and "0.11.0+cpu"; both sorts are stable)
    assert by_key == sorted(shuffled, key=lambda s: Version(Version(s).public))
    assert sorted(shuffled, key=parse_vllm_version) == sorted(shuffled, key=Version)


@pytest.mark.parametrize("bad", ["", "latest", "0.x", None])
def test_bad_version_names_the_field(bad):
    with pytest.raises(ValueError, match="vllm_version"):
        parse_vllm_version(bad)


# -- builds grouped by release; untrusted bases; build date and platform from the local part -----------------------
@pytest.mark.parametrize(
    "raw, public, platform, build_date, commit",
    [
        ("0.26.0+empty", "0.26.0", "empty", None, None),
        ("0.11.0+cu128", "0.11.0", "cu128", None, None),
        ("0.32.0+cpu", "0.32.0", "cpu", None, None),
        ("0.10.2.dev5+g1234abc.d20250901", "0.10.2.dev5", None, dt.date(2025, 9, 1), "1234abc"),
        ("0.11.1rc2.dev31+gabcdef12.d20251104.rocm624", "0.11.1rc2.dev31", "rocm624", dt.date(2025, 11, 4), "abcdef12"),
        ("0.26.0+d20259999", "0.26.0", None, None, None),  # not a date: left in `local` only
    ],
)
def test_local_part_gives_platform_build_date_and_commit(raw, public, platform, build_date, commit):
    v = parse_vllm_version(raw)
    assert (v.public, v.platform, v.build_date, v.commit, v.untrusted) == (public, platform, build_date, commit, None)
    cols = version_columns(raw)
    assert (cols["vllm_public_version"], cols["vllm_platform"], cols["vllm_build_date"]) == (public, platform, build_date)


def test_builds_of_one_release_share_the_sort_key_and_public_version():
    group = ["0.26.0", "0.26.0+empty", "0.26.0+cu128", "0.26.0+cpu"]
    keys = {version_columns(r)["vllm_version_key"] for r in group}
    assert len(keys) == 1 and None not in keys
    assert {version_columns(r)["vllm_public_version"] for r in group} == {"0.26.0"}
    # ... and the group still sits between its neighbours in PEP 440 order
    key = keys.pop()
    assert version_columns("0.26.0rc1")["vllm_version_key"] < key < version_columns("0.26.1")["vllm_version_key"]
    # a key of a version without local part is what it was before builds were grouped (stored keys stay valid)
    assert key == "000000.000026.000000.000000|9000000|0000000|1000000|"


@pytest.mark.parametrize("raw", ["0.1.dev123+gabc1234", "0.1.dev1+g0123456.d20250901", "0.1.dev9", "0.0.0+unknown"])
def test_untrusted_base_is_flagged_and_kept_out_of_version_order(raw):
    v = parse_vllm_version(raw)
    assert v.untrusted
    cols = version_columns(raw)
    assert cols["vllm_version_key"] is None and cols["vllm_untrusted"] == v.untrusted
    if raw.startswith("0.1.dev"):
        assert "untagged development build" in v.untrusted and "no release tag" in v.untrusted


@pytest.mark.parametrize("raw", ["0.1.0", "0.10.2.dev123+g1a2b3c4", "0.1.1.dev3", "1.0.0.dev1"])
def test_real_releases_and_tagged_dev_builds_are_trusted(raw):
    assert parse_vllm_version(raw).untrusted is None
    assert version_columns(raw)["vllm_version_key"] is not None
