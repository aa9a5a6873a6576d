"""How long this warehouse's boots took, per runtime: what ``plan check``'s time estimate uses instead of the
typical figures once a runtime has booted here (``tunelab.core.plan_cost``).

Why: the typical boot (80 s for an 8B model on a GPU) was 20-40 % short on an H100 (warm boots 81-115 s on
2026-12-07) and says nothing of the first boot's compile (cold boots 56-71 s longer than warm ones on the H100
and H200 runs of 2026-12-03 and 2026-12-07). A plan is checked where it runs, so the history of that warehouse is
the better guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

__all__ = ["BootHistory", "boot_history"]


@dataclass(frozen=True)
class BootHistory:
    """One runtime's measured boots (``trials.boot_s``: Popen to the first healthy ``/health``, seconds).

    Attributes:
        warm_boot_s: mean of the ok boots whose compile cache was warm (or not recorded: the CPU runtime keeps
            none); None when there are none.
        warm_boots: how many.
        cold_extra_s: mean cold boot minus ``warm_boot_s`` (``trials.compile_cache = 'cold'``), at least 0; None
            without both kinds.
        cold_boots: how many cold boots.
    """

    warm_boot_s: float | None
    warm_boots: int
    cold_extra_s: float | None
    cold_boots: int


def boot_history(db_path: Path | str | None) -> dict[str, BootHistory]:
    """Per runtime name, its boots in the warehouse at ``db_path`` (ok trials only).

    Returns {} when there is no warehouse file, or it cannot be opened read-only (another process writing it, an
    older schema without the columns): the estimate then falls back to the typical figures. Never raises.
    """
    if db_path is None or not Path(db_path).exists():
        return {}
    try:
        con = duckdb.connect(str(db_path), read_only=True)
    except duckdb.Error:
        return {}
    try:
        rows = con.execute("""SELECT runtime_name, coalesce(compile_cache, 'warm') = 'cold' AS cold,
                                     count(*), avg(boot_s)
                              FROM trials WHERE status = 'ok' AND boot_s > 0
                              GROUP BY ALL""").fetchall()
    except duckdb.Error:
        return {}
    finally:
        con.close()
    by: dict[str, dict[bool, tuple[int, float]]] = {}
    for runtime, cold, n, mean in rows:
        by.setdefault(runtime, {})[bool(cold)] = (int(n), float(mean))
    out = {}
    for runtime, kinds in by.items():
        warm_n, warm_mean = kinds.get(False, (0, None))
        cold_n, cold_mean = kinds.get(True, (0, None))
        extra = max(cold_mean - warm_mean, 0.0) if cold_mean is not None and warm_mean is not None else None
        out[runtime] = BootHistory(warm_boot_s=warm_mean, warm_boots=warm_n, cold_extra_s=extra, cold_boots=cold_n)
    return out
