"""Calibration of the A/B rules on simulated boot streams: A/A false-call rate and power for a +5 % effect.

Every stream is an interleaved sequence of boots A, B, A, B, ... of one cell, each boot reduced to one value
(``tunelab.stats.simulate``): log value = log base + effect (B only) + a random-walk drift shared by the two
boots of a pair + independent boot noise. Noise levels from the H200 evidence (docs/statistics.md): between-boot
SD of log values 5 % (c=32) and 10 % (c=1), drift step 2 % per pair. GPU time: every boot costs
``--boot-s`` seconds (start, warm-up, the cell's windows, teardown; the shipped H200 sweeps took about 80 s per
trial), so a stream that stops after n pairs cost ``2 n boot_s``.

Rules compared, each on the same streams:

* fixed Welch, 2 or 4 boots per side (today's shipped designs): one look at the end;
* Welch after every pair (a fixed-sample test repeated, stopping at the first significant look): unsound;
* sequential (``tunelab.stats.sequential``): always-valid confidence sequence of the paired log ratios,
  a look after every pair, stops when decided or at the budget; without history, and with a history prior of
  the right SD (12 df) and of half the right SD (a wrong prior: what that costs).

Run: ``python benchmarks/calibration.py [--streams 20000] [--budget 30] [--boot-s 80]``. Prints one table;
docs/statistics.md has a run of it.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from tunelab.stats.simulate import fixed_welch, sequential_rule, simulate_pairs, welch_every_look


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=20_000)
    ap.add_argument("--budget", type=int, default=30, help="most pairs a sequential A/B may run")
    ap.add_argument("--boot-s", type=float, default=80.0, help="GPU seconds per boot")
    ap.add_argument("--effect", type=float, default=0.05)
    ap.add_argument("--drift", type=float, default=0.02, help="SD of the shared drift step per pair (log)")
    ap.add_argument("--seed", type=int, default=20261201)
    a = ap.parse_args()
    se = math.sqrt(0.05 * 0.95 / a.streams)
    print(f"{a.streams} streams per row; budget {a.budget} pairs; {a.boot_s:.0f} GPU-s per boot; effect "
          f"{a.effect:+.0%}; shared drift step {a.drift:.0%}/pair; SE of a 5 % rate {se:.2%}")
    header = (f"| level | boot SD | rule | A/A false calls | power at {a.effect:+.0%} | pairs (effect) | "
              f"GPU-min per A/B (effect) | pairs (A/A) | GPU-min (A/A) |")
    print(header)
    print("|---|---|---|---|---|---|---|---|---|")
    for level, sd in (("c=32", 0.05), ("c=1", 0.10)):
        kw = dict(sd_boot_log=sd, n_pairs=a.budget, streams=a.streams, drift_sd_log=a.drift)
        aa = simulate_pairs(effect_rel=0.0, seed=a.seed, **kw)
        eff = simulate_pairs(effect_rel=a.effect, seed=a.seed + 1, **kw)
        rules = [
            ("fixed Welch, 2 vs 2 boots", lambda b, c: fixed_welch(b, c, boots=2)),
            ("fixed Welch, 4 vs 4 boots", lambda b, c: fixed_welch(b, c, boots=4)),
            ("Welch after every pair", welch_every_look),
            ("sequential, no history", lambda b, c: sequential_rule(b, c)),
            ("sequential, history SD right (12 df)", lambda b, c: sequential_rule(b, c, prior_sd=sd, prior_df=12)),
            ("sequential, history SD half (12 df)",
             lambda b, c: sequential_rule(b, c, prior_sd=sd / 2, prior_df=12)),
        ]
        for name, rule in rules:
            o0, o1 = rule(*aa), rule(*eff)
            power = float(np.mean(o1.called & (o1.direction > 0)))
            gmin1 = 2 * o1.pairs.mean() * a.boot_s / 60
            gmin0 = 2 * o0.pairs.mean() * a.boot_s / 60
            print(f"| {level} | {sd:.0%} | {name} | {o0.called.mean():.2%} | {power:.1%} | {o1.pairs.mean():.1f} | "
                  f"{gmin1:.1f} | {o0.pairs.mean():.1f} | {gmin0:.1f} |")


if __name__ == "__main__":
    main()
