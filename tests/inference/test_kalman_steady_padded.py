"""The steady-state Kalman path under length buckets (issue 11, point 6).

A complete-data sequence padded at the end to a bucket length keeps the steady-state path
(`statseq.inference.kalman_steady.steady_state_log_probs` with ``num_valid``): its
log-densities at the real steps and its final carry (the state after the last real step)
must equal those of the unpadded sequence to 1e-12, whether the real length ends before
or after the switch to the steady-state gain; ``statseq.filter`` and ``statseq.forecast``
under ``set_length_buckets("always")`` must take that path and agree with ``"never"``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.inference import kalman_steady

TOL = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(autouse=True)
def _restore_policy():
    previous = ss.set_length_buckets("never")
    yield
    ss.set_length_buckets(**previous)


def _models():
    lin = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    struct = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=4)))
    return [(ss.LocalLevel(), ss.LocalLevelParams(0.5, 0.1)),  # diffuse, n = D = 1
            (lin, lin.default_params()),  # proper prior, D = 2
            (struct, struct.default_params())]  # 5 diffuse states


# One padded length for every case, the bucket of the longest (``bucket_length(301) =
# 320``): the padded program (``num_valid`` is traced) then compiles once per model instead
# of once per case and model (CI time); the shorter series are padded with more steps,
# which the check covers all the same (the padded steps must not leak into the result).
PADDED = 320
_RUN = jax.jit(kalman_steady.steady_state_log_probs, static_argnames="head")


@pytest.mark.parametrize("num_real", [11, 45, 300])
def test_padded_steady_state_log_probs_equal_unpadded(num_real):
    """``head = 16``: 11 real steps end inside the first exact chunk, 45 after the switch
    for the proper model and before it for some diffuse ones, 300 well after."""
    rng = np.random.default_rng(num_real)
    run = _RUN
    assert ss.bucket_length(num_real + 1) <= PADDED == ss.bucket_length(PADDED)
    for model, params in _models():
        arrays = jax.jit(model.to_arrays)(params)
        dim = arrays.emission_weights.shape[0]
        y = rng.normal(size=(num_real, dim)).cumsum(axis=0)
        padded = PADDED
        y_pad = np.concatenate([y, np.zeros((padded - num_real, dim))])
        u, u_pad = jnp.zeros((num_real, 0)), jnp.zeros((padded, 0))
        ref_lp, ref_final = run(arrays, jnp.asarray(y), u, head=16)
        lp, final = run(arrays, jnp.asarray(y_pad), u_pad, head=16,
                        num_valid=jnp.int32(num_real))
        np.testing.assert_allclose(lp[:num_real], ref_lp, **TOL)
        for name in ("mean", "cov", "diffuse", "collapsed", "t"):
            np.testing.assert_allclose(np.asarray(getattr(final, name), float),
                                       np.asarray(getattr(ref_final, name), float), **TOL,
                                       err_msg=f"{type(model).__name__} {name}")
        assert int(final.t) == num_real


def test_filter_and_forecast_keep_the_fast_path_when_padded(monkeypatch):
    """T = 300 (bucket 320, past ``fast_path_min_timesteps``, lowered here to 256): the
    padded ``statseq.filter`` calls the model's ``complete_data_log_probs`` with
    ``num_valid`` and gives the unpadded log-densities and final carry; ``forecast`` the
    same moments."""
    model = ss.LocalLevel()
    monkeypatch.setattr(type(model), "steady_state_min_timesteps", 256)
    params = ss.LocalLevelParams(0.5, 0.1)
    y = np.random.default_rng(0).normal(size=300).cumsum()
    calls = []
    original = type(model).complete_data_log_probs

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("num_valid") is not None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "complete_data_log_probs", spy)
    ref = ss.filter(model, params, y)
    ss.set_length_buckets("always")
    out = ss.filter(model, params, y)
    assert calls == [False, True]  # traced unpadded, then padded with num_valid
    np.testing.assert_allclose(out.log_probs, ref.log_probs, **TOL)
    assert out.log_probs.shape == (300,)
    for a, b in zip(jax.tree.leaves(out.final_carry), jax.tree.leaves(ref.final_carry),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), **TOL)
    ss.set_length_buckets("never")
    ref_fc = ss.forecast(model, params, y, num_steps=3, num_samples=20, key=jax.random.key(1))
    ss.set_length_buckets("always")
    out_fc = ss.forecast(model, params, y, num_steps=3, num_samples=20, key=jax.random.key(1))
    np.testing.assert_allclose(out_fc.samples, ref_fc.samples, **TOL)
