"""Measurement notes grouped by cause, so that a run on a busy 2-core machine prints one line per cause
instead of one per window (about ten per demo sweep, most of them the same "client-bound" note).

A note is one line of ``trials.measurement_notes`` as ``tasks.measure`` writes it: ``"<window label>: <text>"``,
e.g. ``"chat c=4 #1: client-bound: load generator loop used 0.97 of a core ..."``. Its cause is the first clause
of the text (up to the first ``:`` or ``(``) with numbers replaced by ``N``, so ``"client-bound"``,
``"load generator event loop lagged"``, ``"N% of inter-chunk gaps fell inside one read"``.
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
        cause: the normalised first clause (see the module docstring).
        windows: how many notes (one per measured window) have this cause.
        trials: how many trials have at least one of them.
        example: the first such note in full (window label included).
        where: ``"<config> r<replicate>"`` of each trial with the cause, in order of appearance.
    """

    cause: str
    windows: int = 0
    trials: int = 0
    example: str = ""
    where: list[str] = field(default_factory=list)


def _text(note: str) -> str:
    """The note without its window label (``"chat c=4 #1: "``): labels carry no colon of their own."""
    head, sep, rest = note.partition(": ")
    return rest if sep else note


def note_cause(note: str) -> str:
    """The cause of one note line: the first clause of its text, numbers as ``N`` ("N% of inter-chunk gaps ...")."""
    text = _text(note.strip())
    clause = re.split(r"[:(]", text, maxsplit=1)[0].strip().rstrip(",;")
    return _NUMBER.sub("N", clause) or text


def group_notes(rows: Iterable[tuple[Any, Any, Any]]) -> list[NoteGroup]:
    """Group the notes of trials by cause.

    Args:
        rows: ``(config label, replicate, measurement_notes)`` per trial; notes are newline-separated text
            (``trials.measurement_notes``), None/NaN/empty for none.

    Returns:
        One :class:`NoteGroup` per cause, most windows first (ties: first seen first).
    """
    groups: dict[str, NoteGroup] = {}
    order: list[str] = []
    for label, rep, text in rows:
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
            g.windows += 1
            if cause not in seen_here:
                seen_here.add(cause)
                g.trials += 1
                g.where.append(f"{label} r{rep}")
    return sorted((groups[c] for c in order), key=lambda g: (-g.windows, order.index(g.cause)))
