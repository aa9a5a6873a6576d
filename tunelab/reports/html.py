"""Self-contained HTML reports: one file with the tables and the plots (PNG as ``data:`` URIs), no scripts, no
links to fetch; opens in any browser, can be mailed or attached to a ticket.

- :func:`sweep_html`: a sweep from the warehouse: the same text as the sweep's Prefect report artifact
  (``report.sweep_markdown``: trials in run order, config keys with their full settings, the quality summary,
  the comparison tables) and its plots (latency vs throughput; output tokens/s across vLLM versions when the
  warehouse has two or more), then the failed trials with their whole reasons and server logs.
- :func:`compare_html`: a comparison (``flows.compare.compare``'s result): its markdown (A/B table, method,
  regressions) and a chart of each change with its confidence interval (``plots.ab_interval_plot``).

The markdown is rendered with markdown-it-py (CommonMark + tables; raw HTML in the text is escaped, not
passed through). Wide tables scroll sideways inside the page instead of being cut; cells wrap only between
words.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path
from typing import Any

import duckdb

__all__ = ["compare_html", "html_page", "sweep_html"]

_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1500px; padding: 0 16px; color: #1f2328; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; }
.table-wrap { overflow-x: auto; margin: 8px 0 16px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top;
         word-break: normal; overflow-wrap: normal; hyphens: none; }
th { background: #f6f8fa; white-space: nowrap; }
td { max-width: 44em; }
tr:nth-child(even) td { background: #fbfcfd; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f6f8fa; padding: 1px 3px; }
img { max-width: 100%; height: auto; border: 1px solid #d0d7de; margin: 6px 0; }
.meta { color: #57606a; font-size: 12px; }
"""


def _markdown_to_html(text: str) -> str:
    """CommonMark + tables to HTML (raw HTML escaped), every table wrapped in a sideways-scrolling block."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    out = md.render(text)
    return out.replace("<table>", '<div class="table-wrap"><table>').replace("</table>", "</table></div>")


def html_page(title: str, markdown_text: str, images: list[tuple[str, Path]] | None = None,
              meta: str | None = None) -> str:
    """One HTML document: ``markdown_text`` rendered, then each ``(caption, PNG path)`` of ``images`` embedded as
    a ``data:image/png`` URI (a missing file is left out). ``meta``: a small line under the title (plain text)."""
    from tunelab.reports.report import png_data_uri

    figs = "".join(f'<figure><img alt="{html.escape(c)}" src="{png_data_uri(p)}"><figcaption class="meta">'
                   f"{html.escape(c)}</figcaption></figure>" for c, p in images or [] if Path(p).exists())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n"
            + (f'<p class="meta">{html.escape(meta)}</p>\n' if meta else "")
            + _markdown_to_html(markdown_text) + (f"<h2>Plots</h2>{figs}" if figs else "") + "\n</body></html>\n")


def sweep_html(db_path: Path, sweep_id: str, all_quality: bool = False) -> str:
    """The HTML report of sweep ``sweep_id`` from the warehouse ``db_path`` (opened read-only).

    Contents: trials in run order (config, key, runtime, replicate, device, status, failure class, boot s,
    compile cache, verdict), the config keys with their full settings (``report.settings_text``), the quality
    summary, the comparison tables (``all_quality``: as ``tunelab report --all-quality``), the failed trials
    with their whole failure reasons and server log paths, and the plots.

    Raises:
        ValueError: no sweep ``sweep_id`` in the warehouse.
        duckdb.IOException: the file is locked by a writing process.
    """
    from tunelab import __version__
    from tunelab.core.markdown import markdown_table
    from tunelab.reports.plots import latency_throughput_plot, version_plot
    from tunelab.reports.report import (bottleneck_findings, comparison_frame, quality_summary, settings_text,
                                        sweep_markdown)

    con = duckdb.connect(str(db_path), read_only=True)
    try:
        sw = con.execute("SELECT plan_name, host, started_at FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchall()
        if not sw:
            raise ValueError(f"sweep {sweep_id!r}: not in {db_path}; `tunelab report --json` names the sweeps")
        trials = con.execute(
            """SELECT trial_id, config_label, config_key, runtime_name, replicate, coalesce(gpu_name, '') AS gpu,
                      status, failure_class, failure_reason, boot_s, compile_cache, quality_verdict, engine_args,
                      env, log_path, vllm_version, eager_diagnosis
               FROM trials WHERE sweep_id = ? ORDER BY started_at, trial_id""", [sweep_id]).fetchdf()
    finally:
        con.close()
    statuses = [{"trial_id": r.trial_id, "config": r.config_label, "config_key": r.config_key, "runtime": r.runtime_name,
                 "replicate": r.replicate, "device": r.gpu, "status": r.status, "failure_class": r.failure_class,
                 "boot_s": r.boot_s, "compile_cache": r.compile_cache, "verdict": r.quality_verdict or "unvalidated"}
                for r in trials.itertuples(index=False)]
    settings = {r.config_key: settings_text(r.engine_args, r.env) for r in trials.itertuples(index=False)}
    comp = comparison_frame(db_path, sweep_id, all_quality=all_quality)
    with tempfile.TemporaryDirectory(prefix="tunelab-html-") as tmp:
        plots = [p for p in (latency_throughput_plot(db_path, sweep_id, Path(tmp)),
                             version_plot(db_path, Path(tmp))) if p is not None]
        text = sweep_markdown(comp, sweep_id, statuses, quality_summary(db_path, sweep_id), plots=None,
                              config_settings=settings, findings=bottleneck_findings(db_path, sweep_id))
        failed = trials[trials["status"] != "ok"]
        if len(failed):
            text += "\n\n## Failed trials (whole reasons)\n\n" + "\n".join(markdown_table([{
                "trial": f"`{r.trial_id.split('/', 1)[-1]}`", "status": r.status, "failure": r.failure_class,
                "reason": r.failure_reason, **({"eager re-boot": r.eager_diagnosis or ""}
                                               if failed["eager_diagnosis"].notna().any() else {}),
                "server log": f"`{r.log_path}`" if r.log_path else "",
            } for r in failed.itertuples(index=False)]))
        versions = ", ".join(sorted({str(v) for v in trials["vllm_version"].dropna()})) or "?"
        plan_name, host, started = sw[0]
        return html_page(f"tunelab sweep {sweep_id}", text, [(p.name, p) for p in plots],
                         meta=f"plan {plan_name} · host {host} · started {started} · vLLM {versions} · "
                              f"tunelab {__version__}")


def compare_html(result: dict[str, Any]) -> str:
    """The HTML report of a comparison: ``result`` is what ``flows.compare.compare`` returns (``markdown``,
    ``rows``, ``baseline``, ``candidate``); the A/B table, method and regressions as in the artifact, and the
    chart of each change with its confidence interval (``plots.ab_interval_plot``; none without rows).

    Raises:
        KeyError: ``result`` lacks ``markdown`` or ``rows``.
    """
    from tunelab.reports.plots import ab_interval_plot

    def sel(s: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in (s or {}).items())

    with tempfile.TemporaryDirectory(prefix="tunelab-html-") as tmp:
        p = ab_interval_plot(result["rows"], Path(tmp))
        return html_page(f"tunelab compare: {sel(result.get('candidate', {}))} vs {sel(result.get('baseline', {}))}",
                         result["markdown"], [("change of the candidate vs the baseline, with confidence intervals", p)]
                         if p else None)
