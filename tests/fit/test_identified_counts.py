"""Parameter counts are counts of identified parameters (issue 20, point 6).

The reference is the local rank of the model: the rank of the Jacobian ``J`` (rows: the
per-step log-likelihood contributions of a batch of random sequences, many more than the
parameters; columns: the unconstrained parameters) at a generic parameter value. A
direction ``v`` with ``J v = 0`` leaves every contribution, hence the likelihood of every
data set of this shape, unchanged to first order; each counted direction must move it.

Rank tolerance. In float64 an exactly-null direction gives a singular value of rounding
size, about ``eps * ||J|| * sqrt(rows)`` (measured here: at most ``2e-14 * s_max``); the
tolerance ``s_max * max(J.shape) * eps * 1e3`` (``~1e-10 s_max``) sits far above that, and
every model below except the neural networks shows a gap: its smallest counted singular
value is more than ``1e3`` times the tolerance.

Neural networks have further exact weight symmetries than the softmax head's (e.g. the GRU
and LSTM gate biases against the observed-indicator weights at the first step, the scale
of a normalization against the next projection in Mamba and the LRU), which
`statseq.num_params` does not subtract: for them the count is an upper bound on the rank,
and the softmax head's ``F + 1`` directions are checked to be exactly null.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import statseq as ss

EPS = np.finfo(np.float64).eps


def _real(rng, shape):
    return np.cumsum(rng.normal(size=shape), axis=1) * 0.3 + rng.normal(size=shape)


def _cases():
    """name -> (model, y (N, T, ...), exact): ``exact`` says count == rank is claimed."""
    rng = np.random.default_rng(7)
    n_seq, t_len = 6, 30
    real = _real(rng, (n_seq, t_len))
    counts = rng.poisson(3.0, (n_seq, t_len)).astype(float)
    cats = rng.integers(0, 3, (n_seq, t_len)).astype(float)
    return {
        "PoissonHMM K=2, 1 input": (ss.PoissonHMM(num_states=2, input_dim=1), counts, True),
        "PoissonHMM K=3, 2 inputs": (ss.PoissonHMM(num_states=3, input_dim=2), counts, True),
        "GaussianHMM K=2, 1 input": (ss.GaussianHMM(num_states=2, input_dim=1),
                                     real[..., None], True),
        "LinearAutoregressiveHMM": (ss.LinearAutoregressiveHMM(num_states=2),
                                    real[..., None], True),
        "BernoulliHMM": (ss.BernoulliHMM(num_states=2, emission_dim=2),
                         (rng.random((n_seq, t_len, 2)) < 0.4).astype(float), True),
        "CategoricalHMM": (ss.CategoricalHMM(num_states=2, num_classes=3), cats, True),
        "LinearGaussianSSM n=2": (ss.LinearGaussianSSM(state_dim=2, emission_dim=2),
                                  _real(rng, (n_seq, t_len, 2)), True),
        "LinearGaussianSSM stationary": (
            ss.LinearGaussianSSM(state_dim=2, emission_dim=2, initial="stationary"),
            _real(rng, (n_seq, t_len, 2)), True),
        "LinearGaussianSSM diffuse": (
            ss.LinearGaussianSSM(state_dim=2, emission_dim=2, initial="diffuse"),
            _real(rng, (n_seq, t_len, 2)), True),
        "TimeVaryingLinearGaussianSSM": (
            ss.TimeVaryingLinearGaussianSSM(state_dim=1, emission_dim=1, num_timesteps=5),
            _real(rng, (20, 5, 1)), False),
        "StructuralModel": (ss.StructuralModel((ss.Trend(slope=True),)), real, True),
        "LocalLevel": (ss.LocalLevel(), real, True),
        "LocalLinearTrend": (ss.LocalLinearTrend(), real, True),
        "AR": (ss.AR(order=2), real, True),
        "MarkovSwitchingAR": (ss.MarkovSwitchingAR(num_regimes=2, order=1), real, True),
        "ElmanRNN": (ss.ElmanRNN(hidden_dim=2), real, False),
        "GRU": (ss.GRU(hidden_dim=2), real, False),
        "LSTM": (ss.LSTM(hidden_dim=2), real, False),
        "GRU categorical": (ss.GRU(hidden_dim=2, emission="categorical", num_classes=3),
                            cats, False),
        "Mamba": (ss.Mamba(hidden_dim=2, state_dim=2), _real(rng, (12, 30)), False),
        "LRU": (ss.LRU(hidden_dim=2, state_dim=2), real, False),
        "WaveNet": (ss.WaveNet(hidden_dim=2, num_layers=2), real, False),
        "S4D": (ss.S4D(hidden_dim=2, state_dim=2), real, False),
        "S5": (ss.S5(hidden_dim=2, state_dim=2), real, False),
        "NGRC": (ss.NGRC(num_lags=2, degree=2), real, True),
        "LinearAttention": (ss.LinearAttention(hidden_dim=2, num_heads=1, num_layers=1),
                            real, False),
        "AFT": (ss.AFT(hidden_dim=2, num_layers=1), real, False),
        "RWKV": (ss.RWKV(hidden_dim=2, num_layers=1, ffn_dim=2), real, False),
        "MLSTM": (ss.MLSTM(hidden_dim=2, num_layers=1, num_heads=1, expand=1), real, False),
        # every invariance of num_redundant_params at once: basis, origin, both softmax shifts
        "SwitchingLDS": (ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None,
                                         input_dim=1, transition_inputs=True, recurrent=True),
                         real, True),
        "Transformer": (ss.Transformer(hidden_dim=2, num_layers=1, num_heads=1, max_len=8,
                                       mlp_ratio=1), real, False),
        # a network: weight symmetries not subtracted, the count is an upper bound
        "DeepStateSpace": (ss.DeepStateSpace(input_dim=1, hidden_dim=2), real, False),
        "EncoderDecoder": (ss.EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=2),
                                             context_length=4), real, False),
    }


CASES = _cases()


def test_every_registered_model_is_covered():
    covered = {type(model).__name__ for model, _, _ in CASES.values()}
    assert covered == set(ss.registered_models())


@functools.cache
def _case_jacobian(name):
    """`_jacobian` of ``CASES[name]``, computed once per module (three tests use the
    PoissonHMM and GRU-categorical Jacobians)."""
    model, y, _ = CASES[name]
    return _jacobian(model, y)


def _jacobian(model, y, seed=0):
    """(J, flat params, unravel, inputs) at a generic point near the model's initializer.

    Forward mode, compiled as one program: ``J`` has ``N T`` rows but only ``P`` columns
    (a few dozen at most here), so ``jacfwd`` pushes ``P`` tangents through one scan where
    ``jacrev`` pulled ``N T`` cotangents back through a stored one; it compiles in about
    less time and gives the same matrix to rounding (the rank tolerance is ~1e6
    rounding units wide, see the module docstring).
    """
    rng = np.random.default_rng(seed)
    inputs = rng.normal(size=y.shape[:2] + (model.num_inputs,)) if model.num_inputs else None
    try:
        params = model.initialize(y, key=jax.random.key(0), inputs=inputs)
    except NotImplementedError:
        params = model.default_params()
    flat, unravel = ravel_pytree(ss.to_unconstrained(model, params))
    flat = flat + 0.1 * jnp.asarray(rng.normal(size=flat.shape))

    def per_step(theta):
        p = ss.from_unconstrained(model, unravel(theta))
        return ss.filter(model, p, y, inputs=inputs).log_probs.ravel()

    try:
        jac = np.asarray(jax.jit(jax.jacfwd(per_step))(flat))
    except TypeError:  # a recurrence with a custom VJP (the LSTM's) has no forward mode
        jac = np.asarray(jax.jit(jax.jacrev(per_step))(flat))
    assert np.all(np.isfinite(jac))
    return jac, flat, unravel, inputs


def _rank(jac):
    s = np.linalg.svd(jac, compute_uv=False)
    tol = s[0] * max(jac.shape) * EPS * 1e3
    return int(np.sum(s > tol)), s, tol


@pytest.mark.parametrize("name", list(CASES))
def test_count_is_the_rank_of_the_per_step_jacobian(name):
    model, y, exact = CASES[name]
    jac, flat, _, _ = _case_jacobian(name)
    assert jac.shape[0] >= 3 * flat.size or not exact  # T >> P where equality is claimed
    rank, s, tol = _rank(jac)
    count = ss.num_params(model)
    assert ss.num_free_params(model) == count
    if exact:
        assert rank == count, (rank, count, flat.size)
        assert s[rank - 1] > 1e3 * tol  # a clear gap: counted directions move log p
        if rank < flat.size:
            assert s[rank] < 1e-12 * s[0]  # and the others are null to rounding
    else:
        assert rank <= count, (rank, count)
    if isinstance(model, ss.TimeVaryingLinearGaussianSSM):
        n = model.state_dim  # the docstring's measured structural excess
        assert count - rank == n * n + n


def test_issue_example_two_states_one_input():
    """K = 2 states, one input (issue 20): 11 free scalars, 7 identified; AIC uses 7."""
    model = ss.PoissonHMM(num_states=2, input_dim=1)
    assert ss.num_params(model) == 7
    _, y, _ = CASES["PoissonHMM K=2, 1 input"]
    y1 = y[0]
    u = np.linspace(-1.0, 1.0, y1.shape[0])[:, None]
    params = model.initialize(y1, key=jax.random.key(0), inputs=u)
    ic = ss.information_criteria(model, params, y1, inputs=u)
    log_lik = float(ss.log_prob(model, params, y1, inputs=u))
    assert ic["num_params"] == 7
    assert ic["aic"] == pytest.approx(-2.0 * log_lik + 2.0 * 7, rel=1e-12)
    assert ic["bic"] == pytest.approx(-2.0 * log_lik + 7 * np.log(y1.size), rel=1e-12)
    # the uncounted directions: a constant added to one row of the logits (bias or the
    # weights of one input) leaves the likelihood unchanged, exactly (not just to 1st order)
    reg = params.transitions
    for row in range(2):
        for moved in (reg._replace(bias=reg.bias.at[row].add(1.7)),
                      reg._replace(weights=reg.weights.at[row, :, 0].add(-2.3))):
            lp = float(ss.log_prob(model, params._replace(transitions=moved), y1, inputs=u))
            assert lp == pytest.approx(log_lik, rel=1e-13, abs=1e-12)
    # a counted direction (one logit alone) moves it
    moved = reg._replace(bias=reg.bias.at[0, 1].add(0.5))
    assert abs(float(ss.log_prob(model, params._replace(transitions=moved), y1, inputs=u))
               - log_lik) > 1e-3


def _free_columns(model, trainable):
    """Boolean mask over the flat unconstrained vector: the free scalars of ``trainable``."""
    up = ss.to_unconstrained(model, jax.tree.map(
        lambda s: jnp.zeros(s), model.param_shapes(), is_leaf=ss.core.params.is_shape))
    shapes = [np.shape(leaf) for leaf in jax.tree.leaves(up)]
    flags = jax.tree.structure(up).flatten_up_to(trainable)
    return np.concatenate([np.broadcast_to(np.asarray(f, bool), s).ravel()
                           for f, s in zip(flags, shapes, strict=True)])


def test_partly_frozen_softmax_rows():
    """Freezing one logit of a row removes that row's invariance; the reference-category
    parametrization (first column of every row frozen) is fully identified."""
    model, _, _ = CASES["PoissonHMM K=2, 1 input"]
    jac, flat, unravel, _ = _case_jacobian("PoissonHMM K=2, 1 input")
    full = jax.tree.map(lambda _: True, ss.from_unconstrained(model, unravel(flat)))
    bias_one = np.ones((2, 2), bool)
    bias_one[0, 0] = False
    reference_bias = np.array([[False, True], [False, True]])
    reference_weights = np.stack([reference_bias], axis=-1)
    for trainable, expected in (
        (full._replace(transitions=full.transitions._replace(bias=bias_one)),
         11 - 1 - 3),       # 10 free scalars, row 0's bias no longer redundant
        (full._replace(transitions=ss.TransitionRegression(reference_weights,
                                                           reference_bias)), 7),
    ):
        count = ss.num_params(model, trainable)
        assert count == expected
        cols = _free_columns(model, trainable)
        rank, _, _ = _rank(jac[:, cols])
        assert rank == count


def test_neural_softmax_head_directions_are_null():
    """The categorical head ``softmax(W h + b)``: ``b + c 1`` and a constant added to one
    column of ``W`` change no probability; those ``F + 1`` are not counted."""
    model, _, _ = CASES["GRU categorical"]
    jac, flat, unravel, _ = _case_jacobian("GRU categorical")
    total = flat.size
    assert ss.num_params(model) == total - (model.feature_dim + 1)
    zeros = jax.tree.map(jnp.zeros_like, unravel(flat))
    directions = [zeros._replace(head=zeros.head._replace(bias=zeros.head.bias + 1.0))]
    for j in range(model.feature_dim):
        directions.append(zeros._replace(head=zeros.head._replace(
            weight=zeros.head.weight.at[:, j].set(1.0))))
    scale = np.abs(jac).max()
    for d in directions:
        v = np.asarray(ravel_pytree(d)[0])
        assert np.abs(jac @ v).max() < 1e-12 * scale
        # each head coordinate alone is a counted direction: it moves log p
        for i in np.flatnonzero(v)[:1]:
            assert np.abs(jac[:, i]).max() > 1e-3 * scale


def test_summary_counts_identified_parameters():
    """`summary` on the reference-category parametrization (nothing redundant; the initial
    law frozen too, as its one-sequence MLE is on the boundary) counts ``k = 6``."""
    model = ss.PoissonHMM(num_states=2, input_dim=1)
    rng = np.random.default_rng(3)
    t_len = 300
    u = rng.normal(size=(t_len, 1))
    z = (rng.random(t_len) < 0.5).astype(int)
    y = rng.poisson(np.where(z == 1, 6.0, 1.0)).astype(float)
    params = model.initialize(y, key=jax.random.key(0), inputs=u)
    full = jax.tree.map(lambda _: True, params)
    reference = np.array([[False, True], [False, True]])
    trainable = full._replace(initial_probs=False, transitions=ss.TransitionRegression(
        reference[..., None], reference))
    reg = params.transitions
    params = params._replace(transitions=reg._replace(
        bias=reg.bias.at[:, 0].set(0.0), weights=reg.weights.at[:, 0].set(0.0)))
    fit = ss.fit_lbfgs(model, params, y, inputs=u, trainable=trainable, progress=False)
    table = ss.summary(model, fit.params, y, inputs=u, trainable=trainable)
    assert table.num_params == 6 == ss.num_params(model, trainable)
    ic = ss.information_criteria(model, fit.params, y, inputs=u, trainable=trainable)
    assert ic["num_params"] == 6
    assert table.aic == pytest.approx(ic["aic"], rel=1e-12)
    # with everything trainable, the same fitted point counts 7 (11 less 4 redundant)
    assert ss.information_criteria(model, fit.params, y, inputs=u)["num_params"] == 7
