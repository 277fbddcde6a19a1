"""How many Newton iterations DEER needs as T grows: the predictability picture.

Gonzalez et al. (2025), "Predictability enables parallelization of nonlinear state space
models": when the cell is contractive (largest Lyapunov exponent < 0) the Newton iterations
needed to reach the sequential trajectory grow at most like log T; when it is chaotic
(exponent > 0) they grow like T (DEER then fixes only about one more step per iteration,
Lim et al. 2023, Prop. 1). Both halves are checked here in float64, against the sequential
`lax.scan` trajectory to 1e-10, with the exponent from `statseq.inference.lyapunov`.
Issue 14 also asks for T up to 10^5 on a random statseq cell: the GRU case below.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference.deer import deer, sequential
from statseq.inference.lyapunov import lyapunov_exponent
from statseq.models.neural.cells import RNNBackbone


def _elman(w, h, x):
    return jnp.tanh(w @ h + x)


def _orthogonal(n, gain, seed=0):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return jnp.asarray(gain * q)


def _max_abs(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
               zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


_SEQ = jax.jit(sequential, static_argnums=0)
_DEER = jax.jit(deer, static_argnums=0, static_argnames=("method", "max_iter"))


def test_contractive_cell_iterations_do_not_grow_with_T():
    # |J| <= 0.5 everywhere (tanh' <= 1, orthogonal weights of gain 0.5): exponent
    # <= log 0.5. DEER needs 4 iterations at every T from 10 to 10^5 (measured; the
    # bound asserted is the O(log T) one of Gonzalez et al. with a small constant),
    # quasi-DEER converges linearly (rate about |J|) and needs a few dozen.
    w, h0 = _orthogonal(4, 0.5), jnp.full(4, 0.1)
    iters = {}
    for num_t in (10, 1000, 100_000):
        xs = 0.5 * jax.random.normal(jax.random.key(num_t), (num_t, 4))
        ref = _SEQ(_elman, w, h0, xs)
        assert float(lyapunov_exponent(_elman, w, h0, xs)) < np.log(0.5) + 1e-12
        for method in ("deer", "quasi-deer"):
            res = _DEER(_elman, w, h0, xs, method=method)
            assert bool(res.converged), (method, num_t)
            assert _max_abs(res.states, ref) < 1e-10, (method, num_t)
            iters[method, num_t] = int(res.iterations)
    for num_t in (10, 1000, 100_000):
        assert iters["deer", num_t] <= 6, iters
        assert iters["quasi-deer", num_t] <= 10 + 10 * np.log10(num_t), iters
    # no growth from 10 to 10^5 for DEER: 10^4 times longer, the same iterations
    assert iters["deer", 100_000] <= iters["deer", 10] + 1, iters


def _chaotic(a, h, x):
    return jnp.sin(a * h) + x


def test_chaotic_cell_iterations_grow_like_T():
    # sin(3 h) + x: largest exponent about 0.5 > 0 (chaotic). DEER fixes about one more
    # step per iteration, so it needs a fixed fraction of T (never more than T, its
    # worst case). Chaos amplifies rounding like exp(0.5 t), so the comparison with the
    # sequential trajectory to 1e-10 is made where that amplification stays below 1e4
    # (T <= 20); beyond, both are trajectories to within rounding (residual < 1e-11).
    # Measured: T - 1 iterations at T = 10, 20, 40. At T = 60 even DEER's own affine
    # updates lose digits to the same amplification and its residual stalls at ~5e-12
    # (reported as not converged, never passed off as converged).
    # (tanh(3 Q h + x) is not such a cell: tanh saturates and its exponent is negative,
    # although DEER still needs ~T iterations there from a zero guess; see test_deer.py.)
    h0 = jnp.full(2, 0.1)
    iters = {}
    for num_t in (10, 20, 40):
        xs = 0.3 * jax.random.normal(jax.random.key(0), (num_t, 2))
        assert float(lyapunov_exponent(_chaotic, 3.0, h0, xs)) > 0.3
        res = _DEER(_chaotic, 3.0, h0, xs, method="deer", max_iter=num_t)
        assert bool(res.converged), num_t
        assert float(res.residual) < 1e-11
        if num_t <= 20:
            assert _max_abs(res.states, _SEQ(_chaotic, 3.0, h0, xs)) < 1e-10
        iters[num_t] = int(res.iterations)
        assert num_t // 2 <= iters[num_t] <= num_t, iters
    assert iters[40] >= 3 * iters[10], iters  # linear, not logarithmic, growth


@pytest.mark.parametrize("method", ["deer", "quasi-deer"])
def test_random_gru_at_T_10_to_the_5(method):
    rnn = RNNBackbone("gru", input_dim=3, hidden_dim=4)
    params = rnn.init_params(jax.random.key(1))
    h0 = rnn.initial_state(params)

    def step(p, s, x):
        return rnn.step(p, s, x)[0]

    num_t = 100_000
    xs = jnp.asarray(np.random.default_rng(5).normal(size=(num_t, 3)))
    res = _DEER(step, params, h0, xs, method=method)
    assert bool(res.converged)
    assert float(res.residual) < 1e-11
    assert _max_abs(res.states, _SEQ(step, params, h0, xs)) < 1e-10
    assert int(res.iterations) < (20 if method == "deer" else 200)
