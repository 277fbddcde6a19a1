"""DEER / quasi-DEER (statseq.inference.deer) against the sequential scan.

The reference is the trajectory of the same step function by `jax.lax.scan` (and
`jax.grad` through it for gradients); the cells are statseq's own Elman, GRU and LSTM
(`RNNBackbone.step`, random `init_params`), plus small hand-made cells for the theory:
DEER is exact after at most T iterations (Lim et al. 2023, Prop. 1: iteration i fixes
h_0..h_{i-1}), converges in a handful of iterations on contractive cells, and
non-convergence is reported, never passed off as an answer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference.deer import (
    DeerResult,
    combine_affine_dense,
    deer,
    dense_linear_recurrence,
    sequential,
)
from statseq.models.neural.cells import RNNBackbone

METHODS = ("deer", "quasi-deer")


def _cell(cell, hidden=5, inputs=3, seed=0):
    rnn = RNNBackbone(cell, input_dim=inputs, hidden_dim=hidden)
    params = rnn.init_params(jax.random.key(seed))
    return (lambda p, s, x: rnn.step(p, s, x)[0]), params, rnn.initial_state(params)


def _max_abs(a, b):
    # in NumPy: eager jnp operations would compile one small program per shape
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
               zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


_SEQ = jax.jit(sequential, static_argnums=0)  # one program per step function and shape


def _normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape))


def _assert_grads_close(g_ref, g, rtol=1e-8):
    for a, b in zip(jax.tree_util.tree_leaves(g_ref), jax.tree_util.tree_leaves(g),
                    strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.size:
            assert np.max(np.abs(a - b)) <= rtol * np.max(np.abs(a))


def _elman(w, h, x):
    return jnp.tanh(w @ h + x)


def _orthogonal(n, gain, seed=0):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return jnp.asarray(gain * q)


def _loss_of(traj, ys):
    """A Gaussian-like log-likelihood of the trajectory (plus the LSTM's cell state)."""
    def fn(p, h0, xs):
        states = traj(p, h0, xs)
        layer = states[0]  # the states of statseq's cells are tuples over layers
        lstm = isinstance(layer, tuple)
        h = layer[0] if lstm else layer
        c = layer[1] if lstm else 0.0
        return -0.5 * jnp.sum((h - ys) ** 2) + jnp.sum(jnp.log1p(c ** 2)), states
    return fn


# Compiling is nearly all of this file's cost, so each (cell, method) is one compiled
# program that gives the trajectory, the solver's statistics and the implicit gradient at
# once, on one long sequence (T = 10^4 for the GRU, 10^3 else); the shortest lengths (1,
# 2) are in test_implicit_gradient_of_the_shortest_sequences.
@pytest.mark.parametrize("cell, num_t", [("elman", 1000), ("gru", 10_000), ("lstm", 1000)])
def test_converges_to_sequential_trajectory_with_the_implicit_gradient(cell, num_t):
    step, params, h0 = _cell(cell, hidden=4)
    xs, ys = _normal(num_t, (num_t, 3)), _normal(4, (num_t, 4))
    grad = jax.grad(_loss_of(lambda p, h0, xs: sequential(step, p, h0, xs), ys),
                    argnums=(0, 1, 2), has_aux=True)
    g_ref, ref = jax.jit(grad)(params, h0, xs)
    its = {}
    for method in METHODS:
        def solve(p, h0, xs, m=method):
            res = deer(step, p, h0, xs, method=m)
            return res.states, res

        def loss(p, h0, xs, solve=solve):
            states, res = solve(p, h0, xs)
            return _loss_of(lambda *_: states, ys)(p, h0, xs)[0], res

        g, res = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(params, h0, xs)
        assert (jax.tree_util.tree_structure(res.states)
                == jax.tree_util.tree_structure(ref))
        assert bool(res.converged), method
        assert _max_abs(res.states, ref) < 1e-10, method
        assert 1 <= int(res.iterations) <= num_t
        assert float(res.residual) < 1e-11
        its[method] = int(res.iterations)
        _assert_grads_close(g_ref, g)
    # contractive random cells: DEER needs a handful of Newton iterations (4-5 seen, also
    # at T = 10^4); quasi-DEER converges only linearly and needs more (20-50 seen)
    assert its["deer"] < 20
    assert its["deer"] < its["quasi-deer"] < 200


def test_deer_needs_at_most_T_iterations_on_a_chaotic_cell():
    # tanh(3 Q h + x), Q orthogonal: expansive wherever tanh is not saturated (at the
    # zero guess J = 3 Q diag(sech^2)), so Newton's linearizations are poor and it gains
    # little beyond fixing one more step per iteration; it must still finish in T.
    num_t = 30
    w = _orthogonal(4, 3.0)
    xs = 0.5 * jax.random.normal(jax.random.key(0), (num_t, 4))
    h0 = jnp.full(4, 0.1)
    ref = jax.jit(sequential, static_argnums=0)(_elman, w, h0, xs)
    res = jax.jit(lambda w, xs: deer(_elman, w, h0, xs))(w, xs)
    assert bool(res.converged)
    assert num_t // 2 <= int(res.iterations) <= num_t  # it does need many (28 seen)
    assert _max_abs(res.states, ref) < 1e-10
    # quasi-DEER shares the guarantee (iteration i also fixes h_0..h_{i-1})
    res = jax.jit(lambda w, xs: deer(_elman, w, h0, xs, method="quasi-deer"))(w, xs)
    assert bool(res.converged) and int(res.iterations) <= num_t
    assert _max_abs(res.states, ref) < 1e-10


@pytest.mark.parametrize("method", METHODS)
def test_non_convergence_is_reported(method):
    w = _orthogonal(4, 3.0)
    xs = 0.5 * jax.random.normal(jax.random.key(1), (200, 4))
    h0 = jnp.full(4, 0.1)
    res = jax.jit(lambda w, xs: deer(_elman, w, h0, xs, method=method, max_iter=5))(w, xs)
    assert not bool(res.converged)
    assert int(res.iterations) == 5
    assert float(res.residual) > 1e-3  # the reported residual is the true one
    r = jnp.max(jnp.abs(jax.vmap(_elman, (None, 0, 0))(
        w, jnp.concatenate([h0[None], res.states[:-1]]), xs) - res.states))
    assert float(res.residual) == pytest.approx(float(r))


@pytest.mark.parametrize("method", METHODS)
def test_overflow_is_never_reported_as_converged(method):
    # h_t = 3 h_{t-1} + x_t overflows float64 after about 650 steps: the states are not
    # finite, and the solver must say so.
    def expand(a, h, x):
        return a * h + x

    res = jax.jit(lambda a, xs: deer(expand, a, jnp.ones(2), xs, method=method))(
        3.0, jnp.ones((1000, 2)))
    assert not bool(res.converged)
    assert not bool(jnp.isfinite(res.residual)) or float(res.residual) > 1.0
    assert not bool(jnp.all(jnp.isfinite(res.states)))


@pytest.mark.parametrize("method", METHODS)
def test_implicit_gradient_of_the_shortest_sequences(method):
    w, h0 = _orthogonal(2, 0.9), jnp.array([1.0, -0.5])

    def loss(traj):
        def fn(w, h0, xs):
            states, res = traj(w, h0, xs)
            return jnp.sum(jnp.cos(states)), (states, res)
        return fn

    def solve(w, h0, xs):
        res = deer(_elman, w, h0, xs, method=method)
        return res.states, res.converged

    for num_t in (1, 2):  # the edge cases of the solver and of its adjoint
        xs = jnp.linspace(-1.0, 1.0, 2 * num_t).reshape(num_t, 2)
        g_ref, (ref, _) = jax.jit(jax.grad(
            loss(lambda w, h0, xs: (sequential(_elman, w, h0, xs), None)),
            argnums=(0, 1, 2), has_aux=True))(w, h0, xs)
        g, (states, converged) = jax.jit(jax.grad(loss(solve), argnums=(0, 1, 2),
                                                  has_aux=True))(w, h0, xs)
        assert bool(converged) and states.shape == (num_t, 2)
        np.testing.assert_allclose(states, ref, rtol=1e-12, atol=1e-14)
        for a, b in zip(g_ref, g, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


def test_float32_converges_with_a_looser_tolerance():
    # float32: the default residual tolerance is 1e-5 (about 80 ulps; Newton's residual
    # stalls at rounding level, a few ulps times the scan's depth). With the cell's
    # contraction the trajectory error is then within about 10 times that.
    step, params, h0 = _cell("gru", hidden=8)
    xs = _normal(5, (1000, 3))
    ref = _SEQ(step, params, h0, xs)  # float64
    p32, h32, xs32 = jax.tree_util.tree_map(lambda v: np.asarray(v, np.float32),
                                            (params, h0, xs))
    for method in METHODS:
        res = jax.jit(lambda p, xs, m=method: deer(step, p, h32, xs, method=m,
                                                    max_iter=200))(p32, xs32)
        assert res.states[0].dtype == jnp.float32
        assert bool(res.converged) and float(res.residual) <= 1e-5
        assert _max_abs(res.states, ref) < 1e-4


def test_warm_start_and_batching():
    step, params, h0 = _cell("lstm", hidden=4)
    xs = np.asarray(_normal(6, (3, 300, 3)))
    solve = jax.jit(lambda p, xs, init: deer(step, p, h0, xs, init=init))
    exact = _SEQ(step, params, h0, xs[0])
    assert int(solve(params, xs[0], exact).iterations) == 0
    cold = solve(params, xs[0], jax.tree_util.tree_map(jnp.zeros_like, exact))
    near = jax.tree_util.tree_map(lambda v: v + 1e-4, exact)
    warm = solve(params, xs[0], near)
    assert bool(warm.converged) and int(warm.iterations) < int(cold.iterations)
    assert _max_abs(warm.states, exact) < 1e-10
    batched = jax.jit(jax.vmap(lambda x: deer(step, params, h0, x)))(xs)
    assert batched.iterations.shape == (3,) and bool(batched.converged.all())
    for i in range(3):
        one = jax.tree_util.tree_map(lambda v, i=i: v[i], batched.states)
        assert _max_abs(one, _SEQ(step, params, h0, xs[i])) < 1e-10


@pytest.mark.parametrize("method", ("deer", "quasi-deer", "elk", "quasi-elk"))
def test_max_iter_zero_checks_the_guess_without_a_loop(method):
    # the models rebuild a converged solution with max_iter=0 (its implicit gradient):
    # the result is the guess, its true residual and the tolerance test, and the
    # program has no while loop to compile
    step, params, h0 = _elman, _orthogonal(3, 0.8), jnp.zeros(3)
    xs = _normal(8, (40, 3))
    exact = _SEQ(step, params, h0, xs)
    solve = jax.jit(lambda p, init: deer(step, p, h0, xs, method=method, init=init,
                                         max_iter=0))
    assert "while" not in solve.lower(params, exact).as_text()
    res = solve(params, exact)
    assert int(res.iterations) == 0 and bool(res.converged)
    assert _max_abs(res.states, exact) == 0.0
    off = exact + 1e-3
    res = solve(params, off)
    r = jnp.max(jnp.abs(jax.vmap(step, (None, 0, 0))(
        params, jnp.concatenate([h0[None], off[:-1]]), xs) - off))
    assert not bool(res.converged) and float(res.residual) == pytest.approx(float(r))
    assert not bool(solve(params, exact.at[3, 1].set(jnp.nan)).converged)


def test_dense_linear_recurrence_and_combine():
    rng = np.random.default_rng(0)
    a, b, h0 = rng.normal(size=(9, 3, 3)) * 0.5, rng.normal(size=(9, 3)), rng.normal(size=3)
    h, want = h0, []
    for t in range(9):
        h = a[t] @ h + b[t]
        want.append(h)
    np.testing.assert_allclose(jax.jit(dense_linear_recurrence)(a, b, h0), np.array(want),
                               rtol=1e-12, atol=1e-12)
    e1, e2, e3 = ((a[i], b[i]) for i in range(3))
    left = combine_affine_dense(combine_affine_dense(e1, e2), e3)
    right = combine_affine_dense(e1, combine_affine_dense(e2, e3))
    for x, y in zip(left, right, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="a must be"):
        dense_linear_recurrence(a[:, :2], b)


def test_bad_input_errors():
    xs = jnp.ones((5, 2))
    with pytest.raises(ValueError, match="method"):
        deer(_elman, jnp.eye(2), jnp.zeros(2), xs, method="newton")
    with pytest.raises(ValueError, match="leading time axis"):
        deer(_elman, jnp.eye(2), jnp.zeros(2), (xs, jnp.ones((4, 2))))
    with pytest.raises(ValueError, match="max_iter"):
        deer(_elman, jnp.eye(2), jnp.zeros(2), xs, max_iter=-1)
    with pytest.raises(ValueError, match="tol"):
        deer(_elman, jnp.eye(2), jnp.zeros(2), xs, tol=0.0)
    with pytest.raises(ValueError, match="damping"):
        deer(_elman, jnp.eye(2), jnp.zeros(2), xs, method="elk", damping=-1.0)
    with pytest.raises(ValueError, match="structure"):
        deer(lambda p, h, x: (h, h), None, jnp.zeros(2), xs)
    with pytest.raises(TypeError, match="floating"):
        deer(lambda p, h, x: h, None, jnp.zeros(2, jnp.int32), xs)
    with pytest.raises(ValueError, match="init"):
        deer(_elman, jnp.eye(2), jnp.zeros(2), xs, init=jnp.zeros((4, 2)))
    res = deer(_elman, jnp.eye(2), jnp.zeros(2), jnp.ones((0, 2)))
    assert isinstance(res, DeerResult) and res.states.shape == (0, 2)
    assert bool(res.converged) and int(res.iterations) == 0


def test_elk_converges_on_contractive_cells_with_the_implicit_gradient():
    step, params, h0 = _cell("gru", hidden=3)
    xs = _normal(8, (200, 3))

    def loss(p, method):
        if method == "sequential":
            states = sequential(step, p, h0, xs)
        else:
            states = deer(step, p, h0, xs, method=method, max_iter=100).states
        return jnp.sum(jnp.sin(states[0])), states

    grad = jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)
    g_ref, ref = grad(params, "sequential")
    for method in ("elk", "quasi-elk"):
        g, states = grad(params, method)
        assert _max_abs(states, ref) < 1e-10, method
        _assert_grads_close(g_ref, g)


def test_elk_converges_where_undamped_newton_overflows():
    # h_t = x_t + 0.5 tanh(10 M h_{t-1}), |x_t| >= 1: at the solution |h| >= 0.5, the tanh
    # is saturated almost everywhere and the cell contracts, but at the zero initial guess
    # J = 5 M: DEER's first linear recurrence grows like 5^t and overflows float64
    # (T = 1000 > 440), and Newton is lost (NaN). The damped steps never raise the merit
    # (8 iterations seen for both ELK variants).
    m = jnp.array([[0.8, 0.2], [0.2, 0.8]])

    def cell(a, h, x):
        return x + 0.5 * jnp.tanh(a * (m @ h))

    k1, k2 = jax.random.split(jax.random.key(0))
    xs = jnp.sign(jax.random.normal(k1, (1000, 2))) * (1 + jnp.abs(
        jax.random.normal(k2, (1000, 2))))
    h0 = jnp.zeros(2)
    ref = sequential(cell, 10.0, h0, xs)
    # (quasi-DEER's overflow is checked in test_overflow_is_never_reported_as_converged)
    res = jax.jit(lambda a, xs: deer(cell, a, h0, xs))(10.0, xs)
    assert not bool(res.converged) and not bool(jnp.all(jnp.isfinite(res.states)))
    for method in ("elk", "quasi-elk"):
        res = jax.jit(lambda a, xs, m=method: deer(cell, a, h0, xs, method=m,
                                                    max_iter=60))(10.0, xs)
        assert bool(res.converged) and int(res.iterations) < 20, method
        assert _max_abs(res.states, ref) < 1e-10


def test_lyapunov_exponent_exact_on_a_linear_cell_and_its_sign_predicts_deer():
    from statseq.inference.lyapunov import lyapunov_exponent

    # linear diagonal cell: the estimate telescopes to (1/T) log |A^T v0| exactly
    a = jnp.array([0.5, 0.9, -1.1])
    num_t = 300
    lam = lyapunov_exponent(lambda a, h, x: a * h + x, a, jnp.zeros(3),
                            jnp.ones((num_t, 3)))
    v0 = np.ones(3) / np.sqrt(3)
    exact = np.log(np.linalg.norm(np.asarray(a) ** num_t * v0)) / num_t
    assert float(lam) == pytest.approx(exact, rel=1e-12)
    assert abs(float(lam) - np.log(1.1)) < 2e-3  # -> log max |a| as T grows
    # contractive Elman (|J| <= 0.5): exponent <= log 0.5 and a few DEER iterations;
    # sin(3 h) + x (chaotic, exponent about 0.5 > 0): DEER needs nearly T iterations
    xs = 0.5 * jax.random.normal(jax.random.key(0), (20, 4))
    h0 = jnp.full(4, 0.1)
    lam_c = lyapunov_exponent(_elman, _orthogonal(4, 0.5), h0, xs)
    assert float(lam_c) < np.log(0.5) + 1e-12
    res = jax.jit(lambda w, xs: deer(_elman, w, h0, xs))(_orthogonal(4, 0.5), xs)
    assert bool(res.converged) and int(res.iterations) <= 6

    def chaotic(a, h, x):
        return jnp.sin(a * h) + x

    xs = 0.3 * jax.random.normal(jax.random.key(0), (20, 2))
    h0 = jnp.full(2, 0.1)
    assert float(lyapunov_exponent(chaotic, 3.0, h0, xs)) > 0.3
    res = jax.jit(lambda a, xs: deer(chaotic, a, h0, xs))(3.0, xs)
    assert bool(res.converged) and int(res.iterations) >= 18
    # chaos amplifies rounding like exp(0.5 t): both trajectories are right to ~1e-12
    assert _max_abs(res.states, sequential(chaotic, 3.0, h0, xs)) < 1e-10
