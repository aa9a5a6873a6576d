"""The boot-noise options of ``stats.simulate_sweeps`` (used by the A/A calibration benchmark): each noise keeps
the SD it is asked for, heavy tails are heavy, the wander is a walk (neighbouring boots alike), and bad options
fail with the field named."""

from __future__ import annotations

import numpy as np
import pytest

from tunelab.stats.simulate_sweeps import simulate_sweeps


def _logs(n_sweeps: int, boots: int, **kw) -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.stack([np.log(simulate_sweeps([["a"] * boots], sd_sweep=0.0, rng=rng, **kw).value.to_numpy())
                     for _ in range(n_sweeps)])


@pytest.mark.parametrize("kw", [{}, {"noise_df": 3.0}, {"noise_pool": np.r_[-2.0, -0.5, 0.0, 0.5, 2.0]}])
def test_boot_noise_has_the_sd_asked_for(kw):
    y = _logs(400, 16, sd_boot=0.1, **kw)
    sd = float(np.sqrt(np.mean(np.var(y, axis=1, ddof=1))))
    assert 0.09 < sd < 0.11, (kw, sd)


def test_student_t_noise_is_heavier_tailed_than_normal():
    def kurtosis(y):
        e = (y - y.mean(axis=1, keepdims=True)).ravel()
        return float(np.mean(e**4) / np.mean(e**2) ** 2)

    assert kurtosis(_logs(400, 16, sd_boot=0.1, noise_df=3.0)) > kurtosis(_logs(400, 16, sd_boot=0.1)) + 1.0


def test_wander_has_its_sd_and_neighbouring_boots_are_alike():
    y = _logs(2000, 16, sd_boot=0.0, sd_wander=0.1)
    assert 0.09 < float(np.sqrt(np.mean(np.var(y, axis=1, ddof=1)))) < 0.11
    near = float(np.mean((y[:, 1:] - y[:, :-1]) ** 2))
    far = float(np.mean((y[:, 8:] - y[:, :-8]) ** 2))
    assert far > 4 * near, (near, far)  # a walk: the variance of a difference grows with the distance (8 here)


@pytest.mark.parametrize("kw, field", [({"noise_df": 2.0}, "noise_df"), ({"noise_df": 3.0, "noise_pool": [0.0, 1.0]},
                                                                          "noise_pool"),
                                       ({"noise_pool": [1.0]}, "noise_pool"), ({"sd_wander": -0.1}, "sd_wander")])
def test_bad_noise_options_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        simulate_sweeps([["a", "b"]], sd_boot=0.1, sd_sweep=0.0, rng=np.random.default_rng(0), **kw)
