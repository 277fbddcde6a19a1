# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Parallelizing an RNN with Newton and Kalman
#
# A recurrent network's hidden states follow a nonlinear recursion,
# $h_t = f_\theta(h_{t-1}, x_t)$, and a recursion over $T$ steps looks inherently
# sequential. It is not: the whole trajectory $h_{0:T-1}$ is the root of one system of
# $T$ equations,
#
# $$r_t(h) = h_t - f_\theta(h_{t-1}, x_t) = 0, \qquad t = 0, \dots, T-1,$$
#
# and Newton's method on that system turns each iteration into a *linear* recursion,
# which an associative scan evaluates in $O(\log T)$ sequential depth (DEER: Lim et al.,
# 2023, "Parallelizing non-linear sequential models over the sequence length"). Damping
# the Newton step turns each iteration into a **Kalman smoother** (ELK: Gonzalez et al.,
# 2024, "Towards scalable and stable parallelization of nonlinear RNNs"): the Kalman
# smoother that vignette 03 ("State space models") runs on the Nile, here in its
# parallel form.
#
# This tutorial takes a GRU fitted to a long real series and
#
# 1. fits it (3,177 monthly sunspot numbers);
# 2. evaluates its log-likelihood with the sequential scan and with each parallel solver
#    (`evaluation="deer"`, `"quasi-deer"`, `"elk"`, `"quasi-elk"` on the model), and
#    checks that the answers agree;
# 3. follows the residual of the Newton system iteration by iteration;
# 4. shows that an ELK step *is* a Kalman smoother, and checks it against the
#    least-squares problem it solves;
# 5. asks when parallel evaluation can work at all: the largest Lyapunov exponent of the
#    cell decides whether the number of iterations stays flat as $T$ grows or grows with
#    it (Gonzalez et al., 2025, "Predictability enables parallelization of nonlinear
#    state space models"), and what a GPU changes.

# %%
import os
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # numpyro's tqdm import

import dataclasses  # noqa: E402
from functools import partial  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pandas as pd  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from scipy.sparse.linalg import spsolve  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.inference.deer import dense_linear_recurrence  # noqa: E402
from statseq.inference.elk import elk_step, lm_update  # noqa: E402
from statseq.inference.linear_recurrence import linear_recurrence  # noqa: E402
from statseq.inference.lyapunov import lyapunov_exponent  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64: differences below show rounding only
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests
NUM_STEPS = 30 if SMOKE else 120  # Adam steps
NUM_MONTHS = 600 if SMOKE else None  # the smoke mode uses the first 600 months only
CHAOTIC_CAP = 120 if SMOKE else 400  # Newton iterations tried on the chaotic cell

# %% [markdown]
# ## 1. The data and the network
#
# The monthly sunspot numbers, January 1749 to December 2013
# (`ss.datasets.load_sunspots_monthly()`, R's `sunspot.month`), on Tong's
# variance-stabilizing scale $x = 2(\sqrt{1 + y} - 1)$, standardized. Vignette 04 asks
# whether a GRU forecasts them better than an autoregression; here the network is the
# object of study, so it is fitted to the whole series: a GRU with 8 hidden units and a
# Gaussian head, $y_t \mid y_{<t} \sim \mathcal{N}(\mu(h_t), \sigma(h_t)^2)$, trained by
# Adam for 120 steps (a few seconds).

# %%
monthly = ss.datasets.load_sunspots_monthly()
tong = 2.0 * (np.sqrt(1.0 + monthly.to_numpy()) - 1.0)
y = (tong - tong.mean()) / tong.std()
if NUM_MONTHS is not None:
    y = y[:NUM_MONTHS]
T = y.size
H = 8
model = ss.GRU(hidden_dim=H)
optimizer = optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 20, NUM_STEPS, 1e-3))
fit = ss.fit_sgd(model, model.initialize(y, key=jax.random.key(0)), y, optimizer=optimizer,
                 num_steps=NUM_STEPS, key=jax.random.key(1), clip_norm=1.0, progress=False)
params = fit.params
print(f"{T} months; GRU({H}) log-likelihood {float(ss.log_prob(model, params, y)):.2f} "
      f"({float(ss.log_prob(model, params, y)) / T:.3f} per month)")

# %% [markdown]
# **The recurrence to be solved.** The network reads $x_t = (y_{t-1}, 1)$ (the previous
# observation and an observed-indicator; $x_0 = 0$). Its input projection
# $g_t = W_x x_t + b$ does not depend on the state, so it is computed for every step at
# once, and what remains is the GRU cell
#
# $$r_t = \sigma(g^r_t + W^r h_{t-1}), \qquad z_t = \sigma(g^z_t + W^z h_{t-1}),$$
#
# $$n_t = \tanh(g^n_t + r_t \odot (W^n h_{t-1} + b^n)), \qquad
# h_t = (1 - z_t) \odot n_t + z_t \odot h_{t-1}.$$
#
# We write it out, and check that its sequential scan is the model's own trajectory.

# %%
layer = params.backbone[0]  # one layer: w_in (3H, 2), bias (3H,), w_rec (3H, H), bias_rec


def gru_step(p, h, g):
    """One GRU step from the input projection ``g = W_x x_t + b`` (as statseq's cell)."""
    gh = p.w_rec @ h
    r = jax.nn.sigmoid(g[:H] + gh[:H])
    z = jax.nn.sigmoid(g[H:2 * H] + gh[H:2 * H])
    n = jnp.tanh(g[2 * H:] + r * (gh[2 * H:] + p.bias_rec))
    return n + z * (h - n)


xs = np.stack([np.concatenate([[0.0], y[:-1]]), np.concatenate([[0.0], np.ones(T - 1)])], 1)
gs = jnp.asarray(xs) @ layer.w_in.T + layer.bias  # (T, 3H): g_t for every step
h_init = jnp.zeros(H)  # h_{-1}
h_seq = jax.lax.scan(lambda h, g: (gru_step(layer, h, g),) * 2, h_init, gs)[1]
gap = float(jnp.max(jnp.abs(h_seq - model.backbone.sequence(params.backbone, xs))))
print(f"max |our scan - the model's trajectory| = {gap:.1e}")
assert gap < 1e-12

# %% [markdown]
# ## 2. Newton's method on the whole trajectory
#
# Linearize $f$ around the current guess $h^{(i)}$: with the Jacobians
# $J_t = \partial f / \partial h\,(h^{(i)}_{t-1}, x_t)$, the next guess solves
#
# $$h^{(i+1)}_t = J_t\, h^{(i+1)}_{t-1} + b_t, \qquad
# b_t = f(h^{(i)}_{t-1}, x_t) - J_t h^{(i)}_{t-1},$$
#
# a *linear* recursion: the composition of affine maps $h \mapsto J_t h + b_t$ is
# associative, so `jax.lax.associative_scan` computes all $T$ states in $O(\log T)$ depth.
# That is **DEER**; it costs $O(T H^3)$ work per iteration (products of $H \times H$
# matrices) and converges quadratically near the solution. **Quasi-DEER** keeps only the
# diagonals of the $J_t$ ($O(T H)$ work and memory, a scan of scalars per unit) and
# converges linearly. In exact arithmetic iteration $i$ makes $h_0, \dots, h_{i-1}$
# exact, so DEER is exact after at most $T$ iterations; on a contractive cell it needs far
# fewer. Below is one iteration of each solver, written with the library's building
# blocks (ELK's damped step, `elk_step`, is section 4's subject); `statseq`'s solver,
# `statseq.inference.deer.deer`, runs the same iteration inside one `lax.while_loop` and
# stops when the residual $\max_t |f(h_{t-1}, x_t) - h_t|$ is at most
# $10^{-12} \max(1, \max|h|)$ (float64).

# %%
TOL = 1e-12  # deer's default tolerance in float64


@partial(jax.jit, static_argnums=(0, 1))
def iteration(step, method, p, gs, h, lam):
    """One Newton (DEER / quasi-DEER) or damped Newton (ELK / quasi-ELK) iteration from
    the guess ``h`` (T, H); returns the new guess and its residual ``|r_t|`` per step."""
    f = jax.vmap(lambda hp, g: step(p, hp, g))
    prev = jnp.concatenate([h_init[None], h[:-1]])  # h_{t-1}^{(i)}
    fs = f(prev, gs)
    jac = jax.vmap(jax.jacfwd(lambda hp, g: step(p, hp, g)))(prev, gs)  # (T, H, H)
    diag = jnp.diagonal(jac, axis1=1, axis2=2)
    if method == "deer":
        new = dense_linear_recurrence(jac, fs - jnp.einsum("tij,tj->ti", jac, prev), h_init)
    elif method == "quasi-deer":
        new = linear_recurrence(diag, fs - diag * prev, h_init, parallel=True)
    else:  # the damped step: a Kalman smoother (section 4)
        quasi = method == "quasi-elk"
        new = elk_step(diag if quasi else jac, fs, prev, h, lam, diagonal=quasi)
    res = jnp.abs(f(jnp.concatenate([h_init[None], new[:-1]]), gs) - new).max(axis=1)
    return new, res


def newton(method, step=gru_step, p=layer, g=gs, max_iter=200, tol=TOL, keep_going=False):
    """Iterate from zeros with deer's stopping rule; ELK accepts a step only if it lowers
    the merit sum_t |r_t|^2 (the damping lam / 10 after an accepted step, x 10 after a
    rejected one, as statseq's solver). Returns the trajectory, the residual after each
    iteration and whether it converged. ``keep_going``: do not stop at a non-finite
    residual (section 5 reads the finite early steps of overflowing iterates)."""
    h = jnp.zeros((g.shape[0], H))
    res = np.abs(np.asarray(jax.vmap(lambda hp, x: step(p, hp, x))(
        jnp.concatenate([h_init[None], h[:-1]]), g) - h)).max(axis=1)
    merit, lam, history = float(np.sum(res ** 2)), jnp.float64(1.0), []
    for _ in range(max_iter):
        new, new_res = iteration(step, method, p, g, h, lam)
        new_res = np.asarray(new_res)
        if method in ("elk", "quasi-elk"):
            accept = bool(np.isfinite(new_res).all() and np.sum(new_res ** 2) < merit)
            lam = lm_update(lam, accept)
            if accept:
                h, res, merit = new, new_res, float(np.sum(new_res ** 2))
        else:
            h, res = new, new_res
        history.append(res)
        if res.max() <= tol * max(1.0, float(jnp.max(jnp.abs(h)))):
            return h, np.array(history), True
        if not (keep_going or np.isfinite(res.max())):
            break
    return h, np.array(history), False


METHODS = ("deer", "quasi-deer", "elk", "quasi-elk")
if SMOKE:  # the tests' fast mode compiles DEER and quasi-DEER only
    METHODS = METHODS[:2]
solved = {m: newton(m) for m in METHODS}

# %% [markdown]
# **The log-likelihood by each solver.** The model itself takes the solver as an option:
# `ss.GRU(hidden_dim=8, evaluation="elk")` evaluates every whole, fully observed sequence
# (`log_prob`, `fit_sgd`) by that solver, and falls back to the sequential scan, with a
# warning, if the solver does not converge within `evaluation_max_iter` iterations. We set
# `evaluation_max_iter` to the number of iterations our loop above needed: had statseq's
# solver needed one more, it would have warned (the check below fails on any such
# warning) and returned the sequential value.

# %%
ll_seq = float(ss.log_prob(model, params, y))
rows = [dict(method="sequential", **{"log-likelihood": ll_seq, "|diff|": 0.0,
                                     "iterations": np.nan, "residual": np.nan,
                                     "converged": True})]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for m in METHODS:
        h, history, converged = solved[m]
        solver_model = dataclasses.replace(model, evaluation=m,
                                           evaluation_max_iter=len(history))
        ll = float(ss.log_prob(solver_model, params, y))
        rows.append(dict(method=m, **{
            "log-likelihood": ll, "|diff|": abs(ll - ll_seq), "iterations": len(history),
            "residual": history[-1].max(), "converged": converged,
            "max |h - h_seq|": float(jnp.max(jnp.abs(h - h_seq)))}))
fallbacks = [str(w.message) for w in caught if "did not converge" in str(w.message)]
table = pd.DataFrame(rows).set_index("method")
with pd.option_context("display.float_format", "{:.3g}".format):
    print(table.to_string())

LL_TOL = 1e-8  # float64: a log-likelihood of ~1,100 nats agrees to ~1e-11 relative
assert not fallbacks, fallbacks
assert table["converged"].all()
assert (table["|diff|"] < LL_TOL).all(), table["|diff|"]
assert (table["max |h - h_seq|"].dropna() < 1e-10).all()
it = table["iterations"]
assert it["deer"] < it["quasi-deer"] and it.get("elk", 0) < it.get("quasi-elk", 1)
assert 0 <= it.get("elk", it["deer"]) - it["deer"] <= 4 and it["quasi-deer"] >= 2 * it["deer"]
assert it["deer"] <= 10

# %% [markdown]
# Every solver reproduces the sequential log-likelihood to better than $10^{-8}$ nats
# (the column `|diff|`; the trajectories agree to $10^{-10}$), and the model's solver
# converged within the iterations of our loop (no fallback warning). DEER needs the
# fewest iterations: its full Jacobians give Newton's quadratic convergence, and a
# contractive cell forgets the zero initial guess quickly. The diagonal solvers need
# several times more, because a diagonal Jacobian is a poorer linearization (linear
# convergence), although each of their iterations is far cheaper
# ($O(TH)$ against $O(TH^3)$). ELK takes a few more iterations than DEER: its first steps
# are damped towards the current guess.
#
# ## 3. The residual, iteration by iteration

# %%
fig, ax = plt.subplots(figsize=(8, 3.6))
for m, marker in zip(METHODS, "osD^", strict=False):  # (2 in smoke mode)
    r = solved[m][1].max(axis=1)
    ax.semilogy(np.arange(1, r.size + 1), r, marker=marker, ms=4, label=m)
ax.axhline(TOL, color="k", ls=":", lw=0.8, label="tolerance")
ax.set(xlabel="iteration", ylabel=r"residual $\max_t |f(h_{t-1}, x_t) - h_t|$",
       title=f"Newton on the fitted GRU's trajectory (T = {T})")
ax.legend(fontsize=8)
plt.show()

deer_res = solved["deer"][1].max(axis=1)
qdeer_res = solved["quasi-deer"][1].max(axis=1)
# quadratic convergence: DEER's last steps square the residual (exponent ~ 2)
orders = np.log(deer_res[-2:]) / np.log(deer_res[-3:-1])
print("DEER's last residuals:", np.array2string(deer_res[-3:], precision=2),
      "; log r_(i+1) / log r_i:", np.round(orders, 2))
rates = qdeer_res[1:] / qdeer_res[:-1]
print(f"quasi-DEER: median residual ratio per iteration {np.median(rates):.2f}")
assert deer_res[-2] < deer_res[-3] ** 1.5  # superlinear
assert 0.1 < np.median(rates) < 0.95  # linear

# %% [markdown]
# DEER's residual falls slowly for a few iterations, while the guess is far from the
# solution, then collapses: each of the last steps roughly squares it (Newton's quadratic
# convergence; the printed ratio $\log r_{i+1} / \log r_i$ is close to 2 before rounding
# stops it). Quasi-DEER's falls by a roughly constant factor per iteration (the printed
# median ratio): linear convergence. ELK's first steps are damped (its $\lambda$ starts
# at 1 and shrinks tenfold with every accepted step), after which it behaves like DEER.
#
# ## 4. The ELK step is a Kalman smoother
#
# Undamped Newton steps can be wild: on an expansive or chaotic cell the linear recursion
# multiplies Jacobians along the trajectory and the iterates overflow. ELK replaces the
# Newton step by a Levenberg-Marquardt step, the minimizer of the linearized residual plus
# a penalty for moving away from the current guess:
#
# $$h^{(i+1)} = \arg\min_h \; \sum_t |h_t - J_t h_{t-1} - b_t|^2
# + \lambda \sum_t |h_t - h^{(i)}_t|^2 .$$
#
# Read the two sums as the two halves of a log-density. The first is
# $-2 \log p(h)$ (up to a constant) for the **linear Gaussian state space model**
#
# $$h_t = J_t h_{t-1} + b_t + w_t, \qquad w_t \sim \mathcal{N}(0, I),$$
#
# whose dynamics matrices are the Jacobians, and the second is $-2 \log p(y \mid h)$ for
# pseudo-observations that are the current guess seen with noise $1/\lambda$,
#
# $$y_t = h^{(i)}_t + v_t, \qquad v_t \sim \mathcal{N}(0, I / \lambda).$$
#
# So the ELK step is the mode of a Gaussian posterior, which is its mean: exactly what
# the Kalman smoother of vignette 03 computes (section 2 there smooths the Nile's level
# with a $1 \times 1$ state; here the state has $H = 8$ entries and $T$ time steps).
# statseq uses its parallel (associative-scan) Kalman smoother,
# `statseq.inference.kalman_parallel.parallel_kalman_smoother`, so ELK keeps DEER's
# $O(\log T)$ depth. In `iteration` above the whole step is the line
#
# ```python
# new = elk_step(jac, fs, prev, h, lam, diagonal=False)
# ```
#
# and quasi-ELK (`diagonal=True`) runs $H$ independent scalar smoothers. As
# $\lambda \to 0$ the observations become uninformative and the step is DEER's; as
# $\lambda \to \infty$ it stays at the guess. The damping adapts (Levenberg-Marquardt):
# a step is accepted only if it lowers $\sum_t |r_t|^2$ (then $\lambda$ is divided by
# 10), else rejected ($\lambda$ multiplied by 10), so the merit never increases.
#
# **Checking it.** The minimization is also a sparse linear least-squares problem: with
# $A$ the block lower-bidiagonal matrix of the linearized residual ($I$ on the diagonal,
# $-J_t$ below it), the minimizer solves the normal equations
# $(A^\top A + \lambda I)\, h = A^\top c + \lambda h^{(i)}$ ($c_t = b_t$, with $J_0 h_{-1}$
# added to $c_0$). SciPy solves them directly; we compare with one Kalman-smoother step
# from the zero guess at $\lambda = 1$, and check the two limits.

# %%
guess = jnp.zeros((T, H))


def step_from_guess(method, lam):
    """One step of ``method`` from the zero guess (the same compiled `iteration`)."""
    return np.asarray(iteration(gru_step, method, layer, gs, guess, jnp.float64(lam))[0])


deer_step = step_from_guess("deer", 1.0)
jac, b = jax.jit(lambda p: (  # the J_t and b_t of the zero guess, for the direct solve
    jax.vmap(jax.jacfwd(lambda hp, g: gru_step(p, hp, g)), (None, 0))(h_init, gs),
    jax.vmap(lambda g: gru_step(p, h_init, g))(gs)))(layer)  # (b_t = f(0, x_t) here)
jac_np, b_np = np.asarray(jac), np.asarray(b)
steps = np.arange(1, T)[:, None, None]  # block (t, t-1) of A holds -J_t
rows_i = np.broadcast_to(steps * H + np.arange(H)[None, :, None], (T - 1, H, H))
cols_j = np.broadcast_to((steps - 1) * H + np.arange(H)[None, None, :], (T - 1, H, H))
A = sp.eye(T * H, format="csr") - sp.csr_matrix(
    (jac_np[1:].ravel(), (rows_i.ravel(), cols_j.ravel())), shape=(T * H, T * H))
c = b_np.reshape(-1).copy()
c[:H] += jac_np[0] @ np.asarray(h_init)
lsq = spsolve((A.T @ A + sp.eye(T * H)).tocsc(), A.T @ c + np.asarray(guess).reshape(-1))
if "elk" in METHODS:  # always, except in the tests' smoke mode (DEER and quasi-DEER)
    gap_lsq = np.max(np.abs(lsq.reshape(T, H) - step_from_guess("elk", 1.0)))
    gap_small = np.max(np.abs(step_from_guess("elk", 1e-10) - deer_step))
    gap_large = np.max(np.abs(step_from_guess("elk", 1e10) - np.asarray(guess)))
    print(f"Kalman smoother vs sparse least squares (lambda = 1): max |diff| = {gap_lsq:.1e}")
    print(f"lambda = 1e-10: max |ELK step - DEER step| = {gap_small:.1e}")
    print(f"lambda = 1e10:  max |ELK step - guess| = {gap_large:.1e}")
    assert gap_lsq < 1e-10 and gap_small < 1e-6 and gap_large < 1e-8

# %% [markdown]
# The Kalman smoother and the direct sparse solve agree to rounding, and the two limits
# are DEER's step and no step at all: the ELK step is exactly the regularized
# least-squares problem above, solved as a state space smoothing problem.
#
# ## 5. When does parallel evaluation work? The Lyapunov exponent
#
# Newton's linear recursions multiply the Jacobians along the trajectory, so their
# conditioning is governed by how fast the cell amplifies perturbations: its **largest
# Lyapunov exponent**
#
# $$\lambda_{\max} = \lim_{T \to \infty} \frac{1}{T} \log | J_{T-1} \cdots J_1 J_0 v |,$$
#
# estimated along a trajectory by `statseq.inference.lyapunov.lyapunov_exponent`
# (Benettin's power iteration, with Jacobian-vector products). When $\lambda_{\max} < 0$
# the cell forgets perturbations, an error in the guess at one time dies out a few steps
# later, and DEER's number of iterations stays flat (at most $O(\log T)$) as $T$ grows.
# When $\lambda_{\max} > 0$ (chaos) the Newton system is ill-conditioned like
# $e^{\lambda_{\max} T}$ and the iterations grow with $T$ up to DEER's worst case $T$:
# no parallel method beats the sequential scan on an unpredictable system (Gonzalez et
# al., 2025).
#
# **Scaling the GRU's weights does not make it chaotic.** Multiplying the fitted
# recurrent weights by a factor drives the gates into saturation rather than making the
# cell unstable:

# %%
lyap_fitted = float(lyapunov_exponent(gru_step, layer, h_init, gs))
scales = (1.0, 2.0, 4.0, 8.0, 16.0)
gru_scaled = pd.Series(
    {s: float(lyapunov_exponent(gru_step, layer._replace(w_rec=s * layer.w_rec), h_init, gs))
     for s in scales}, name="largest Lyapunov exponent")
gru_scaled.index.name = "scale of the GRU's recurrent weights"
print(f"fitted GRU: largest Lyapunov exponent {lyap_fitted:.3f} per month")
print(gru_scaled.round(3).to_string())
assert lyap_fitted < -0.1 and (gru_scaled[gru_scaled.index <= 4] < -0.1).all()
assert gru_scaled.max() < 0.05  # near zero at most: never clearly chaotic

# %% [markdown]
# The fitted cell is clearly contractive (a perturbation shrinks by a factor
# $e^{\lambda_{\max}}$ per month on average), and so are its versions with weights scaled
# by 2 and 4; with larger scales the exponent approaches zero but does not become clearly
# positive: a GRU's gates saturate, and saturated gates have small derivatives. For a
# chaotic cell we therefore take the classic one, an Elman cell
# $h_t = \tanh(g W h_{t-1} + 0.5\, u\, y_{t-1})$ with a random $8 \times 8$ matrix $W$
# (entries $\mathcal{N}(0, 1/8)$) and random $u$, driven by the same sunspot series: its
# gain $g$ is the scaled weight. With $g = 1$ it is contractive, with $g = 3$ chaotic
# (the table below prints both exponents). We write it as a GRU whose reset gate is held
# open and update gate shut (then $h_t = n_t$), so that it runs through the same
# compiled programs as the fitted network, and check one step against the plain cell.
#
# **Iterations against $T$.** DEER is causal: iteration $i$ on the first $T'$ steps
# computes exactly the first $T'$ entries of iteration $i$ on all $T$ steps (each
# $J_t$, $b_t$ and each prefix of the scan depends only on earlier steps). So one run
# over the whole series gives the number of iterations DEER needs for every prefix
# length $T'$: the first iteration whose residual over the prefix is at most $10^{-12}$
# (the states of these cells lie in $(-1, 1)$, so this is deer's rule) and finite.

# %%
W = jax.random.normal(jax.random.key(1), (H, H)) / np.sqrt(H)
u = jax.random.normal(jax.random.key(2), (H,))
drive = 0.5 * jnp.asarray(xs[:, :1]) * u  # (T, H): the Elman cell's input u y_{t-1}
SHUT = 40.0  # sigmoid(-40) = 4e-18: a gate held shut (and at +40, held open)


def elman_as_gru(gain):
    """The Elman cell tanh(gain W h + u y_{t-1}) as a GRU whose reset gate is held open
    and update gate shut (then h_t = n_t): the same step function, so the same compiled
    programs."""
    p = layer._replace(w_rec=jnp.concatenate([jnp.zeros((2 * H, H)), gain * W]),
                       bias_rec=jnp.zeros(H))
    g = jnp.concatenate([jnp.full((T, H), SHUT), jnp.full((T, H), -SHUT), drive], axis=1)
    return p, g


elman_1, elman_3 = elman_as_gru(1.0), elman_as_gru(3.0)
h_elman = jax.lax.scan(lambda h, x: (jnp.tanh(3.0 * W @ h + x),) * 2, h_init, drive)[1]
prev_elman = jnp.concatenate([h_init[None], h_elman[:-1]])  # one step from every state:
gap_elman = float(jnp.max(jnp.abs(h_elman - jax.vmap(  # (a whole chaotic trajectory
    lambda h, g: gru_step(elman_3[0], h, g))(prev_elman, elman_3[1]))))  # would amplify
print(f"Elman step vs the GRU step with gates held: max |diff| = {gap_elman:.1e}")  # ulps)
assert gap_elman < 1e-14


def iterations_by_length(history, lengths, tol=TOL):
    """DEER's iterations for each prefix length from one run's residuals (iteration, t)."""
    out = {}
    for n in lengths:
        prefix = history[:, :n]
        done = np.isfinite(prefix).all(axis=1) & (np.nan_to_num(prefix, nan=np.inf)
                                                  .max(axis=1) <= tol)
        out[n] = int(np.argmax(done)) + 1 if done.any() else np.nan
    return out


lengths = [n for n in (10, 30, 100, 300, 1000, 3177) if n <= T]
cells = {"fitted GRU": (layer, gs), "Elman, g = 1": elman_1, "Elman, g = 3": elman_3}
sweep = {}
for name, (p, g) in cells.items():
    if name == "fitted GRU":
        history = solved["deer"][1]  # section 2's run
    else:
        history = newton("deer", p=p, g=g, max_iter=CHAOTIC_CAP, keep_going=True)[1]
    lyap = float(lyapunov_exponent(gru_step, p, h_init, g))
    sweep[name] = {"Lyapunov exponent": lyap, **iterations_by_length(history, lengths)}
sweep = pd.DataFrame(sweep).T
sweep.columns = ["Lyapunov exponent"] + [f"T = {n}" for n in lengths]
print(f"DEER iterations to converge by sequence length (nan: not within "
      f"{CHAOTIC_CAP} iterations)")
print(sweep.round(3).to_string())

fig, ax = plt.subplots(figsize=(7, 3.6))
for name, marker in zip(sweep.index, "osD", strict=True):
    ax.loglog(lengths, sweep.loc[name].iloc[1:].to_numpy(float), marker=marker,
              label=f"{name} (λ = {sweep.loc[name, 'Lyapunov exponent']:.2f})")
ax.loglog(lengths, lengths, "k:", lw=0.8, label="T iterations (DEER's worst case)")
ax.set(xlabel="sequence length T", ylabel="DEER iterations",
       title="Predictable cells converge in a few iterations, chaotic ones do not")
ax.legend(fontsize=8)
plt.show()

its = sweep.drop(columns="Lyapunov exponent")
contractive = sweep["Lyapunov exponent"] < 0
assert contractive["fitted GRU"] and contractive["Elman, g = 1"]
assert not contractive["Elman, g = 3"]
# predictable cells: at most a dozen iterations at every length, almost flat in T
assert (its[contractive] <= 12).all(axis=None)
assert (its[contractive].iloc[:, -1] - its[contractive].iloc[:, 0] <= 6).all()
# the chaotic cell: the iterations grow with T, to a large fraction of T, then exceed the cap
chaos = its.loc["Elman, g = 3"]
finite = chaos.dropna().to_numpy()
assert np.all(np.diff(finite) > 0) and finite[-1] >= 0.5 * lengths[finite.size - 1]
assert chaos.isna().any()

# %% [markdown]
# The table says it plainly. The two contractive cells (negative exponents) converge in
# a handful of iterations at every length, with at most a few more at 3,177 steps than at
# 10: the iteration count is flat in $T$, well within the $O(\log T)$ of the theory. The
# chaotic cell (positive exponent) needs more iterations the longer the sequence, a large
# fraction of $T$ (DEER's worst case, $T$ iterations, is the dotted line), and beyond a
# few hundred steps it does not converge within the cap at all: rounding errors grow like
# $e^{\lambda_{\max} T}$, and for a long enough chaotic sequence even float64 Newton
# cannot pin the trajectory down (statseq's solver then reports `converged=False` and the
# model falls back to the sequential scan). ELK keeps such iterations finite but cannot
# make them fast: no parallel method beats the scan on an unpredictable system.
#
# ## 6. What it costs on this CPU, and what a GPU changes
#
# Parallel depth pays only with parallel hardware. On a CPU the sequential scan does
# $O(T H^2)$ work in $T$ cheap steps, while every DEER iteration does $O(T H^3)$ work
# (and a few iterations are needed): we time the compiled log-likelihood of the fitted
# GRU both ways.

# %%
deer_model = dataclasses.replace(model, evaluation="deer",  # the table's (compiled) model
                                 evaluation_max_iter=int(table.loc["deer", "iterations"]))


def best_time(fn, repeats=5):
    fn()  # compiled already; one warm call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


t_seq = best_time(lambda: ss.log_prob(model, params, y).block_until_ready())
t_deer = best_time(lambda: ss.log_prob(deer_model, params, y).block_until_ready())
print(f"{jax.default_backend().upper()}, T = {T}: sequential {t_seq * 1e3:.2f} ms, "
      f"DEER {t_deer * 1e3:.2f} ms ({t_deer / t_seq:.1f} times the sequential time)")
if jax.default_backend() == "cpu":
    assert 2 * t_seq < t_deer

# %% [markdown]
# On this CPU the sequential scan is several times faster (the numbers printed above): the
# machine has no parallel width to spend on the associative scan's extra work, which is
# why statseq's default (`evaluation=None`) is the sequential scan on a CPU.
#
# On a GPU the balance flips, because a sequential step costs a few kernel launches
# whatever its size, while a DEER iteration over all $T$ steps is a handful of wide
# kernels. statseq's benchmark (`benchmarks/bench_deer.py`), **measured on one NVIDIA
# H100 in float32** and quoted from `benchmarks/RESULTS.md` ("DEER on a GPU"), not run
# here, for a GRU with $H = 16$ and $T = 10^4$, one sequence:
#
# | GRU, H = 16, T = 10^4 (H100, float32) | sequential | DEER | quasi-DEER | ELK |
# |---|---|---|---|---|
# | forward, run time | 55.1 ms | 0.71 ms (78x faster, 3 iterations) | 0.84 ms (66x faster, 9 iterations) | 98 ms (1.7x slower, 5 iterations) |
# | value and gradient | 375 ms | 0.90 ms (417x faster) | 73.7 ms (5.1x faster) | – |
#
# (DEER's paper reports 68x for a GRU at $T = 10^4$ on a V100.) That is why
# `evaluation=None` picks DEER on a GPU for $T \geq 1000$. The gradient is implicit: the
# adjoint of the converged trajectory is one more linear recursion, solved by a reverse
# associative scan, so training gains even more than evaluation. ELK's Kalman smoother is
# the price of its robustness: on this contractive cell plain DEER is the right choice.
#
# ## Conclusions
#
# * A GRU's likelihood on 3,177 months is the same number, to $10^{-8}$ nats, whether the
#   trajectory comes from the sequential scan or from DEER, quasi-DEER, ELK or quasi-ELK;
#   in statseq the choice is one option, `evaluation=`, and a solver that fails falls
#   back to the scan rather than return a wrong answer.
# * DEER converges quadratically in a handful of iterations on the fitted network; the
#   diagonal (quasi) solvers need several times more, each far cheaper.
# * An ELK step is a Kalman smoother over a linear Gaussian state space model whose
#   dynamics are the Jacobians and whose observations are the current guess with noise
#   $1/\lambda$ (checked against the direct least-squares solution).
# * Whether any of this can be fast is decided by the cell's largest Lyapunov exponent:
#   negative (the fitted GRU, and any scaling of its weights we tried), and DEER's
#   iterations stay flat in $T$; positive (a chaotic Elman cell), and they grow with $T$
#   until the parallel method is useless.
# * On a CPU the sequential scan is faster; on a GPU (measured on an H100) DEER is
#   tens to hundreds of times faster at $T = 10^4$.
