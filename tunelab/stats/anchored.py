"""Cross-sweep comparisons through an anchor: ``log(value) = config effect + sweep effect + boot noise``.

Why: boots of one config are not interchangeable across time. On the H200 evidence the same config's boots
shifted between sweeps and drifted within one (``evidence/h200-2026-11-29-versions``,
``evidence/h200-2026-12-02-side-by-side``), and an A/A split early-vs-late or sweep-vs-sweep made about twice the
nominal false calls. A fixed reference (the plan's ``anchor:``) measured in every sweep lets the sweep effect
cancel: a difference of two configs measured in different sweeps is read as ``(a - anchor in a's sweep) -
(b - anchor in b's sweep)``, and its interval carries the anchor's boot noise in both sweeps.

Model (one cell: workload x load level, one metric), over boot-level rows ``(config, sweep, order, value)``::

    log y_{c,s,k} = mu_c + u_s + beta * t_{s,k} + e_{c,s,k}
    u_s ~ N(0, var_sweep)     (sweep effect, shared by every config of the sweep)
    e   ~ N(0, var_boot)      (boot noise, independent)
    t   = boot order within the sweep, as a fraction of the sweep (-0.5 .. +0.5), only with a drift term

Fit (``docs/statistics.md``, "Anchored comparisons"):

* **>= MIN_SWEEPS_MIXED sweeps**: statsmodels ``MixedLM`` (REML), sweep as the group, configs (and drift) as
  fixed effects; the contrast ``mu_a - mu_b`` and its SE come from the fixed effects' covariance, which carries
  ``var_sweep`` where a and b sit in different sweeps and the anchor does not tie them.
* **fewer sweeps** (REML with 2-4 groups often stops at the boundary or does not converge): sweeps as fixed
  effects (OLS, ``log y ~ C(config) + C(sweep) [+ t]``). The sweep effect is then estimated from the configs the
  sweeps share (the anchor) with its SE, so it cancels exactly; the t quantile has the residual degrees of
  freedom ``n - p`` (p = configs + sweeps - 1 [+ 1 for drift]).
* Both need a and b connected: in one sweep together, or through a config (the anchor) measured in both
  sweeps. Without that the comparison is **unanchored**: the difference of the two sides' mean log values,
  with variance ``var_boot (1/n_a + 1/n_b) + var_sweep (1/S_a + 1/S_b)`` (S: sweeps of a side), ``var_sweep``
  estimated from the history (every config measured in >= 2 sweeps, the anchor's rows first); it is never
  narrower than the within-sweep interval. Without such history its ``sweep_var`` is unknown and the result
  says the interval is not valid across sweeps.

Drift (``drift="auto"``): the term ``beta t`` enters whenever the rows give a boot order and the fit keeps
>= MIN_DRIFT_DF residual df with it (decided by the design, not by the drift's own p-value: choosing the model
on the data left undetected drifts in the difference, 7 % A/A false calls in simulation); ``True`` always (where
an order is given), ``False`` never. In a balanced order (ABBA, ``tunelab.core.trial_order``)
drift is orthogonal to the configs and costs one df; in an unbalanced order it removes the bias of early vs
late.

Beside the model's interval every result gives a plain Welch interval on the boots' log values (no sweep, no
drift): what a reader would compute by hand, so the two can be compared.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["MIN_DRIFT_DF", "MIN_SWEEPS_MIXED", "AnchoredDifference", "anchored_difference", "interaction_variance",
           "sweep_variance"]

#: Fewest sweeps for the random-effects (MixedLM) fit; fewer use fixed sweep effects (see the module doc).
MIN_SWEEPS_MIXED = 5
#: ``drift="auto"`` fits the drift term when the fit keeps at least this many residual df with it.
MIN_DRIFT_DF = 3

_COLUMNS = ("config", "sweep", "value")


@dataclass(frozen=True)
class AnchoredDifference:
    """One cell's difference ``b`` against ``a`` (b/a - 1) on the log scale.

    ``rel``/``rel_low``/``rel_high``: the model's ratio - 1 and its interval; ``diff_log``, ``se_log``, ``df``
    of its t quantile; ``p_value``. ``method``: ``"mixedlm"``, ``"fixed sweep effects"``, ``"within sweep"``
    or ``"unanchored"``. ``anchored``: the sweep effect cancels through a shared sweep or the anchor;
    ``cross_sweep``: a and b share no sweep. ``var_boot``/``var_sweep``: the variance components used (log
    scale; ``var_sweep`` nan when unknown). ``drift``: the drift term was fitted, ``drift_log`` its size
    (log change from the first to the last boot of a sweep). ``welch_*``: Welch's interval on the boots' log
    values ignoring sweeps. ``note``: what the reader must know (unanchored, sweep variance unknown, fallback).
    """

    a: str
    b: str
    anchor: str | None
    n_a: int
    n_b: int
    diff_log: float
    se_log: float
    df: float
    rel: float
    rel_low: float
    rel_high: float
    p_value: float
    method: str
    anchored: bool
    cross_sweep: bool
    var_boot: float
    var_sweep: float
    drift: bool
    drift_log: float
    welch_rel_low: float
    welch_rel_high: float
    welch_p_value: float
    note: str


def _prepare(rows: pd.DataFrame) -> pd.DataFrame:
    """Validated copy with ``y`` (log value) and ``t`` (order as a centred fraction of the sweep, or 0)."""
    if not isinstance(rows, pd.DataFrame):
        raise TypeError(f"rows must be a pandas DataFrame with columns {list(_COLUMNS)} [+ 'order'], got {type(rows)}")
    missing = [c for c in _COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"rows: missing columns {missing}; need one row per boot with {list(_COLUMNS)} and "
                         "optionally 'order' (boot order within its sweep)")
    df = rows.copy()
    v = pd.to_numeric(df["value"], errors="coerce").to_numpy(float)
    bad = ~np.isfinite(v) | (v <= 0)
    if bad.any():
        raise ValueError(f"rows: 'value' must be positive and finite for a ratio; bad at rows "
                         f"{df.index[bad].tolist()[:5]} (leave out failed boots, or compare in the metric's unit)")
    df["config"] = df["config"].astype(str)
    df["sweep"] = df["sweep"].astype(str)
    df["y"] = np.log(v)
    if "order" in df.columns and df["order"].notna().all():
        o = df.groupby("sweep")["order"].rank(method="average")
        n = df.groupby("sweep")["order"].transform("size").astype(float)
        df["t"] = np.where(n > 1, (o - 1) / (n - 1).clip(lower=1) - 0.5, 0.0)
    else:
        df["t"] = 0.0
    return df.reset_index(drop=True)


def _design(df: pd.DataFrame, configs: list[str], sweep_fixed: bool, drift: bool) -> tuple[np.ndarray, list[str]]:
    """Design matrix: one column per config (cell means), then sweep dummies (first sweep dropped), then t."""
    cols, names = [], []
    for c in configs:
        cols.append((df["config"] == c).to_numpy(float))
        names.append(f"config[{c}]")
    if sweep_fixed:
        for s in sorted(df["sweep"].unique())[1:]:
            cols.append((df["sweep"] == s).to_numpy(float))
            names.append(f"sweep[{s}]")
    if drift:
        cols.append(df["t"].to_numpy(float))
        names.append("t")
    return np.column_stack(cols), names


def _ols(y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(coefficients, their covariance, residual variance, residual df) of an OLS fit; rank-deficient -> raise."""
    rank = np.linalg.matrix_rank(x)
    if rank < x.shape[1]:
        raise np.linalg.LinAlgError("design not of full rank")
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    dfr = len(y) - x.shape[1]
    resid = y - x @ beta
    s2 = float(resid @ resid / dfr) if dfr > 0 else math.nan
    cov = s2 * np.linalg.inv(x.T @ x) if dfr > 0 else np.full((x.shape[1],) * 2, math.nan)
    return beta, cov, s2, float(dfr)


def _connected(df: pd.DataFrame, a: str, b: str) -> bool:
    """True when a and b are linked through sweeps and the configs they share (the anchor)."""
    by_config: dict[str, set[str]] = {}
    by_sweep: dict[str, set[str]] = {}
    for c, s in zip(df["config"], df["sweep"]):
        by_config.setdefault(c, set()).add(s)
        by_sweep.setdefault(s, set()).add(c)
    seen, todo = {a}, [a]
    while todo:
        for s in by_config[todo.pop()]:
            for c in by_sweep[s] - seen:
                seen.add(c)
                todo.append(c)
    return b in seen


def _sweep_var(df: pd.DataFrame, configs: list[str] | None) -> tuple[float, float, str]:
    """:func:`sweep_variance` on prepared rows (numpy; the estimator of ``stats.noise_model.variance_components``)."""
    sub = df if configs is None else df[df["config"].isin(configs)]
    num = den = 0.0
    used = []
    for cfg, g in sub.groupby("config", sort=True):
        codes, sweeps = pd.factorize(g["sweep"])
        k = len(sweeps)
        if k < 2:
            continue
        y = g["y"].to_numpy(float)
        n_k = np.bincount(codes).astype(float)
        m_k = np.bincount(codes, weights=y) / n_k
        big_n, grand = float(n_k.sum()), float(y.mean())
        dfw = big_n - k
        msw = float(((y - m_k[codes]) ** 2).sum() / dfw) if dfw > 0 else 0.0
        msb = float((n_k * (m_k - grand) ** 2).sum() / (k - 1))
        n0 = (big_n - float((n_k**2).sum()) / big_n) / (k - 1)
        num += max((msb - msw) / n0, 0.0) * (k - 1)
        den += k - 1
        used.append(str(cfg))
    if not den:
        return math.nan, 0.0, "no config measured in 2 or more sweeps"
    return num / den, den, f"sweep means of {', '.join(used)} ({den:g} df)"


def sweep_variance(rows: pd.DataFrame, configs: list[str] | None = None) -> tuple[float, float, str]:
    """Sweep-to-sweep variance of log values from history: ``(var_sweep, df, source)``.

    Uses the configs measured in >= 2 sweeps (``configs`` restricts them, e.g. ``[anchor]``). One-way
    random-effects ANOVA of each config's boots grouped by sweep (the unbalanced method of moments of
    ``stats.noise_model.variance_components``: ``(MSB - MSW) / n0``, truncated at 0), pooled over configs weighted by
    their ``sweeps - 1`` df. Returns ``(nan, 0, reason)`` when no config was measured in 2 sweeps. ``rows`` as
    in :func:`anchored_difference`.
    """
    return _sweep_var(_prepare(rows), None if configs is None else [str(c) for c in configs])


def _welch(ya: np.ndarray, yb: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(rel_low, rel_high, p) of Welch's t interval of mean(yb) - mean(ya) on log values (nan without df)."""
    if len(ya) < 2 or len(yb) < 2:
        return math.nan, math.nan, math.nan
    r = stats.ttest_ind(yb, ya, equal_var=False)
    if not np.isfinite(r.statistic):
        d = float(yb.mean() - ya.mean())
        return math.expm1(d), math.expm1(d), 1.0 if d == 0 else 0.0
    ci = r.confidence_interval(1 - alpha)
    return math.expm1(float(ci.low)), math.expm1(float(ci.high)), float(r.pvalue)


def _mixed(df: pd.DataFrame, configs: list[str], drift: bool) -> tuple[np.ndarray, np.ndarray, float, float] | None:
    """(fixed effects, their covariance, var_boot, var_sweep) of a MixedLM fit (REML), None if it failed."""
    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import ConvergenceWarning

    x, _ = _design(df, configs, sweep_fixed=False, drift=drift)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        try:
            res = sm.MixedLM(df["y"].to_numpy(float), x, groups=df["sweep"].to_numpy()).fit(reml=True)
        except (np.linalg.LinAlgError, ValueError):
            return None
    k = x.shape[1]
    fe, cov = np.asarray(res.fe_params, float), np.asarray(res.cov_params(), float)[:k, :k]
    var_sweep = float(np.asarray(res.cov_re).ravel()[0])
    if not (np.isfinite(fe).all() and np.isfinite(cov).all() and math.isfinite(var_sweep)):
        return None
    return fe, cov, float(res.scale), max(var_sweep, 0.0)


def anchored_difference(rows: pd.DataFrame, a: str, b: str, anchor: str | None = None, *,
                        confidence: float = 0.95, drift: bool | str = "auto",
                        sweep_var: tuple[float, float] | None = None,
                        interaction_var: tuple[float, float] | None = None) -> AnchoredDifference:
    """The difference of config ``b`` against ``a`` in one cell, through the anchor where they ran apart.

    Args:
        rows: one row per ok boot of this cell and metric: ``config`` (name), ``sweep`` (id), ``value`` (the
            boot's value in the metric's unit, the mean of its windows, > 0) and optionally ``order`` (its
            position in its sweep's boot order, any increasing number: the trial index or start time). History
            (other sweeps of the anchor, other configs) may be included: it informs ``var_boot`` and
            ``var_sweep``.
        a, b: the configs compared (``rel`` is b/a - 1).
        anchor: the plan's anchor config (a runtime + config that never changes), or None. Only used to say
            whether the comparison is anchored and, unanchored, to prefer its history for ``var_sweep``; the
            fit uses every config that links the sweeps.
        confidence: two-sided level.
        drift: ``"auto"`` (fit the order term when an order is given and >= MIN_DRIFT_DF df remain), True, False.
        sweep_var: ``(var_sweep, df)`` from a longer history (e.g. the warehouse's anchor series), used for an
            unanchored comparison instead of the rows' own estimate.
        interaction_var: ``(var_int, df)`` of the config x sweep interaction (:func:`interaction_variance`) from
            configs other than a and b measured in the same sweeps, used for a cross-sweep comparison instead of
            the rows' own estimate (which, with only the anchor in both sweeps, does not exist).

    Returns:
        :class:`AnchoredDifference`.

    Raises:
        ValueError: missing columns, values not positive, a bad confidence, ``a`` or ``b`` without rows, or
            ``a == b``.
    """
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    if drift not in ("auto", True, False):
        raise ValueError(f"drift must be 'auto', True or False, got {drift!r}")
    a, b = str(a), str(b)
    if a == b:
        raise ValueError(f"a and b are both {a!r}; compare two different configs")
    alpha = 1.0 - confidence
    df = _prepare(rows)
    for name, c in (("a", a), ("b", b)):
        if not (df["config"] == c).any():
            raise ValueError(f"{name}={c!r} has no rows; configs present: {sorted(df['config'].unique())}")
    ya, yb = df.loc[df.config == a, "y"].to_numpy(), df.loc[df.config == b, "y"].to_numpy()
    w_lo, w_hi, w_p = _welch(ya, yb, alpha)
    sa, sb = set(df.sweep[df.config == a]), set(df.sweep[df.config == b])
    cross = not (sa & sb)
    anchor_s = None if anchor is None else str(anchor)
    common = dict(a=a, b=b, anchor=anchor_s, n_a=len(ya), n_b=len(yb), cross_sweep=cross,
                  welch_rel_low=w_lo, welch_rel_high=w_hi, welch_p_value=w_p)
    if not _connected(df, a, b):
        return _unanchored(df, a, b, anchor_s, alpha, sweep_var, common)
    # Only the sweeps linked to a and b and the configs in them inform the fit.
    configs = sorted(df["config"].unique(), key=lambda c: (c not in (a, b), c))
    n_sweeps = df["sweep"].nunique()
    has_order = bool((df["t"] != 0).any())
    use_drift = bool(drift) and drift != "auto" and has_order
    if drift == "auto" and has_order:
        try:
            # Fixed in advance, not chosen by the drift's own p-value: selecting the model on the data would
            # leave the undetected drifts in the difference (a 7 % A/A rate in simulation instead of 5 %).
            x, _ = _design(df, configs, sweep_fixed=True, drift=True)
            use_drift = _ols(df["y"].to_numpy(float), x)[3] >= MIN_DRIFT_DF
        except np.linalg.LinAlgError:
            use_drift = False
    ia, ib = configs.index(a), configs.index(b)
    method, note = "fixed sweep effects", ""
    fit = None
    if n_sweeps >= MIN_SWEEPS_MIXED:
        fit = _mixed(df, configs, use_drift)
        if fit is not None:
            fe, cov, var_boot, var_sw = fit
            k_fixed = len(configs) + (n_sweeps - 1) + int(use_drift)
            dfr = float(max(len(df) - k_fixed, 1))
            method = "mixedlm"
        else:
            note = "MixedLM did not converge; sweeps fitted as fixed effects. "
    if fit is None:
        x, names = _design(df, configs, sweep_fixed=n_sweeps > 1, drift=use_drift)
        try:
            fe, cov, var_boot, dfr = _ols(df["y"].to_numpy(float), x)
        except np.linalg.LinAlgError:
            use_drift = False
            x, names = _design(df, configs, sweep_fixed=n_sweeps > 1, drift=False)
            fe, cov, var_boot, dfr = _ols(df["y"].to_numpy(float), x)
        var_sw = _sweep_var(df, [anchor_s] if anchor_s and anchor_s in configs else None)[0]
        if n_sweeps == 1:
            method = "within sweep"
        if dfr <= 0:
            return _no_df(common, method, float(fe[ib] - fe[ia]), use_drift, note + "no residual degrees of freedom")
    diff = float(fe[ib] - fe[ia])
    se = math.sqrt(max(float(cov[ia, ia] + cov[ib, ib] - 2 * cov[ia, ib]), 0.0))
    var_int = math.nan
    if cross:
        # The anchor removes the sweep shift all configs share, not a config's own wobble from sweep to sweep
        # (config x sweep interaction): its variance, from the configs seen in >= 2 sweeps, enters a
        # cross-sweep contrast for a's and b's cells and, averaged, for the linking configs' cells.
        var_int, df_int = interaction_var if interaction_var is not None else _interaction_var(df)
        links = len((set(df.config[df.sweep.isin(sa)]) & set(df.config[df.sweep.isin(sb)])) - {a, b}) or 1
        if math.isfinite(var_int) and df_int > 0:
            extra = var_int * 2 * (1 + 1 / links)
            within = se**2
            se = math.sqrt(within + extra)
            if extra > 0:  # Satterthwaite's df of the sum of the two variance parts
                dfr = (within + extra) ** 2 / (within**2 / dfr + extra**2 / df_int)
            src = "from the other configs of these sweeps" if interaction_var is not None else "from these rows"
            note += f"config x sweep interaction SD {math.sqrt(var_int):.1%} ({df_int:g} df, {src}) added; "
        else:
            note += "config x sweep interaction not estimable (no config besides the anchor in 2 sweeps); "
    how = {"mixedlm": f"MixedLM (REML), sweep as the group, {n_sweeps} sweeps",
           "fixed sweep effects": f"sweeps as fixed effects ({n_sweeps} sweeps: fewer than {MIN_SWEEPS_MIXED} for "
                                  "MixedLM)",
           "within sweep": "one sweep"}[method]
    linked = "a and b in one sweep" if not cross else f"across sweeps through {anchor_s or 'a shared config'}"
    note = (f"{note}{how}; {linked}; {dfr:.3g} df" + ("; drift term in boot order fitted" if use_drift else ""))
    return _result(common, diff, se, dfr, alpha, method=method, anchored=True, var_boot=var_boot,
                   var_sweep=var_sw, drift=use_drift, drift_log=float(fe[-1]) if use_drift else math.nan, note=note)


def interaction_variance(rows: pd.DataFrame) -> tuple[float, float]:
    """Config x sweep interaction variance of log values and its df from boot rows: ``(var_int, df)``.

    Two-way ANOVA with interaction over the configs measured in >= 2 sweeps: ``(MS_int - MS_within) / n_h`` (``n_h``
    the harmonic mean boots per (config, sweep) cell), truncated at 0; ``(nan, 0)`` when no interaction df exist
    (fewer than 2 such configs, or one boot a cell). The part of a config's difference to the anchor that moves from
    sweep to sweep (on another machine, say) and does not cancel through the anchor. ``rows`` as in
    :func:`anchored_difference`; pass the configs other than the two compared (``anchored_cells`` does), so that a
    real change of one of them is not read as wobble.
    """
    return _interaction_var(_prepare(rows))


def _interaction_var(df: pd.DataFrame) -> tuple[float, float]:
    """Config x sweep interaction variance of log values and its df, by two-way ANOVA with interaction over
    the configs measured in >= 2 sweeps: ``(MS_int - MS_within) / n_h`` (``n_h`` the harmonic mean boots per
    (config, sweep) cell), truncated at 0; ``(nan, 0)`` when no interaction df exist."""
    multi = df.groupby("config")["sweep"].nunique()
    sub = df[df["config"].isin(multi[multi >= 2].index)]
    if sub.empty or sub["sweep"].nunique() < 2 or sub["config"].nunique() < 2:
        return math.nan, 0.0
    y = sub["y"].to_numpy(float)
    cells = sub.groupby(["config", "sweep"])["y"]
    n_cells = cells.ngroups
    x, _ = _design(sub, sorted(sub["config"].unique()), sweep_fixed=True, drift=False)
    try:
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    except np.linalg.LinAlgError:
        return math.nan, 0.0
    rank = np.linalg.matrix_rank(x)
    sse_add = float(((y - x @ beta) ** 2).sum())
    sse_full = float(((y - cells.transform("mean").to_numpy(float)) ** 2).sum())
    df_int, df_w = float(n_cells - rank), float(len(y) - n_cells)
    if df_int <= 0 or df_w <= 0:
        return math.nan, 0.0
    ms_int, ms_w = (sse_add - sse_full) / df_int, sse_full / df_w
    n_h = float(len(cells.size()) / (1.0 / cells.size()).sum())
    return max((ms_int - ms_w) / n_h, 0.0), df_int


def _result(common: dict, diff: float, se: float, df_t: float, alpha: float, **kw) -> AnchoredDifference:
    if se == 0.0:
        lo = hi = diff
        p = 1.0 if diff == 0 else 0.0
    else:
        tq = float(stats.t.ppf(1 - alpha / 2, df_t))
        lo, hi = diff - tq * se, diff + tq * se
        p = float(2 * stats.t.sf(abs(diff) / se, df_t))
    return AnchoredDifference(**common, diff_log=diff, se_log=se, df=float(df_t), rel=math.expm1(diff),
                              rel_low=math.expm1(lo), rel_high=math.expm1(hi), p_value=p, **kw)


def _no_df(common: dict, method: str, diff: float, drift: bool, note: str) -> AnchoredDifference:
    return AnchoredDifference(**common, diff_log=diff, se_log=math.nan, df=0.0, rel=math.expm1(diff),
                              rel_low=math.nan, rel_high=math.nan, p_value=math.nan, method=method, anchored=True,
                              var_boot=math.nan, var_sweep=math.nan, drift=drift, drift_log=math.nan, note=note)


def _unanchored(df: pd.DataFrame, a: str, b: str, anchor: str | None, alpha: float,
                sweep_var: tuple[float, float] | None, common: dict) -> AnchoredDifference:
    """a and b in different sweeps with nothing linking them: within-sweep variance plus the sweep variance."""
    sub = df[df.config.isin([a, b])]
    # Boot variance within (config, sweep) groups: the same-sweep noise, pooled.
    g = sub.groupby(["config", "sweep"])["y"]
    dfw = float((g.size() - 1).clip(lower=0).sum())
    ssw = float(((sub["y"] - g.transform("mean")) ** 2).sum())
    var_boot = ssw / dfw if dfw > 0 else math.nan
    ya, yb = sub.loc[sub.config == a, "y"], sub.loc[sub.config == b, "y"]
    n_sa, n_sb = df.sweep[df.config == a].nunique(), df.sweep[df.config == b].nunique()
    if sweep_var is not None:
        vs, dfs = float(sweep_var[0]), float(sweep_var[1])
        src = f"given history ({dfs:g} df)"
    else:
        vs, dfs, src = _sweep_var(df, [anchor] if anchor and (df.config == anchor).any() else None)
        if not math.isfinite(vs) and anchor:
            vs, dfs, src = _sweep_var(df, None)
    diff = float(yb.mean() - ya.mean())
    if not math.isfinite(var_boot):
        return _no_df(common, "unanchored", diff, False,
                      "unanchored: a and b ran in different sweeps with no shared config; no within-sweep df")
    se_within = math.sqrt(var_boot * (1 / len(ya) + 1 / len(yb)))
    if math.isfinite(vs) and dfs > 0:
        se = math.sqrt(se_within**2 + vs * (1 / n_sa + 1 / n_sb))
        # The t quantile on the fewer df of the two parts: never narrower than the within-sweep interval.
        df_t = min(dfw, dfs)
        note = (f"unanchored: a and b ran in different sweeps with no anchor between them; widened by the "
                f"history's sweep variance (SD {math.sqrt(vs):.1%}, {src}); {df_t:g} df")
        return _result(common, diff, se, df_t, alpha, method="unanchored", anchored=False, var_boot=var_boot,
                       var_sweep=vs, drift=False, drift_log=math.nan, note=note)
    note = ("unanchored: a and b ran in different sweeps with no anchor between them and no history of sweep "
            "variance; the interval is within-sweep only and NOT valid across sweeps (add an anchor: to the plan)")
    return _result(common, diff, se_within, dfw, alpha, method="unanchored", anchored=False, var_boot=var_boot,
                   var_sweep=math.nan, drift=False, drift_log=math.nan, note=note)
