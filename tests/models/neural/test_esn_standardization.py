"""The echo state network standardizes its inputs like the other RNNs (issue 20, point 6).

On raw yearly sunspot numbers (values 0 to 190) a reservoir fed the raw values saturates:
most units sit at ``|tanh| > 0.99``, where they carry no information about the input. With
the standardization absorbed into the fixed input weights the reservoir works in its
responsive range, and it computes exactly what a reservoir drawn with the same key computes
on the standardized series (so the data's scale stays in ``params``, not in the data).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss

SUNSPOTS = ss.datasets.load_sunspots().to_numpy().astype(float)


def _states(model, params, y):
    """Hidden states ``h_{1:T}`` of the backbone on the fully observed series ``y``."""
    enc = jax.vmap(model.head.encode)(jnp.asarray(y), jnp.ones(len(y), bool))
    xs = jnp.concatenate([jnp.zeros_like(enc[:1]), enc[:-1]])
    return np.asarray(model.backbone.sequence(params.backbone, xs))


def _saturated(hs):
    return float(np.mean(np.abs(hs) > 0.99))


@pytest.mark.parametrize("hidden_dim", [20, 50])
def test_reservoir_does_not_saturate_on_raw_sunspots(hidden_dim):
    model = ss.ElmanRNN(hidden_dim=hidden_dim, echo_state=True)
    params = model.initialize(SUNSPOTS, key=jax.random.key(0))
    frac = _saturated(_states(model, params, SUNSPOTS))
    assert frac < 0.05, frac
    if hidden_dim == 20:
        assert frac < 0.01  # the number in ElmanRNN.initialize's docstring (0.6 %)
    # the same reservoir reading the raw values (the weights before standardization:
    # times the standard deviation on y, the indicator column back to 0 bias) saturates
    y_std, y_mean = SUNSPOTS.std(), SUNSPOTS.mean()
    first = params.backbone[0]
    w_y = first.w_in[:, :1] * y_std
    w_m = first.w_in[:, 1:2] + w_y * (y_mean / y_std)
    raw = params._replace(backbone=(first._replace(
        w_in=first.w_in.at[:, :1].set(w_y).at[:, 1:2].set(w_m)),))
    before = _saturated(_states(model, raw, SUNSPOTS))
    assert before > 0.5
    if hidden_dim == 20:
        assert before == pytest.approx(0.88, abs=0.01)  # the docstring's "88 %"


def test_standardization_is_absorbed_into_the_fixed_weights():
    model = ss.ElmanRNN(hidden_dim=8, echo_state=True, spectral_radius=0.8)
    z = (SUNSPOTS - SUNSPOTS.mean()) / SUNSPOTS.std()
    p_raw = model.initialize(SUNSPOTS, key=jax.random.key(3))
    p_std = model.initialize(z, key=jax.random.key(3))
    # the reservoir on raw data computes what the same draw computes on the standardized
    # series (for which standardizing is the identity)
    np.testing.assert_allclose(_states(model, p_raw, SUNSPOTS), _states(model, p_std, z),
                               rtol=1e-9, atol=1e-12)
    # recurrent weights and spectral radius are untouched by the data's scale
    np.testing.assert_array_equal(np.asarray(p_raw.backbone[0].w_rec),
                                  np.asarray(p_std.backbone[0].w_rec))
    radius = np.max(np.abs(np.linalg.eigvals(np.asarray(p_raw.backbone[0].w_rec))))
    assert radius == pytest.approx(0.8, rel=1e-10)
    # the bias stays 0 (the mean goes through the observed-indicator column) and the
    # reservoir is still frozen for fit_sgd
    assert not np.any(np.asarray(p_raw.backbone[0].bias))
    assert jax.tree.leaves(model.trainable(p_raw).backbone) == [False] * 4


def test_same_standardization_as_gru_and_lstm():
    """Every RNN's first layer reads ``(y_{t-1} - mean) / std``: the weights on y times
    the standard deviation equal the random draw's, for the ESN as for the GRU."""
    for model in (ss.ElmanRNN(hidden_dim=5, echo_state=True), ss.GRU(hidden_dim=5),
                  ss.ElmanRNN(hidden_dim=5)):
        p_raw = model.initialize(SUNSPOTS, key=jax.random.key(1))
        p_one = model.initialize(SUNSPOTS / SUNSPOTS.std(), key=jax.random.key(1))
        w_raw = np.asarray(p_raw.backbone[0].w_in[:, 0]) * SUNSPOTS.std()
        np.testing.assert_allclose(w_raw, np.asarray(p_one.backbone[0].w_in[:, 0]),
                                   rtol=1e-10, err_msg=type(model).__name__)
