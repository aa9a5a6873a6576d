"""Measurement notes grouped by cause, so that a run on a busy 2-core machine prints one line per cause
instead of one per window (about ten per demo sweep, most of them the same "client-bound" note).

A note is one line of ``trials.measurement_notes`` as ``tasks.measure`` writes it: ``"<window label>: <text>"``,
e.g. ``"chat c=4 #1: client-bound: load generator loop used 0.97 of a core ..."``. Its cause is the first clause
of the text (up to the first ``:`` or ``(``) with numbers replaced by ``N``, so ``"client-bound"``,
``"load generator event loop lagged"``, ``"N% of inter-chunk gaps fell inside one read"``. The cause is the
grouping key; what a report prints is the group's heading, the clause with the range of the numbers its notes had
in place of each ``N`` (``"1.5-26% of inter-chunk gaps fell inside one read"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["NoteGroup", "group_notes", "note_cause"]

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class NoteGroup:
    """The notes of one cause.

    Attributes:
        cause: the normalised first clause (see the module docstring): the grouping key, ``N`` for numbers.
        heading: what to print for the cause: the first note's clause with each number replaced by the range
            (``lo-hi``, or the one value) of that number over the group's notes, e.g.
            ``"1.5-26% of inter-chunk gaps fell inside one read"``.
        windows: how many notes (one per measured window) have this cause.
        trials: how many trials have at least one of them.
        example: the first such note in full (window label included).
        where: ``"<config> r<replicate>"`` of each trial with the cause, in order of appearance, with
            ``" on <runtime>"`` after it where the row gave a runtime (``reports.report.trial_name``).
    """

    cause: str
    windows: int = 0
    trials: int = 0
    example: str = ""
    where: list[str] = field(default_factory=list)
    heading: str = ""


def _text(note: str) -> str:
    """The note without its window label (``"chat c=4 #1: "``): labels carry no colon of their own."""
    head, sep, rest = note.partition(": ")
    return rest if sep else note


def _clause(note: str) -> str:
    """The first clause of a note's text (up to the first ``:`` or ``(``), numbers as written."""
    return re.split(r"[:(]", _text(note.strip()), maxsplit=1)[0].strip().rstrip(",;")


def note_cause(note: str) -> str:
    """The cause of one note line: the first clause of its text, numbers as ``N`` ("N% of inter-chunk gaps ...")."""
    return _NUMBER.sub("N", _clause(note)) or _text(note.strip())


def _heading(clause: str, numbers: list[list[str]]) -> str:
    """``clause`` with its i-th number replaced by the range of ``numbers[i]`` (``"2-26"``; one value as it is)."""
    it = iter(numbers)

    def span(m: re.Match) -> str:
        seen = next(it, None)
        if not seen:
            return m.group(0)
        lo, hi = min(seen, key=float), max(seen, key=float)
        return lo if float(lo) == float(hi) else f"{lo}-{hi}"

    return _NUMBER.sub(span, clause)


def group_notes(rows: Iterable[tuple[Any, Any, Any]]) -> list[NoteGroup]:
    """Group the notes of trials by cause.

    Args:
        rows: ``(config label, replicate, measurement_notes)`` per trial, or ``(config label, replicate,
            measurement_notes, runtime)`` to name the trial with its runtime (None: without); notes are
            newline-separated text (``trials.measurement_notes``), None/NaN/empty for none.

    Returns:
        One :class:`NoteGroup` per cause, most windows first (ties: first seen first), its ``heading`` set.
    """
    groups: dict[str, NoteGroup] = {}
    order: list[str] = []
    numbers: dict[str, list[list[str]]] = {}  # per cause, per number of its clause: the values seen
    for row in rows:
        label, rep, text = row[:3]
        runtime = row[3] if len(row) > 3 and isinstance(row[3], str) and row[3] else None
        if not isinstance(text, str) or not text.strip():
            continue
        seen_here: set[str] = set()
        for line in (ln.strip() for ln in text.splitlines()):
            if not line:
                continue
            cause = note_cause(line)
            g = groups.get(cause)
            if g is None:
                g = groups[cause] = NoteGroup(cause=cause, example=line)
                order.append(cause)
            found = _NUMBER.findall(_clause(line))
            seen = numbers.setdefault(cause, [[] for _ in found])
            for i, x in enumerate(found[:len(seen)]):
                seen[i].append(x)
            g.windows += 1
            if cause not in seen_here:
                seen_here.add(cause)
                g.trials += 1
                g.where.append(f"{label} r{rep}" + (f" on {runtime}" if runtime else ""))
    for c, g in groups.items():
        g.heading = _heading(_clause(g.example), numbers[c]) or c
    return sorted((groups[c] for c in order), key=lambda g: (-g.windows, order.index(g.cause)))
