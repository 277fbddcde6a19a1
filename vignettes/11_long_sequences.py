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
# # Long sequences: parallel scans, sweeps over blocks, float32, truncated BPTT, and what a GPU changes
#
# A filter is a recursion, $c_t = f(c_{t-1}, y_t)$, and a recursion over $T$ steps has
# $T$ sequential steps: `jax.lax.scan` runs them one after the other. For HMMs and linear
# Gaussian state space models the recursion can be rewritten as a product of $T$
# *associative* elements, which `jax.lax.associative_scan` evaluates in $O(\log T)$
# sequential depth, at the cost of more total work ($O(T K^3)$ for a $K$-state HMM
# against $O(T K^2)$; Hassan, Särkkä and García-Fernández, 2021, *IEEE Trans. Signal
# Processing* 69; Särkkä and García-Fernández, 2021, *IEEE Trans. Automatic Control*
# 66(1), for the Kalman filter and smoother). statseq has both: `parallel=True` or
# `False` on `filter_states` and `smoother` of HMMs and state space models, the
# associative scans in `statseq.inference.hmm_parallel` and `kalman_parallel`.
#
# This tutorial asks five questions about long series:
#
# 1. do the parallel and sequential filters give the same log-likelihood and the same
#    gradient (float64)?
# 2. how does the float32 error grow with $T$?
# 3. what do the two cost on a CPU (measured here), and what does a GPU change (measured
#    by statseq's GPU benchmark on an H100, quoted from `benchmarks/RESULTS.md`)?
# 4. how can the *sequential* recursion itself run faster on a CPU, by sweeps over
#    blocks that exploit the filter's forgetting of its start?
# 5. how to train a recurrent network on one long series with truncated
#    backpropagation through time (BPTT) over windows.
#
# All data here are **simulated** from known models, so the true log-likelihood is
# available as a reference.

# %%
import os
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # numpyro's tqdm import

import jax  # noqa: E402
import jax.flatten_util  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.inference import hmm as hmm_seq  # noqa: E402
from statseq.inference import hmm_parallel, kalman, kalman_parallel  # noqa: E402
from statseq.inference.sweeps import default_block_length, sweep_scan  # noqa: E402
from statseq.models.hmm.gaussian import GaussianEmissions  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64 by default; float32 where asked
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests
T_MAX = 4_000 if SMOKE else 30_000  # the longest series
T_GRID = [100, 1_000, T_MAX] if SMOKE else [100, 1_000, 10_000, T_MAX]
T_GRAD = 1_000  # gradients are compared at this length
NUM_SGD_STEPS = 20 if SMOKE else 200
T_TRAIN = 1_000 if SMOKE else 4_000
rng = np.random.default_rng(0)

# %% [markdown]
# ## Two models and their simulated data
#
# A three-state Gaussian HMM, and a two-dimensional linear Gaussian state space model
# (a noisy observation of the sum of a damped oscillation's two states). We simulate with
# NumPy, which is quick for one long path.

# %%
hmm = ss.GaussianHMM(num_states=3)
trans = np.array([[0.95, 0.04, 0.01], [0.03, 0.94, 0.03], [0.01, 0.04, 0.95]])
hmm_params = ss.HMMParams(
    jnp.ones(3) / 3, jnp.asarray(trans),
    GaussianEmissions(jnp.array([[-1.0], [0.0], [1.5]]), jnp.array([[[0.3]], [[0.4]], [[0.5]]])))
cum = np.cumsum(trans, axis=1)
draws = rng.uniform(size=T_MAX)
z = np.zeros(T_MAX, int)
for t in range(1, T_MAX):  # the state path, by inverting each row's cdf
    z[t] = np.searchsorted(cum[z[t - 1]], draws[t])
y_hmm = (np.array([-1.0, 0.0, 1.5])[z] + np.sqrt([0.3, 0.4, 0.5])[z]
         * rng.normal(size=T_MAX))[:, None]

ssm = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
rot = 0.97 * np.array([[np.cos(0.2), -np.sin(0.2)], [np.sin(0.2), np.cos(0.2)]])
ssm_params = ssm.default_params()._replace(
    dynamics_weights=jnp.asarray(rot), dynamics_cov=0.1 * jnp.eye(2),
    emission_weights=jnp.ones((1, 2)), emission_cov=0.5 * jnp.eye(1))
noise = rng.normal(size=(T_MAX, 2))
states = np.zeros((T_MAX, 2))
states[0] = noise[0]  # x_1 ~ N(0, I), the default initial law
for t in range(1, T_MAX):
    states[t] = rot @ states[t - 1] + np.sqrt(0.1) * noise[t]
y_ssm = states.sum(axis=1) + np.sqrt(0.5) * rng.normal(size=T_MAX)
print(f"HMM series {y_hmm.shape}, state space series {y_ssm.shape}")

# %% [markdown]
# ## 1. Same numbers, float64
#
# `filter_states(..., parallel=True)` (or `False`) is the user-facing switch; it calls the
# inference functions `statseq.inference.hmm_parallel.hmm_filter` and
# `kalman_parallel.parallel_kalman_filter` (or their sequential twins), which we call
# directly here so that we can differentiate through them below. The model supplies their
# inputs: `log_likelihoods` (the `(T, K)` emission table) for the HMM, `to_arrays` (the
# state space matrices) for the Kalman filter.

# %%
def hmm_loglik(params, y, parallel):
    ll = hmm.log_likelihoods(params, y, jnp.ones(y.shape, bool))
    lib = hmm_parallel if parallel else hmm_seq
    return lib.hmm_filter(hmm.initial_probs(params), params.transitions, ll)


def ssm_loglik(params, y, parallel):
    arrays = ssm.to_arrays(params)
    y2 = y[:, None]
    mask = jnp.ones(y2.shape, bool)
    inputs = jnp.zeros((y.shape[0], 0), y.dtype)
    fn = kalman_parallel.parallel_kalman_filter if parallel else kalman.kalman_filter
    return fn(arrays, y2, mask, inputs)


filters = {  # (name, parallel) -> jitted (params, y) -> filter result
    (name, par): jax.jit(lambda p, y, f=f, par=par: f(p, y, par))
    for name, f in [("HMM", hmm_loglik), ("Kalman", ssm_loglik)] for par in (False, True)}
setups = {"HMM": (hmm_params, y_hmm), "Kalman": (ssm_params, y_ssm)}
results64 = {key: fn(setups[key[0]][0], jnp.asarray(setups[key[0]][1]))
             for key, fn in filters.items()}
agree = {}
for name in setups:
    seq, par = (float(results64[name, p].marginal_log_lik) for p in (False, True))
    agree[name] = abs(par - seq) / abs(seq)
    print(f"{name:>6}, T = {T_MAX}: sequential {seq:.8f}, parallel {par:.8f}, "
          f"relative difference {agree[name]:.1e}")
assert max(agree.values()) < 1e-12
# the user-facing switch gives the same number (checked on the first 1000 steps)
short = float(hmm.filter_states(hmm_params, y_hmm[:1000], parallel=True).marginal_log_lik)
assert abs(short - float(jnp.sum(results64["HMM", False].log_normalizers[:1000]))) < 1e-9

# %% [markdown]
# Gradients: fitting by gradient ascent differentiates through the filter, so the
# derivatives of the two scans must agree too. Fitting works in unconstrained
# coordinates (`ss.to_unconstrained`: log-Cholesky factors for covariances, stick-breaking
# for probability vectors), so we differentiate $\log p(y_{1:T})$ with respect to those,
# by reverse mode through the inference functions (the model's `log_likelihoods` /
# `to_arrays` build their inputs). The unconstrained coordinates matter: a covariance
# matrix is symmetric, and one implementation may read its upper triangle where another
# reads the lower, so gradients with respect to the raw matrix entries differ by an
# antisymmetric part that no fit ever moves along.

# %%
grads = {
    (name, par): jax.jit(jax.grad(lambda x, y, f=f, m=m, par=par: f(
        ss.from_unconstrained(m, x), y, par).marginal_log_lik))
    for name, f, m in [("HMM", hmm_loglik, hmm), ("Kalman", ssm_loglik, ssm)]
    for par in (False, True)}
models = {"HMM": hmm, "Kalman": ssm}
grad_gap = {}
# (smoke mode, for the test suite: the HMM only; the Kalman gradients run the same code)
for name, (params, y) in list(setups.items())[:1 if SMOKE else None]:
    x = ss.to_unconstrained(models[name], params)
    g_seq, g_par = (jax.flatten_util.ravel_pytree(grads[name, par](x, y[:T_GRAD]))[0]
                    for par in (False, True))
    grad_gap[name] = float(jnp.max(jnp.abs(g_par - g_seq)) / jnp.max(jnp.abs(g_seq)))
    print(f"{name:>6}, T = {T_GRAD}: {g_seq.size} partial derivatives; largest difference "
          f"{grad_gap[name]:.1e} of the largest |gradient| {float(jnp.max(jnp.abs(g_seq))):.1f}")
assert max(grad_gap.values()) < 1e-10

# %% [markdown]
# ## 2. float32: how the error grows with $T$
#
# On accelerators float32 is the fast type. We run both filters once in float32 and once
# in float64 on the longest series. Both filters are causal, so the per-step
# log-densities $\log p(y_t \mid y_{<t})$ of one run give the log-likelihood of every
# prefix $y_{1:T}$. Two sources of error are separated:
#
# * the **per-step** error of each $\log p(y_t \mid y_{<t})$: the filter forgets its
#   past, so rounding errors do not compound from step to step;
# * the **accumulation** of $T$ terms into the total. statseq sums them as a balanced
#   binary tree (pairwise summation, error growing like $\log T$); a running total in
#   float32 (`cumsum`) has an error growing like $T$.

# %%
def to32(tree):
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)


per_step = {}
for name, (params, y) in setups.items():
    for par in (False, True):
        r64 = results64[name, par]
        r32 = filters[name, par](to32(params), jnp.asarray(y, jnp.float32))
        assert r32.marginal_log_lik.dtype == jnp.float32
        lp = "log_normalizers" if name == "HMM" else "log_probs"
        per_step[name, par] = (np.asarray(getattr(r64, lp)), np.asarray(getattr(r32, lp)),
                               float(r64.marginal_log_lik), float(r32.marginal_log_lik))

rows = []
print(f"{'model':>6} {'scan':>10} {'T':>7} {'max step err':>12} {'pairwise rel':>12} "
      f"{'cumsum rel':>10}")
for (name, par), (lp64, lp32, _, _) in per_step.items():
    for t_len in T_GRID:
        exact = lp64[:t_len].sum()
        step_err = np.abs(lp32[:t_len].astype(float) - lp64[:t_len]).max()
        pairwise = abs(float(np.sum(lp32[:t_len], dtype=np.float32)) - exact) / abs(exact)
        running = abs(float(np.cumsum(lp32[:t_len], dtype=np.float32)[-1]) - exact) / abs(exact)
        rows.append((name, par, t_len, step_err, pairwise, running))
        print(f"{name:>6} {'parallel' if par else 'sequential':>10} {t_len:>7} "
              f"{step_err:>12.1e} {pairwise:>12.1e} {running:>10.1e}")
for (name, par), (_, _, ll64, ll32) in per_step.items():
    print(f"{name}, {'parallel' if par else 'sequential'}: statseq's own float32 total at "
          f"T = {T_MAX} is off by {abs(ll32 - ll64) / abs(ll64):.1e} (relative)")
    assert abs(ll32 - ll64) / abs(ll64) < 1e-5
rows = np.array([(r[2], r[3], r[4], r[5]) for r in rows]).reshape(4, len(T_GRID), 4)

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharex=True)
labels = [f"{n}, {'parallel' if p else 'sequential'}" for (n, p) in per_step]
for k, label in enumerate(labels):
    axes[0].loglog(rows[k, :, 0], rows[k, :, 1], "o-", label=label)
    axes[1].loglog(rows[k, :, 0], rows[k, :, 2], "o-", color=f"C{k}", label=f"{label}, pairwise")
    axes[1].loglog(rows[k, :, 0], rows[k, :, 3], "x--", color=f"C{k}", label=f"{label}, cumsum")
axes[1].loglog(rows[0, :, 0], np.finfo(np.float32).eps * rows[0, :, 0], "k:", lw=1,
               label="T x float32 eps")
axes[0].set(xlabel="series length T", ylabel="largest per-step error (nats)",
            title="float32 error of log p(y_t | y_<t)")
axes[1].set(xlabel="series length T", ylabel="relative error of log p(y_1:T)",
            title="float32 error of the total")
axes[0].legend(fontsize=7)
axes[1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
fig.tight_layout()
plt.show()

# the prose below: per-step errors stay small at every T; pairwise sums beat running sums
growth = rows[:, -1, 1] / rows[:, 1, 1]  # largest per-step error, T_MAX against T = 1000
assert np.all(rows[:, :, 1] < 1e-5) and np.all(growth < 10)
assert np.all(rows[:, -1, 2] < rows[:, -1, 3])

# %% [markdown]
# The largest per-step error stays below $10^{-5}$ nats at every length (it grows by
# less than a factor of ten from $T = 1000$ to the longest series; table above): in these
# stable models the filter forgets, so float32 rounding does not compound along the
# series, in the sequential scan or the parallel one. The error of the *total* then
# depends on how the terms are added: summed pairwise (as statseq does) the relative
# error stays near float32's resolution, while a running float32 sum drifts further as
# $T$ grows (right panel). Two cautions. A filter that forgets slowly (a near-unit-root
# state, a very sticky HMM) or one with nearly singular covariances loses more in
# float32; `square_root=True` on state space models propagates Cholesky factors for that
# case. And gradients are sums over time too: for fitting long series in float32,
# compare a float32 fit with a float64 one before trusting it.
#
# ## 3. What they cost on this CPU (measured here)
#
# We time the calls a user makes, `filter_states(params, y, parallel=...)` on the longest
# series, each compiled once and then timed as the best of three runs. For the state
# space model the sequential default is not the plain Kalman recursion: with complete data
# and fixed matrices statseq switches to the steady-state filter once the covariance has
# converged (`statseq.inference.kalman_steady`), so we also time the plain covariance-form
# recursion (`kalman.kalman_filter`, compiled above). **These are CPU timings on the
# machine that ran this notebook, not GPU timings; on a busy machine they are noisy.**

# %%
def best_time(fn, *args, repeats=3, **kwargs):
    jax.block_until_ready(fn(*args, **kwargs))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args, **kwargs))
        times.append(time.perf_counter() - start)
    return min(times)


timing = {
    ("HMM", "sequential (default on CPU; section 4)"): best_time(
        hmm.filter_states, hmm_params, y_hmm, parallel=False),
    ("HMM", "parallel"): best_time(hmm.filter_states, hmm_params, y_hmm, parallel=True),
    ("Kalman", "sequential, steady state (default on CPU)"): best_time(
        ssm.filter_states, ssm_params, y_ssm, parallel=False),
    ("Kalman", "sequential, covariance form every step"): best_time(
        filters["Kalman", False], ssm_params, jnp.asarray(y_ssm)),
    ("Kalman", "parallel"): best_time(ssm.filter_states, ssm_params, y_ssm, parallel=True),
}
print(f"backend: {jax.default_backend()}; T = {T_MAX}")
for (name, how), sec in timing.items():
    print(f"{name:>6}  {how:<42} {sec * 1e3:8.2f} ms")
for name in ("HMM", "Kalman"):
    default = next(v for (n, how), v in timing.items() if n == name and "default" in how)
    ratio = timing[name, "parallel"] / default
    print(f"{name}: parallel / default = {ratio:.1f} "
          f"({'slower' if ratio > 1 else 'faster'} on this {jax.default_backend().upper()})")

# %% [markdown]
# The ratios printed above are this machine's, in the run that produced this page, and
# they depend on the machine and on its load. The benchmarks in `benchmarks/RESULTS.md`,
# timed on a quiet 2-core CPU, found the parallel HMM filter 3 to 7 times *slower* than
# the sequential one for $T = 10^3$ to $10^6$ ($K = 2$): the associative scan does more
# arithmetic ($O(T K^3)$ against $O(T K^2)$ for the HMM), and its $O(\log T)$ depth
# only pays when many processors evaluate the elements of a level at once. That is why
# `parallel=None` (the default) picks the sequential recursion on CPU and the associative
# scan on GPU and TPU (`statseq.inference._backend.use_parallel`); where speed matters, time
# both on your own hardware and pass `parallel=` explicitly. (On CPU, from $2^{13}$ steps,
# the HMM's sequential recursion itself runs by sweeps over blocks: section 4.)
#
# ## What a GPU changes (measured on an H100, not in this notebook)
#
# This page is built on a CPU, so the timings above cannot show a GPU. statseq's GPU
# benchmark (`benchmarks/bench_gpu.py`, run on one NVIDIA H100 with jax 0.11.2 in float32;
# full tables and raw results in `benchmarks/RESULTS.md`, section "On a GPU") timed the
# same inference code at $T = 10^5$:
#
# | workload ($T = 10^5$, float32, H100) | sequential `lax.scan` | associative scan | speed-up |
# |---|---|---|---|
# | HMM filter, $K = 2$ | 812 ms | 0.41 ms | about 2000× |
# | HMM filter, $K = 16$ | 823 ms | 1.5 ms | about 550× |
# | HMM smoother, $K = 2$ | 1.37 s | 10.3 ms | about 130× |
# | Kalman filter, 4 states, 2 outputs | 5.8 s | 8.0 ms | about 720× |
# | Kalman smoother, same model | 10.0 s | 10.4 ms | about 960× |
#
# Two things happen at once. The associative scan's $O(\log T)$ depth finally has the
# parallel width it needs, and the sequential scan becomes *slower per step* than on a
# CPU: each step of a `lax.scan` on a GPU costs a few kernel launches (8 µs for the HMM
# filter, 58 µs for the Kalman filter), whatever the size of the step. So on a GPU the
# question is not whether to use the parallel filters but only for how short a series
# they still pay; at $T = 10^4$ the HMM filter was already 120 to 180 times faster in
# parallel, and shorter series were not measured. `parallel=None` picks the associative
# scan on GPUs and TPUs for this reason. The float32 results of the parallel scans
# differed from the sequential ones by at most $8.5 \times 10^{-7}$ relative, in line
# with section 2. Särkkä and García-Fernández (2021) and Hassan, Särkkä and
# García-Fernández (2021) report the same shape of result for their parallel Kalman and
# HMM smoothers. These are one run's figures on one device; time your own hardware
# (`python benchmarks/bench_gpu.py` runs unchanged on CPU or GPU).

# %% [markdown]
# ## 4. Sweeps over blocks: the sequential filter, about $\sqrt{T}$ blocks at once
#
# On this CPU the associative scan lost to the sequential one: it does more arithmetic,
# and a CPU has no spare width to spend it on. But the sequential scan is not free
# either: XLA's CPU loop pays a fixed cost per iteration (tens to hundreds of
# nanoseconds, whatever the step computes), $T$ times. A third way keeps the sequential
# recursion, and its arithmetic, and pays that cost only about $2\sqrt{T}$ times. It rests
# on one property of the HMM filter: **the normalized forward message forgets where it
# started**. Two filters run on the same data from different initial messages soon carry
# the same message, and from then on compute the same numbers.
#
# Here is that property on the simulated series: the filter from the model's initial law
# (uniform over the three states) against filters started with certainty in each state,
# with their total-variation distance $\frac12 \sum_k |p(z_t = k \mid y_{\le t}) -
# \tilde p(z_t = k \mid y_{\le t})|$ on a log scale. The distance is plotted until it is
# exactly zero, i.e. until the two messages are equal bit for bit.

# %%
N_FORGET = 80  # steps shown
pi_true = hmm.initial_probs(hmm_params)  # the model's initial law (uniform)
ll_hmm = hmm.log_likelihoods(hmm_params, jnp.asarray(y_hmm), jnp.ones(y_hmm.shape, bool))
short_filter = jax.jit(hmm_seq.hmm_filter)  # one compilation for the four starts
truth = np.asarray(short_filter(pi_true, hmm_params.transitions,
                                ll_hmm[:N_FORGET]).filtered_probs)
fig, ax = plt.subplots(figsize=(6.5, 3.5))
identical_from = {}
for k in range(3):
    start = jnp.zeros(3).at[k].set(1.0)  # certain to start in state k
    other = np.asarray(short_filter(start, hmm_params.transitions,
                                    ll_hmm[:N_FORGET]).filtered_probs)
    tv = 0.5 * np.abs(other - truth).sum(axis=1)
    same = np.all(other == truth, axis=1)
    identical_from[k] = int(np.argmax(same)) if same.any() else None
    # once equal bit for bit, the same step keeps them equal
    assert identical_from[k] is not None and same[identical_from[k]:].all()
    ax.semilogy(np.where(tv > 0, tv, np.nan), "o-", ms=3,
                label=f"started in state {k}: identical from t = {identical_from[k]}")
ax.set(xlabel="time step t", ylabel="total-variation distance to\nthe filter from the initial law",
       title="The HMM filter forgets its start", xlim=(-1, max(identical_from.values()) + 2))
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
print("first step from which the messages are equal bit for bit:", identical_from)

# %% [markdown]
# Whatever the start, the distance falls geometrically, and after a few dozen steps it
# is not merely small but zero: the messages agree to the last bit (every value is
# printed above). `statseq.inference.sweeps.sweep_scan` turns this into an algorithm:
#
# 1. cut the series into $B$ blocks of $L \approx \sqrt{T}$ steps and run all blocks at
#    once (one loop of $L$ iterations, each step vectorized over the blocks), the first
#    block from the true start and every other one from a guess;
# 2. sweep again, every block starting where its left neighbour ended. A block whose
#    message coincides bit for bit with the previous sweep's at a check point (every 32
#    steps) would repeat that sweep's numbers exactly, so it stops there: a second sweep
#    costs only the few dozen steps it takes to forget;
# 3. when a whole sweep changes no block's end, every block started from its
#    neighbour's true end, so by induction from the first block every output is what
#    the sequential scan computes. If that has not happened after `max_sweeps` (4)
#    sweeps, the sequential scan recomputes the result: the output is never an
#    approximation.
#
# `sweep_scan(step, init, xs)` takes the same step function as `jax.lax.scan`. We write
# the filter's step (carry $p(z_t \mid y_{<t})$; emit $p(z_t \mid y_{\le t})$ and the
# normalizer), run it both ways on the whole simulated series and compare.

# %%
def forward_step(transitions):
    """The HMM filter as a recursion: carry p(z_t | y_<t), emit p(z_t | y_<=t) and the
    normalizer, given lik_t = p(y_t | z_t) scaled by exp(-max_k log p(y_t | z_t = k))."""
    def step(predicted, lik_t):
        joint = predicted * lik_t
        norm = jnp.sum(joint)
        filtered = joint / norm
        return filtered @ transitions, (filtered, norm)

    return step


shift = jnp.max(ll_hmm, axis=1)  # scaled likelihoods never overflow
lik = jnp.exp(ll_hmm - shift[:, None])
by_scan = jax.jit(lambda a, lik: jax.lax.scan(forward_step(a), pi_true, lik)[1])
by_sweeps = jax.jit(lambda a, lik: sweep_scan(forward_step(a), pi_true, lik))


def compare(transitions):
    """Run the filter step by lax.scan and by sweeps: the SweepInfo, the outputs' largest
    absolute difference (filtered probabilities and log normalizers), the fraction of
    filtered probabilities equal bit for bit, and the log-likelihood by sweeps."""
    filt_seq, norm_seq = by_scan(transitions, lik)
    (filt_sw, norm_sw), info = by_sweeps(transitions, lik)
    gap = max(float(jnp.max(jnp.abs(filt_sw - filt_seq))),
              float(jnp.max(jnp.abs(jnp.log(norm_sw) - jnp.log(norm_seq)))))
    identical = float(jnp.mean(filt_sw == filt_seq))
    loglik = float(jnp.sum(jnp.log(norm_sw) + shift))
    return info, gap, identical, loglik


block = default_block_length(T_MAX)
info, gap, identical, loglik_sweeps = compare(hmm_params.transitions)
print(f"T = {T_MAX}: {-(-T_MAX // block)} blocks of L = {block} steps")
print(f"sweeps run: {int(info.sweeps)}, converged: {bool(info.converged)}")
print(f"largest |sweeps - sequential scan|: {gap:.1e}; {identical:.1%} of the filtered "
      "probabilities equal bit for bit")
reference = float(results64["HMM", False].marginal_log_lik)
print(f"log-likelihood by sweeps {loglik_sweeps:.8f}, statseq's hmm_filter {reference:.8f}")
assert bool(info.converged) and gap < 1e-12
assert abs(loglik_sweeps - reference) < 1e-12 * abs(reference)

# %% [markdown]
# The sweeps converged, and their outputs equal the sequential scan's to rounding (about
# half of the entries to the last bit, printed above; the rest differ in the last bit or
# two because XLA rounds a step vectorized over blocks a little differently from the
# same step alone), and the log-likelihood is statseq's own `hmm_filter`'s.
#
# **The fallback.** A chain that never moves, $A = I$, never forgets: the filter is then
# the posterior of one fixed state given everything seen so far, and a block started
# from a guess keeps its guess's trace to the end of the block. Its carries do not meet
# the true ones (each sweep carries the true start only one block further), the sweeps
# do not converge, and `sweep_scan` falls back on the sequential scan:

# %%
info_stuck, gap_stuck, _, _ = compare(jnp.eye(3))
print(f"A = I: sweeps run: {int(info_stuck.sweeps)}, converged: {bool(info_stuck.converged)}, "
      f"largest |sweeps - sequential scan|: {gap_stuck:.1e}")
assert not bool(info_stuck.converged) and gap_stuck < 1e-12

# %% [markdown]
# The result is still the sequential scan's (to rounding, as above); what is lost is
# time (four wasted sweeps before the sequential pass). `hmm_filter` uses the sweeps by
# default on CPU from `statseq.inference.hmm.SWEEP_MIN_STEPS` ($2^{13}$) steps
# (`hmm.use_sweeps`), and the sequential scan below that and on GPUs and TPUs.
#
# **What it costs on this CPU.** We time the three forms of the same filter on
# simulated series of increasing length: the sequential scan, the sweeps, and the
# associative scan of section 1, for the three-state model above and (in the full run) a
# six-state one with the same kind of Gaussian emissions. Each is compiled once and timed
# as the best of five runs, given the table of emission log-likelihoods, whose own cost
# (column "table", computed by the model's `log_likelihoods`) a public call such as
# `filter_states` adds to the filter's. **These are
# CPU timings on the machine that ran this notebook; they depend on the machine and its
# load, and a GPU changes them completely (section 3).**

# %%
rng_long = np.random.default_rng(4)  # its own stream: section 5's data stay as they were


def simulate_gaussian_hmm(trans, means, variances, n):
    """A path of n steps of a univariate Gaussian HMM started from the uniform law."""
    cum = np.cumsum(trans, axis=1)
    draws = rng_long.uniform(size=n)
    z = np.zeros(n, int)
    z[0] = rng_long.integers(len(means))
    for t in range(1, n):
        z[t] = np.searchsorted(cum[z[t - 1]], draws[t])
    return (np.asarray(means)[z] + np.sqrt(variances)[z] * rng_long.normal(size=n))[:, None]


def filter_by(how):
    """A jitted (initial_probs, transitions, log_likelihoods) -> filter result."""
    def run(pi, a, ll):
        if how == "associative scan":
            return hmm_parallel.hmm_filter(pi, a, ll)
        # the library's filter with its path forced (`hmm_filter` picks by `use_sweeps`)
        return hmm_seq._filter(pi, a, None, ll, sweeps=how == "sweeps")

    return jax.jit(run)


HOWS = ("sequential scan", "sweeps", "associative scan")
fns = {how: filter_by(how) for how in HOWS}
T_TIMED = [T_MAX] if SMOKE else [3_000, 30_000, 300_000]
trans6 = 0.9 * np.eye(6) + 0.1 / 6
means6, variances6 = np.linspace(-2.5, 2.5, 6), np.full(6, 0.5)
hmm6_params = ss.HMMParams(
    jnp.ones(6) / 6, jnp.asarray(trans6),
    GaussianEmissions(jnp.asarray(means6)[:, None], jnp.asarray(variances6)[:, None, None]))
cases = [(3, hmm_params, trans, [-1.0, 0.0, 1.5], [0.3, 0.4, 0.5])]
if not SMOKE:  # (smoke mode: the three-state model only)
    cases.append((6, hmm6_params, trans6, means6, variances6))
emission_table = jax.jit(  # the (T, K) table log p(y_t | z_t = k), for any K
    lambda params, y: ss.GaussianHMM(num_states=params.transitions.shape[0]).log_likelihoods(
        params, y, jnp.ones(y.shape, bool)))
sweep_rows = []
for k, params, a, means, variances in cases:
    y_long = jnp.asarray(simulate_gaussian_hmm(a, means, variances, max(T_TIMED)))
    for t_len in T_TIMED:
        ll = emission_table(params, y_long[:t_len])
        args = (params.initial_probs, params.transitions, ll)
        results = {how: fn(*args) for how, fn in fns.items()}
        for how in HOWS[1:]:  # the same log-likelihood by all three
            exact = float(results[HOWS[0]].marginal_log_lik)
            assert abs(float(results[how].marginal_log_lik) - exact) < 1e-12 * abs(exact)
        sweep_rows.append((k, t_len, best_time(emission_table, params, y_long[:t_len]),
                           *(best_time(fns[how], *args, repeats=5) for how in HOWS)))
print(f"backend: {jax.default_backend()} (these are CPU timings only when this says cpu); "
      "best of 5, ms")
print(f"{'K':>2} {'T':>7} {'table':>7} {'sequential':>10} {'sweeps':>7} {'associative':>11} "
      f"{'sweeps/seq':>10} {'assoc/seq':>9}  hmm_filter's default")
for k, t_len, table, seq, sw, par in sweep_rows:
    print(f"{k:>2} {t_len:>7} {table * 1e3:>7.2f} {seq * 1e3:>10.2f} {sw * 1e3:>7.2f} "
          f"{par * 1e3:>11.2f} {sw / seq:>10.2f} {par / seq:>9.2f}  "
          f"{'sweeps' if hmm_seq.use_sweeps(t_len) else 'sequential scan'}")
for k in sorted({row[0] for row in sweep_rows}):
    ratios = [sw / seq for kk, _, _, seq, sw, _ in sweep_rows if kk == k]
    tables = [table / seq for kk, _, table, seq, _, _ in sweep_rows if kk == k]
    print(f"K = {k}: sweeps / sequential {min(ratios):.2f} to {max(ratios):.2f}; the emission "
          f"table costs {min(tables):.1f} to {max(tables):.1f} times the sequential filter")

# %% [markdown]
# Three things can be read off the table (the ratios on its last lines are the ones to
# compare; absolute times depend on this machine and its load):
#
# * **the associative scan is the slowest form in every row**, several times slower than
#   the sequential scan: on a CPU its extra arithmetic ($O(K^3)$ per step against
#   $O(K^2)$) is not repaid (section 3);
# * **the sweeps' gain depends on what one iteration of the sequential loop costs.** At
#   six states XLA:CPU's sequential filter step is slow (hundreds of nanoseconds; most of
#   it is the loop's overhead for a body of that size, per `benchmarks/RESULTS.md`), and
#   the sweeps, which pay that overhead about $2\sqrt{T}$ times instead of $T$ times, take
#   a small fraction of its time at every length; at three states the sequential step is
#   already cheap (under a hundred nanoseconds) and the gain is smaller.
#   `benchmarks/RESULTS.md` (section "Session 20: recursions that forget, by sweeps over
#   blocks", a quiet 2-core CPU) found the same pattern over 2 to 16 states: sweeps /
#   sequential 0.14 and 0.17 at 6 states, 0.5-0.6 at 2 and 16 states ($T = 10^5$ and
#   $10^6$). `hmm_filter` switches to the sweeps at $2^{13}$ steps whatever the number of
#   states, a compromise across $K$: at six states they already win at the shortest length
#   timed here;
# * **the emission table can cost more than any form of the filter.** The model's
#   `log_likelihoods` (a Gaussian density per state and step) is computed before the
#   recursion in every public call, and here it costs as much as the sequential filter or
#   more; once the filter runs by sweeps, a public call such as `filter_states` spends most
#   of its time on the table, not on the recursion.
#
# The sweeps are a CPU technique: on a GPU the associative scan wins by orders of
# magnitude (section 3), and `hmm_filter` leaves the GPU path alone.
#
# ## 5. Training an RNN on one long series: truncated BPTT
#
# An RNN has no associative form: its hidden state is a nonlinear recursion, so the
# gradient of $\log p(y_{1:T})$ backpropagates through all $T$ steps one by one, and every
# optimizer step costs a full pass over the series. **Truncated BPTT** cuts the series
# into windows (`ss.make_windows`), filters each from the initial state and lets
# gradients flow only within a window; a `warmup` at the start of each window drives the
# hidden state but is not scored, and minibatches of windows (`batch_size`) make each
# optimizer step cheap. The price is that the network cannot learn dependencies longer
# than a window.
#
# We simulate a long AR(2) series with a ten-step cycle (**simulated**: the true model
# gives the best attainable log score) and fit a small GRU both ways, with the same
# number of optimizer steps.

# %%
def simulate_ar2(n):
    out = np.zeros(n + 100)
    eps = rng.normal(size=n + 100)
    for t in range(2, n + 100):
        out[t] = 1.5 * out[t - 1] - 0.75 * out[t - 2] + eps[t]
    return out[100:]


y_train, y_test = simulate_ar2(T_TRAIN), simulate_ar2(1_000)
true_ar = ss.AR(order=2)
true_params = ss.ARParams(jnp.array([[[1.5]], [[-0.75]]]), jnp.zeros(1), jnp.zeros((1, 0)),
                          jnp.eye(1))
true_score = float(ss.log_prob(true_ar, true_params, y_test)) / (y_test.size - 2)

gru = ss.GRU(hidden_dim=8)
start = gru.initialize(y_train, key=jax.random.key(0))
adam = optax.adam(1e-2)
full = ss.fit_sgd(gru, start, y_train, optimizer=adam, num_steps=NUM_SGD_STEPS,
                  key=jax.random.key(1), progress=False)
windows = ss.make_windows(y_train, length=64, warmup=16)
tbptt = ss.fit_sgd(gru, start, optimizer=adam, num_steps=NUM_SGD_STEPS,
                   key=jax.random.key(1), batch_size=16, progress=False,
                   **windows.fit_kwargs())
print(f"{windows.y.shape[0]} windows of 64 steps (16 warmup); 16 windows per step")
scores = {"start": start, "full BPTT": full.params, "truncated BPTT": tbptt.params}
per_step_score = {k: float(ss.log_prob(gru, p, y_test)) / y_test.size
                  for k, p in scores.items()}
print(f"held-out log score per step: true AR(2) {true_score:.4f}, " + ", ".join(
    f"{k} {v:.4f}" for k, v in per_step_score.items()))
print(f"wall time including compilation: full BPTT {full.wall_time:.1f} s, "
      f"truncated BPTT {tbptt.wall_time:.1f} s ({NUM_SGD_STEPS} steps each)")

ax = ss.plot_traces({"full BPTT (whole series)": full})
ax.set(xlabel="optimizer step", ylabel="log p(y_train) per fit's objective")
plt.show()

# %% [markdown]
# The two traces are not on one scale (the full objective scores all $T$ steps at once,
# a window minibatch about 16 x 48), so we compare the fits on held-out data instead: the
# per-step log score of a separate simulated series, against the true model's.

# %%
fig, ax = plt.subplots(figsize=(6, 3))
names = list(per_step_score)
ax.bar(names, [per_step_score[k] - true_score for k in names], color=["0.6", "C0", "C3"])
ax.axhline(0, color="k", lw=1)
ax.set(ylabel="held-out log score per step\nminus the true model's (nats)",
       title="GRU fits of a simulated AR(2) series")
plt.show()
gap_full = true_score - per_step_score["full BPTT"]
gap_tbptt = true_score - per_step_score["truncated BPTT"]
assert per_step_score["truncated BPTT"] > per_step_score["start"]
assert per_step_score["full BPTT"] > per_step_score["start"]
if not SMOKE:  # the prose below, for the full run
    assert gap_full < 0.05 and gap_tbptt < 0.05
    assert tbptt.wall_time < full.wall_time

# %% [markdown]
# With the same number of optimizer steps, both fits come within 0.05 nats per step of
# the true model on held-out data, and the windowed fit takes less time: each of its
# steps backpropagates through 16 windows of 64 steps instead of the whole series.
# Windows of 64 steps are long enough here because the AR(2)'s memory is a few cycles of
# ten steps; for a series whose predictive depends on the far past, the windows (or at
# least their warmup) must be longer than that dependence.
#
# ## Conclusion
#
# The parallel (associative-scan) and sequential filters of HMMs and linear Gaussian
# state space models give the same log-likelihoods (to about $10^{-12}$ relative) and
# the same gradients in float64. In float32 the per-step error stays near float32
# resolution at every length we tried, because these filters forget; the total is
# accurate because statseq sums it pairwise, where a running sum drifts with $T$. CPU
# timings of both are printed above (CPU only, and noisy on a shared machine); the
# default picks the sequential scan on CPU. Sweeps over blocks run that sequential
# recursion as about $\sqrt{T}$ blocks at once, using the fact that the HMM filter forgets
# its start (bit for bit after a few dozen steps here); they equal the sequential scan to
# rounding (about $10^{-15}$), fall back on it when the chain never forgets ($A = I$), and
# in the CPU timings above took a fraction of its time at six states, with less of a gain
# at three. On an H100 (statseq's benchmark, not this notebook) the parallel scans were 130 to 2000 times faster than the sequential ones at
# $T = 10^5$, and the default picks them there. For RNNs, which have no associative form,
# truncated BPTT over windows reaches the same held-out score as full BPTT here at lower
# cost. What remains uncertain: the float32 results are for well-conditioned, quickly
# forgetting models, and the GPU figures are from one run on one device, at
# $T = 10^4$ and $10^5$ only: how short a series still gains on a GPU was not measured.
