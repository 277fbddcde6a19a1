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
# # HMMs are RNNs: earthquake counts with a Poisson hidden Markov model
#
# A hidden Markov model (HMM) is usually drawn as a latent variable model: a Markov chain
# of hidden states $z_t \in \{1, \dots, K\}$, with transition matrix
# $A_{ij} = p(z_{t+1} = j \mid z_t = i)$, and observations that depend only on the current
# state. For counts the natural choice is a Poisson emission with one rate per state,
#
# $$y_t \mid z_t = k \sim \mathrm{Poisson}(\lambda_k).$$
#
# This tutorial reads the same model the way statseq does, as an *autoregressive*
# likelihood computed by a recurrent network whose hidden state is a probability vector,
# and then uses that view on real data: the annual number of major (magnitude 7 and above)
# earthquakes worldwide, 1900-2006, the running example of Zucchini and MacDonald's
# *Hidden Markov Models for Time Series* (2009).
#
# The sections are:
#
# 1. the HMM as a recurrent network (filtered and predicted state probabilities);
# 2. the gradient trick: the forward-backward smoother is the gradient of $\log p(y)$;
# 3. EM and gradient ascent on one objective;
# 4. choosing the number of states;
# 5. decoding the hidden states;
# 6. forecasts with uncertainty, and a held-out check;
# 7. checking the model with pseudo-residuals;
# 8. uncertainty on the parameters: standard errors and a parametric bootstrap.

# %%
import os
import warnings

# numpyro imports tqdm.auto, which warns in a notebook kernel without ipywidgets; statseq
# shows no progress bars here (progress=False), so that warning does not concern us.
warnings.filterwarnings("ignore", message="IProgress not found")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from scipy.stats import poisson  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.inference.hmm import hmm_filter, hmm_smoother_by_gradient  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64, so that comparisons show rounding only
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests
NUM_SGD_STEPS = 200 if SMOKE else 600
NUM_RESTARTS = 3 if SMOKE else 10
NUM_SAMPLES = 300 if SMOKE else 4000
EM_ITERS, EM_TOL = 500, 1e-10

quakes = ss.datasets.load_earthquakes()
y = quakes.to_numpy()
years = quakes.index.to_numpy()
lag1 = np.corrcoef(y[:-1], y[1:])[0, 1]
print(f"{y.size} years, {years[0]}-{years[-1]}: mean {y.mean():.3f}, "
      f"variance {y.var(ddof=1):.3f}, lag-1 autocorrelation {lag1:.3f}")

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(years, y, "k.-", lw=0.8)
ax.set(xlabel="year", ylabel="count", title="Major earthquakes (magnitude 7+) per year")
plt.show()

# %% [markdown]
# A single Poisson distribution has its variance equal to its mean; here the variance is
# more than twice the mean, and successive years are correlated. Both point to a rate
# that itself changes slowly over time, which is what an HMM with a few persistent
# states describes: the counts are a mixture of Poissons (overdispersion), and the
# mixture weights move with a Markov chain (serial dependence).
#
# We start from a 2-state model whose initial state is drawn from the stationary law of
# the chain (`initial="stationary"`, as in Zucchini and MacDonald), fitted by EM.
# Fitting is the subject of section 3; for now we only need parameters.

# %%
model = ss.PoissonHMM(num_states=2, initial="stationary")
start = model.initialize(y, key=jax.random.key(0))  # rates from data quantiles, sticky A
em = ss.fit_em(model, start, y, num_iters=EM_ITERS, tol=EM_TOL, progress=False)
params = em.params
rates = np.asarray(params.emissions.rates)
A = np.asarray(params.transitions)
pi = np.asarray(model.initial_probs(params))  # the stationary law of A
print(f"rates lambda = {rates.round(3)}")
print(f"transition matrix A =\n{A.round(4)}")
print(f"stationary law pi = {pi.round(4)};  log p(y) = {em.final_log_joint:.4f}")

# %% [markdown]
# ## 1. The HMM as a recurrent network
#
# By the chain rule, $\log p(y_{1:T}) = \sum_t \log p(y_t \mid y_{1:t-1})$. For an HMM each
# one-step predictive is a mixture over the state we are in now,
#
# $$p(y_t \mid y_{1:t-1}) = \sum_{k=1}^{K} \alpha_t(k)\, l_t(k), \qquad
# \alpha_t(k) = p(z_t = k \mid y_{1:t-1}), \qquad l_t(k) = p(y_t \mid z_t = k),$$
#
# and the vector $\alpha_t$ (the normalized forward message) obeys a fixed recursion:
# condition on $y_t$ by Bayes' rule, then move one step along the chain,
#
# $$f_t = \frac{\alpha_t \odot l_t}{\alpha_t^{\top} l_t}, \qquad
# \alpha_{t+1} = f_t A, \qquad \alpha_1 = \pi$$
#
# (probability vectors are rows here, and the rows of $A$ sum to one).
#
# Two probability vectors appear, and they answer different questions:
#
# * the **predicted** probabilities $\alpha_t = p(z_t \mid y_{1:t-1})$, the belief about
#   year $t$ *before* its count is seen;
# * the **filtered** probabilities $f_t = p(z_t \mid y_{1:t})$, the belief *after* it.
#
# Both are causal: they use only the past and present. This is a recurrent neural network
# with a $K$-dimensional hidden state, input $y_t$ (entering through the likelihoods
# $l_t$), weights $(A, \lambda)$, and a multiplicative update followed by a
# normalization in place of the usual squashing function. Its output is the predictive
# distribution of the next count. Here is the cell in NumPy:

# %%
def hmm_cell(alpha, y_t):
    """One step: predicted probs in; log p(y_t | past), filtered and next predicted out."""
    lik = poisson.pmf(y_t, rates)  # l_t(k) = p(y_t | z_t = k)
    norm = alpha @ lik  # p(y_t | y_{1:t-1})
    filtered = alpha * lik / norm  # Bayes' rule: p(z_t | y_{1:t})
    return np.log(norm), filtered, filtered @ A  # alpha_{t+1} = f_t A


alpha = pi
cell_logp, cell_filtered, cell_predicted = [], [], []
for y_t in y:
    cell_predicted.append(alpha)
    logp, filtered, alpha = hmm_cell(alpha, y_t)
    cell_logp.append(logp)
    cell_filtered.append(filtered)
cell_logp, cell_filtered = np.array(cell_logp), np.array(cell_filtered)
cell_predicted = np.array(cell_predicted)
print(f"sum of log p(y_t | past) from the cell: {cell_logp.sum():.10f}")

# %% [markdown]
# statseq runs the same recurrence with `jax.lax.scan`. Its carry is the filtered vector
# $f_t$ (it applies $A$ at the start of the next step, the same RNN cut at a different
# point), so `ss.filter(..., return_carries=True).carries.probs` holds $f_t$ for every
# year. `model.filter_states` returns both the predicted and the filtered probabilities.

# %%
res = ss.filter(model, params, y, return_carries=True)
filt = model.filter_states(params, y)
checks = {
    "log p(y) total": abs(float(res.log_prob) - cell_logp.sum()),
    "log p(y_t | past), per year": np.max(np.abs(np.asarray(res.log_probs) - cell_logp)),
    "carries.probs vs filtered f_t": np.max(np.abs(np.asarray(res.carries.probs)
                                                   - cell_filtered)),
    "filter_states filtered_probs": np.max(np.abs(np.asarray(filt.filtered_probs)
                                                  - cell_filtered)),
    "filter_states predicted_probs": np.max(np.abs(np.asarray(filt.predicted_probs)
                                                   - cell_predicted)),
}
for name, err in checks.items():
    print(f"max |statseq - NumPy cell|, {name:<30} {err:.1e}")

# %%
high = int(np.argmax(rates))  # the index of the high-rate state
fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
axes[0].plot(years, y, "k.-", lw=0.8)
axes[0].set(ylabel="count")
axes[1].plot(years, cell_predicted[:, high], color="C1", lw=1,
             label=r"predicted $p(z_t = \mathrm{high} \mid y_{1:t-1})$")
axes[1].plot(years, cell_filtered[:, high], color="C0", lw=1.5,
             label=r"filtered $p(z_t = \mathrm{high} \mid y_{1:t})$")
axes[1].set(xlabel="year", ylabel="probability", ylim=(-0.03, 1.03))
axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the data
axes[0].set_title(f"2-state model: probability of the high-rate state "
                  rf"($\lambda$ = {rates[high]:.1f})", fontsize=10)
plt.show()

# %% [markdown]
# The predicted curve is the filtered one moved one step along the chain: pulled toward
# the stationary probability of the high state, $\pi_{\mathrm{high}}$, and unable to react
# to year $t$'s count until it has been seen.
#
# ## 2. The gradient trick: smoothing is backpropagation
#
# Filtering is causal. The **smoothed** probabilities $p(z_t \mid y_{1:T})$ use the whole
# series, later years included; the classical algorithm is forward-backward. There is a
# shortcut. Write $\ell_{tk} = \log p(y_t \mid z_t = k)$ and sum over all state paths,
#
# $$\log p(y_{1:T}) = \log \sum_{z_{1:T}} \pi_{z_1} \prod_{t=2}^{T} A_{z_{t-1} z_t}
# \prod_{t=1}^{T} \exp(\ell_{t z_t}).$$
#
# Differentiating with respect to $\ell_{tk}$ keeps exactly the paths with $z_t = k$, so
#
# $$\frac{\partial \log p(y_{1:T})}{\partial \ell_{tk}} = p(z_t = k \mid y_{1:T}),
# \qquad
# \frac{\partial \log p(y_{1:T})}{\partial \log A_{ij}} =
# \sum_{t} p(z_t = i, z_{t+1} = j \mid y_{1:T}).$$
#
# (The posterior over paths is an exponential family whose log normalizer is
# $\log p(y_{1:T})$, and gradients of a log normalizer are expected sufficient
# statistics.) So reverse-mode differentiation of the forward filter, that is,
# backpropagation through time in the RNN, *is* the backward pass of forward-backward.
#
# Below, the $(T, K)$ matrix of log-likelihoods is computed directly, the filter
# `statseq.inference.hmm.hmm_filter` turns it into $\log p(y)$, and `jax.grad` does the
# rest. The result is compared with forward-backward (`model.smoother`).

# %%
log_lik = poisson.logpmf(y[:, None], rates[None, :])  # (T, K): ell[t, k]


def log_marginal(log_lik, log_A):
    return hmm_filter(pi, jnp.exp(log_A), log_lik).marginal_log_lik


value, (grad_ll, grad_log_A) = jax.jit(jax.value_and_grad(log_marginal, argnums=(0, 1)))(
    log_lik, np.log(A))
post = model.smoother(params, y)  # forward-backward
packaged = jax.jit(hmm_smoother_by_gradient)(pi, A, log_lik)  # the same trick, packaged
print(f"log p(y): hmm_filter {float(value):.10f}, ss.log_prob "
      f"{float(ss.log_prob(model, params, y)):.10f}")
smooth_err = np.max(np.abs(np.asarray(grad_ll) - np.asarray(post.smoothed_probs)))
trans_err = np.max(np.abs(np.asarray(grad_log_A) - np.asarray(post.expected_transitions)))
print(f"max |d log p / d ell - smoothed probs|             = {smooth_err:.1e}")
print(f"max |d log p / d log A - expected transitions|     = {trans_err:.1e}")
print("max |hmm_smoother_by_gradient - forward-backward| = "
      f"{np.max(np.abs(np.asarray(packaged.smoothed_probs - post.smoothed_probs))):.1e}")
print(f"expected transition counts (rows: from, columns: to):\n"
      f"{np.asarray(post.expected_transitions).round(2)}")

# %%
fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True,
                         gridspec_kw={"height_ratios": [2, 1]})
axes[0].plot(years, cell_filtered[:, high], color="0.6", lw=1, label="filtered (causal)")
axes[0].plot(years, np.asarray(post.smoothed_probs)[:, high], color="C0", lw=2,
             label="smoothed, forward-backward")
axes[0].plot(years, np.asarray(grad_ll)[:, high], "o", color="C3", ms=2.5,
             label=r"smoothed, gradient $\partial \log p(y) / \partial \ell_{t,\mathrm{high}}$")
axes[0].set(ylabel="p(high-rate state)", ylim=(-0.03, 1.03))
axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the data
axes[1].plot(years, np.asarray(grad_ll)[:, high] - np.asarray(post.smoothed_probs)[:, high],
             color="C3", lw=1)
axes[1].set(xlabel="year", ylabel="gradient − F-B")
axes[1].ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
plt.show()

# %% [markdown]
# The two smoothers agree to rounding error (about $10^{-16}$ in float64). Where the
# smoothed curve departs from the filtered one, later years have changed the verdict about
# an earlier one: smoothing removes blips of the filtered curve that the following years
# do not confirm, and it moves switches earlier, since the first years of a new regime
# are only recognized in hindsight.
#
# ## 3. EM and gradient ascent on one objective
#
# Because the gradient of $\log p(y)$ contains the smoother, the two usual ways to fit an
# HMM use the same ingredients:
#
# * **EM** (`ss.fit_em`) computes the smoothed probabilities $\gamma_t(k)$ and expected
#   transition counts (E-step) and then *solves* for the parameters: for the rates in
#   closed form, $\lambda_k = \sum_t \gamma_t(k)\, y_t / \sum_t \gamma_t(k)$. With a
#   stationary initial law the transition update has no closed form, and statseq takes
#   gradient steps that are kept only if they improve the expected log joint, so EM still
#   never decreases the likelihood.
# * **Gradient ascent** (`ss.fit_sgd`) takes an optimizer step (here Adam) along the
#   gradient of $\log p(y)$ in an unconstrained parameterization (log rates, and a
#   stick-breaking map for each row of $A$).
#
# Both record the same objective, $\log p(y \mid \theta)$ (plus a log prior, none here),
# at every iteration, so their traces share an axis. We run both from the same start. A
# fit's `wall_time` includes compiling it, so each fit is then repeated (fastest of three
# runs), which reuses the compiled program, to measure the time per iteration.

# %%
def run_em():
    return ss.fit_em(model, start, y, num_iters=EM_ITERS, tol=EM_TOL, progress=False)


def run_sgd():
    return ss.fit_sgd(model, start, y, optimizer=optax.adam(0.05), num_steps=NUM_SGD_STEPS,
                      key=jax.random.key(1), progress=False)


sgd = run_sgd()  # em, the first EM call, was run above
em_again = min((run_em() for _ in range(3)), key=lambda fit: fit.wall_time)
sgd_again = min((run_sgd() for _ in range(3)), key=lambda fit: fit.wall_time)
best = max(em.final_log_joint, sgd.final_log_joint)


def iterations_to(fit, gap):
    """First iteration whose log joint is within ``gap`` of the best (None if never)."""
    trace = np.asarray(fit.log_joint)
    hits = np.flatnonzero(best - trace[np.isfinite(trace)] <= gap)
    return int(hits[0]) + 1 if hits.size else None


print("(to 1e-3: iterations until the log joint is within 1e-3 of the best value)")
print(f"{'method':>6} {'iters':>6} {'final log p(y)':>15} {'to 1e-3':>8} "
      f"{'1st call s':>10} {'compiled s':>10} {'ms/iter':>8}")
for name, first, again in [("EM", em, em_again), ("Adam", sgd, sgd_again)]:
    print(f"{name:>6} {first.num_iterations:>6} {first.final_log_joint:>15.6f} "
          f"{str(iterations_to(first, 1e-3)):>8} {first.wall_time:>10.2f} "
          f"{again.wall_time:>10.3f} {1e3 * again.wall_time / again.num_iterations:>8.3f}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
ss.plot_traces({"EM": em, "Adam (SGD)": sgd}, ax=axes[0], by="iteration", relative=True)
axes[0].set_xscale("log")
axes[0].set_title("per iteration", fontsize=10)
ss.plot_traces({"EM, first call": em, "Adam, first call": sgd,
                "EM, compiled": em_again, "Adam, compiled": sgd_again},
               ax=axes[1], by="time", relative=True)
for line, color, style in zip(axes[1].lines, ["C0", "C1", "C0", "C1"],
                              ["--", "--", "-", "-"], strict=True):
    line.set(color=color, linestyle=style)
axes[1].legend(fontsize=8)
axes[1].set_xscale("log")
axes[1].set_title("per wall-clock second (first call includes compilation)", fontsize=10)
for ax in axes:
    ax.set_ylim(1e-11, None)
plt.show()

# %% [markdown]
# The curves show the gap to the best log-likelihood on a log scale. Both methods reach
# the same maximum. Per iteration, EM gets within $10^{-3}$ of it in a couple of dozen
# iterations and then converges linearly until its tolerance stops it; Adam, with a
# learning rate picked by hand, needs several times more iterations and oscillates on the
# way. That is what the construction of the two methods leads one to expect: each EM
# iteration solves its M-step exactly, so it needs no step size and moves straight into
# the region of the maximum, and its slow linear phase begins only close to it, at a
# rate set by the fraction of missing information (Dempster, Laird and Rubin 1977,
# sec. 3); Zucchini, MacDonald and Langrock (2016, ch. 4) discuss the same trade-off
# between EM and direct maximization of the likelihood. Once
# compiled, an iteration of either costs a fraction of a millisecond to a few
# milliseconds on a CPU (last column, which also spreads each call's fixed overhead over
# its iterations), so the solid wall-clock curves tell the same story as the iteration
# counts.
#
# The first calls (dashed) are another matter. Their `wall_time` includes tracing and
# compiling, and `plot_traces(by="time")` spreads it evenly over the iterations, so the
# dashed curves are the solid ones stretched by the compile time: for a series this short
# nearly all of a first call is compilation, not fitting. statseq keeps compiled programs
# in a persistent cache, so a second run of this script spends much less time there.
#
# ## 4. How many states?
#
# EM finds a local maximum, so for each $K$ we fit from several starts with
# `ss.fit_restarts` (one data-driven start, the others random) and keep the best. We then
# compare the fits with information criteria, which penalize the $K^2$ free parameters of
# a stationary $K$-state Poisson HMM ($K$ rates and $K(K-1)$ transition probabilities):
#
# $$\mathrm{AIC} = -2 \log L + 2k, \qquad \mathrm{BIC} = -2 \log L + k \log n.$$

# %%
fits, table = {}, []
for k in range(1, 5):
    m = ss.PoissonHMM(num_states=k, initial="stationary")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restarts = ss.fit_restarts(m, y, key=jax.random.key(10 + k), num_restarts=NUM_RESTARTS,
                                   num_iters=EM_ITERS, tol=EM_TOL)
    fits[k] = (m, restarts.best)
    ic = ss.information_criteria(m, restarts.best.params, y)
    near = int(np.sum(restarts.final_log_joints >= restarts.best.final_log_joint - 0.01))
    table.append((k, ic, near, len(caught)))

print(f"{'K':>2} {'k':>3} {'log L':>10} {'AIC':>8} {'BIC':>8}  starts at best  warnings")
for k, ic, near, num_warnings in table:
    print(f"{k:>2} {ic['num_params']:>3} {ic['log_lik']:>10.4f} {ic['aic']:>8.2f} "
          f"{ic['bic']:>8.2f}  {near:>6} of {NUM_RESTARTS:<5} {num_warnings:>5}")
k_aic = min(table, key=lambda row: row[1]["aic"])[0]
k_bic = min(table, key=lambda row: row[1]["bic"])[0]
print(f"AIC picks K = {k_aic}; BIC picks K = {k_bic}")
assert k_aic == k_bic == 3  # "both criteria prefer three states", below

published = {2: 342.3183, 3: 329.4603}  # -log L, Zucchini & MacDonald (2009), Section 3.4
for k, value in published.items():
    ours, fit = -table[k - 1][1]["log_lik"], fits[k][1]
    print(f"K = {k}: -log L statseq {ours:.4f}, published {value:.4f}, "
          f"difference {ours - value:+.5f} (EM: {fit.num_iterations} iterations, "
          f"{'converged' if fit.converged else 'stopped at the cap'})")

# %% [markdown]
# Both criteria prefer three states. The single Poisson ($K = 1$) is far behind, as its
# variance cannot exceed its mean, and the fourth state buys too little likelihood for its
# seven extra parameters. The 2-state fit reproduces the maximum likelihood value that
# Zucchini and MacDonald published (found there by direct numerical maximization) to the
# printed precision. The 3-state fit comes within a few $10^{-4}$ of it: the likelihood
# surface is flat near this maximum, EM's linear convergence is slow there, and the best
# start is still creeping upward when it reaches the cap of 500 iterations.
# A "warning" above means that some random start ended with a state that no year
# belongs to; those starts lost to better ones. "starts at best" counts the starts that
# ended within 0.01 of the best log-likelihood: with more states, more starts get stuck.
#
# ## 5. Decoding the hidden states
#
# Two summaries of the hidden path: the smoothed probabilities $p(z_t = k \mid y_{1:T})$
# for each year separately, and the Viterbi path, the single most probable sequence of
# states, $\arg\max_{z_{1:T}} p(z_{1:T} \mid y_{1:T})$. They usually agree but need not:
# the most probable path is not always made of the most probable state of each year.

# %%
k_best = k_bic
best_model, best_params = fits[k_best][0], fits[k_best][1].params
order = np.argsort(np.asarray(best_params.emissions.rates))  # label states low to high
rates_k = np.asarray(best_params.emissions.rates)[order]
relabel = np.argsort(order)  # old state index -> new label
viterbi = relabel[np.asarray(best_model.most_likely_states(best_params, y))]
smoothed = np.asarray(best_model.smoother(best_params, y).smoothed_probs)[:, order]
print(f"{k_best}-state model, rates (low to high): {rates_k.round(2)}")
print("transition matrix (same order):\n"
      f"{np.asarray(best_params.transitions)[np.ix_(order, order)].round(3)}")
print(f"years per Viterbi state: {np.bincount(viterbi, minlength=k_best)}")
print(f"years where Viterbi differs from the per-year most probable state: "
      f"{int(np.sum(viterbi != smoothed.argmax(axis=1)))}")
first = np.r_[0, np.flatnonzero(np.diff(viterbi)) + 1]  # where each spell begins
last = np.r_[first[1:] - 1, y.size - 1]
print("spells of the Viterbi path:")
for a, b in zip(first, last, strict=True):
    print(f"  {years[a]}-{years[b]}  state {viterbi[a] + 1} (lambda = "
          f"{rates_k[viterbi[a]]:5.2f}), mean count {y[a:b + 1].mean():5.2f}")

fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True,
                         gridspec_kw={"height_ratios": [3, 2]})
axes[0].plot(years, y, "k.", ms=4, label="count")
axes[0].step(years, rates_k[viterbi], where="mid", color="C3", lw=1.5,
             label=r"$\lambda$ of the Viterbi state")
for rate in rates_k:
    axes[0].axhline(rate, color="0.7", lw=0.6, ls=":")
axes[0].set(ylabel="count")
axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the data
axes[1].stackplot(years, smoothed.T, step="mid", alpha=0.8,
                  labels=[f"state {i + 1} (λ = {r:.1f})" for i, r in enumerate(rates_k)])
axes[1].set(xlabel="year", ylabel="smoothed prob.", ylim=(0, 1), xlim=(years[0], years[-1]))
axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # the bands fill the panel
plt.show()

# %% [markdown]
# The model reads the century as a few long spells (listed above): most years in the
# middle state, a few short spells of the high-rate state, and the last quarter-century
# in the low-rate state. The smoothed probabilities show where the assignment is
# uncertain, mostly at the switches and in years whose counts sit between two rates.
#
# ## 6. Forecasts with uncertainty
#
# The state distribution $h$ years after the last observation is exact and cheap,
# $p(z_{T+h} \mid y_{1:T}) = f_T A^h$ (`model.predict_states`), and so is the predictive
# distribution of each future count, a finite mixture of Poissons,
#
# $$p(y_{T+h} \mid y_{1:T}) = \sum_{k} p(z_{T+h} = k \mid y_{1:T})\,
# \mathrm{Poisson}(y_{T+h} \mid \lambda_k)$$
#
# (`model.predict_observations`). Its quantiles come from the cumulative distribution
# evaluated on a grid of counts. `ss.forecast` instead simulates whole future paths,
# which gives the *joint* distribution over the horizon (for sums or maxima over several
# years, for example); its per-year quantiles should match the exact ones up to Monte
# Carlo error.

# %%
HORIZON = 10
GRID = np.arange(0, 151)  # counts 0..150; the probability beyond is printed below


@jax.jit  # numpyro distributions are pytrees, so one compiled program evaluates them
def mixture_table(mix, grid):
    return mix.log_prob(grid[:, None]), mix.mean  # (grid, h) log-pmf, (h,) means


def exact_predictive(model, params, history, level=0.9):
    """Mean, central interval and log-pmf table of the exact h-step predictive mixtures."""
    mix = model.predict_observations(params, history, num_steps=HORIZON)
    log_pmf, mean = (np.asarray(a) for a in mixture_table(mix, jnp.asarray(GRID, float)))
    cdf = np.cumsum(np.exp(log_pmf), axis=0)
    lower = GRID[np.argmax(cdf >= (1 - level) / 2, axis=0)]  # smallest c: P(Y <= c) >= 5%
    upper = GRID[np.argmax(cdf >= (1 + level) / 2, axis=0)]
    return mean, lower, upper, log_pmf


state_probs = np.asarray(best_model.predict_states(best_params, y, num_steps=HORIZON))[:, order]
stationary = np.asarray(best_model.initial_probs(best_params))[order]
print(f"p(z_T+h | y) for h = 1: {state_probs[0].round(3)}, h = {HORIZON}: "
      f"{state_probs[-1].round(3)}; stationary law: {stationary.round(3)}")

mean, lower, upper, _ = exact_predictive(best_model, best_params, y)
tail = state_probs @ poisson.sf(GRID[-1], rates_k)  # mass beyond the grid, per horizon
fc = ss.forecast(best_model, best_params, y, num_steps=HORIZON, num_samples=NUM_SAMPLES,
                 key=jax.random.key(2))
mc_lower, mc_upper = (np.asarray(q) for q in fc.interval(0.9))
future = years[-1] + np.arange(1, HORIZON + 1)
print(f"largest predictive probability of more than {GRID[-1]} counts: {tail.max():.1e}")
print(f"{'year':>5} {'mean':>6} {'MC mean':>8} {'exact 90%':>10} {'MC 90%':>10}")
for h in range(HORIZON):
    print(f"{future[h]:>5} {mean[h]:>6.2f} {float(fc.mean()[h]):>8.2f} "
          f"{f'{lower[h]}-{upper[h]}':>10} {f'{mc_lower[h]:.0f}-{mc_upper[h]:.0f}':>10}")

# %% [markdown]
# The forecast starts from the state the last years point to and relaxes toward the
# stationary mixture as $h$ grows, so the intervals widen to the spread of the whole
# century. Now a held-out check: refit on 1900-1996, forecast 1997-2006, and compare with
# what happened.
#
# The refit uses a mask rather than a shorter array: statseq marginalizes masked years
# exactly, so the likelihood is that of 1900-1996 alone (checked below), and the fit
# reuses the program compiled in section 4 for the full-length series. Two scores:
#
# * the coverage of the 90% intervals of the exact 1- to 10-year-ahead predictives;
# * the log score of `ss.log_score`, the log probability the model gave to what
#   happened, accumulated one year ahead at a time (each held-out year is conditioned on
#   once it is seen):
#
# $$\log p(y_{\mathrm{test}} \mid y_{\mathrm{train}}) =
# \sum_{t \in \mathrm{test}} \log p(y_t \mid y_{1:t-1}).$$
#
# We compare the log score with that of a single Poisson fitted to the same years, the
# model without hidden states.

# %%
split = int(np.searchsorted(years, 1997))
y_train, y_test = y[:split], y[split:]
train_mask = years < 1997  # fit to the full-length series with the last decade masked:
refit = ss.fit_restarts(best_model, y, mask=train_mask, key=jax.random.key(20),
                        num_restarts=NUM_RESTARTS, num_iters=EM_ITERS, tol=EM_TOL).best
print(f"log p(y_1900:1996): masked fit {refit.final_log_joint:.4f}, the same parameters "
      f"on the truncated series {float(ss.log_prob(best_model, refit.params, y_train)):.4f}")
train_params = refit.params
mean_t, lower_t, upper_t, log_pmf_t = exact_predictive(best_model, train_params, y_train)
inside = (y_test >= lower_t) & (y_test <= upper_t)
fc_test = ss.forecast(best_model, train_params, y_train, num_steps=HORIZON,
                      num_samples=NUM_SAMPLES, key=jax.random.key(3))
mc_lo_t, mc_hi_t = (np.asarray(q) for q in fc_test.interval(0.9))
mc_inside = (y_test >= mc_lo_t) & (y_test <= mc_hi_t)
print(f"{'year':>5} {'count':>5} {'exact 90%':>10} {'inside':>6}")
for t in range(HORIZON):
    print(f"{years[split + t]:>5} {y_test[t]:>5} {f'{lower_t[t]}-{upper_t[t]}':>10} "
          f"{'yes' if inside[t] else 'no':>6}")
held = np.exp(log_pmf_t) * ((GRID[:, None] >= lower_t) & (GRID[:, None] <= upper_t))
print(f"coverage of the exact 90% intervals: {inside.mean():.0%} "
      f"(sample-based intervals: {mc_inside.mean():.0%}); the exact intervals hold "
      f"{held.sum(axis=0).min():.1%} to {held.sum(axis=0).max():.1%} predictive probability")

one_state = ss.PoissonHMM(num_states=1, initial="stationary")
iid_params = one_state.assemble_params(
    best_params.emissions._replace(rates=jnp.array([y_train.mean()])))  # the Poisson MLE
hmm_score = ss.log_score(best_model, train_params, y_train, y_test)
iid_score = ss.log_score(one_state, iid_params, y_train, y_test)
fixed_origin = log_pmf_t[y_test, np.arange(HORIZON)].sum()
print(f"log score, {k_best}-state HMM, one year ahead: {hmm_score:.2f}")
print(f"log score, single Poisson (lambda = {y_train.mean():.2f}): {iid_score:.2f}")
print(f"HMM, sum of log p(y_1996+h | y_1900:1996) (all from 1996): {fixed_origin:.2f}")
assert inside.all() and hmm_score > max(iid_score, fixed_origin)  # as said below

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
fc.plot(ax=axes[0], time=years, future_time=future)
axes[0].step(future, lower, where="mid", color="C3", ls="--", lw=1)
axes[0].step(future, upper, where="mid", color="C3", ls="--", lw=1,
             label="exact 90% limits")
axes[0].set(xlim=(1950, future[-1] + 0.5), xlabel="year", ylabel="count",
            title=f"forecast {future[0]}-{future[-1]}")
fc_test.plot(ax=axes[1], time=years[:split], future_time=years[split:])
axes[1].step(years[split:], lower_t, where="mid", color="C3", ls="--", lw=1)
axes[1].step(years[split:], upper_t, where="mid", color="C3", ls="--", lw=1,
             label="exact 90% limits")
axes[1].plot(years[split:], y_test, "ko", ms=4, mfc="w", label="held out")
axes[1].set(xlim=(1950, years[-1] + 0.5), xlabel="year",
            title=f"held-out check: fit to {years[0]}-{years[split - 1]}")
# one legend for both panels, below them (the right panel's entries include the left's)
for ax in axes:
    ax.get_legend().remove()  # fc.plot's own legends would sit on the data
fig.legend(*axes[1].get_legend_handles_labels(), fontsize=8, loc="upper center",
           bbox_to_anchor=(0.5, 0.0), ncol=6)
plt.show()

# %% [markdown]
# The shaded fans come from the sample paths of `ss.forecast` (50% and 90% intervals),
# the dashed steps from the exact mixture; they agree up to Monte Carlo error. On the
# held-out decade the 90% intervals cover the counts that occurred, and the HMM's log
# score is well above the single Poisson's: knowing which regime the last years were in
# (the low-rate one) sharpens the forecast. Its one-year-ahead score is also higher than
# the score of the forecasts all made in 1996, since each year's count updates the state
# for the next. Ten years from one forecast origin are a small, correlated test: because
# counts are discrete each interval holds a little more than 90% probability (printed
# above), and even exact 90% intervals would all cover ten independent years about a
# third of the time ($0.9^{10} \approx 0.35$). Every number in this check, intervals and
# log scores alike, follows exactly from one autoregressive likelihood; only the fan's
# shading is Monte Carlo.

# %% [markdown]
# ## 7. Checking the model: pseudo-residuals
#
# Information criteria rank models; they do not say whether the best one fits. For that
# Zucchini, MacDonald and Langrock (2016, ch. 6) use **pseudo-residuals**. If $F_t$ is the
# cdf of the one-step predictive $p(y_t \mid y_{1:t-1})$ of section 1, then under the
# model $u_t = F_t(y_t)$ would be independent uniforms for a continuous $y_t$. Counts are
# discrete, so we draw $u_t$ uniformly between $F_t(y_t - 1)$ and $F_t(y_t)$ (the
# randomized version, exactly uniform under the model; Dunn and Smyth 1996), and map it
# to the normal scale, $r_t = \Phi^{-1}(u_t)$. These are the book's forecast
# pseudo-residuals: under the model the $r_t$ are i.i.d. $\mathcal{N}(0, 1)$, so serial
# correlation or a non-normal shape shows a misfit. `ss.diagnose` computes them
# (`ss.quantile_residuals` alone) and tests them: Ljung-Box up to lag 10,
# Jarque-Bera for normality, and $H$ for a change in variance.
#
# We check the single Poisson ($K = 1$, independent counts) and the 3-state model.

# %%
checks = {k: ss.diagnose(fits[k][0], fits[k][1].params, y, key=jax.random.key(5))
          for k in (1, k_best)}
for k, d in checks.items():
    print(f"K = {k}: pseudo-residual tests\n{d.tests.round(3)}")
    print(f"  autocorrelations, lags 1-5: {d.acf[1:6].round(2)}")
lb_p = {k: float(d.tests.loc["ljung_box", "pvalue"]) for k, d in checks.items()}
min_p = {k: float(d.tests["pvalue"].min()) for k, d in checks.items()}
assert lb_p[1] < 0.001 and min_p[k_best] > 0.05  # the prose below says so

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
lags = np.arange(1, 11)
for (k, d), color in zip(checks.items(), ["C3", "C0"], strict=True):
    axes[0].plot(years, d.residuals, ".-", color=color, lw=0.7, ms=3, label=f"K = {k}")
    axes[1].plot(lags + (0.1 if k > 1 else -0.1), d.acf[1:], "o", color=color,
                 label=f"K = {k}")
    axes[1].vlines(lags + (0.1 if k > 1 else -0.1), 0, d.acf[1:], color=color)
band = 1.96 / np.sqrt(y.size)
axes[1].axhspan(-band, band, color="0.85", label="95% band under independence")
axes[0].axhline(0, color="k", lw=0.5)
axes[0].set(xlabel="year", ylabel="pseudo-residual $r_t$",
            title="one-step pseudo-residuals")
axes[1].set(xlabel="lag", ylabel="autocorrelation", title="their autocorrelations")
for ax in axes:
    ax.legend(fontsize=8)
plt.show()

fig = checks[k_best].plot(residual_name="pseudo-residual")
fig.axes[0].set_xlabel("year index")
fig.suptitle(f"{k_best}-state Poisson HMM: pseudo-residual diagnostics")
fig.tight_layout()
plt.show()

# %% [markdown]
# The single Poisson fails: its pseudo-residuals wander in long runs above and below
# zero, their lag-1 autocorrelation is large, and Ljung-Box rejects independence
# decisively. Independent counts with a constant rate cannot produce the slow swings of
# this series. The 3-state model's pseudo-residuals pass all three tests at the 5% level,
# and their histogram, Q-Q plot and correlogram show nothing systematic. This is the
# book's conclusion (Zucchini, MacDonald and Langrock 2016, ch. 6): the 1-state model's
# pseudo-residuals are clearly not standard normal, those of the 3-state model are
# acceptable. The randomization adds noise of its own: another key gives other
# residuals, though not other conclusions for a misfit this large.
#
# ## 8. Uncertainty on the parameters
#
# `ss.summary` gives standard errors from the observed information, the Hessian of
# $-\log p(y \mid \theta)$ in unconstrained coordinates mapped to the natural parameters
# by the delta method, with 95% Wald intervals. For an HMM these are a rough guide:
# several transition probabilities are close to 0, where a symmetric interval is
# meaningless. The book (Zucchini, MacDonald and Langrock 2016, sec. 3.6) therefore
# recommends a **parametric bootstrap**: simulate series from the fitted model, refit
# each, and read intervals off the refitted parameters (after sorting the states by
# rate, since the state labels of a refit are arbitrary).

# %%
NUM_BOOT = 8 if SMOKE else 60
table_3 = ss.summary(best_model, best_params, y, fit=fits[k_best][1])
print(table_3)
se_of = dict(zip(table_3.names, table_3.std_errors, strict=True))  # Hessian std. errors

boot_series = np.asarray(ss.sample(best_model, best_params, num_timesteps=y.size,
                                   num_samples=NUM_BOOT, key=jax.random.key(30)))
boot_rates, boot_diag = [], []
for series in boot_series:
    refit_b = ss.fit_em(best_model, best_params, series, num_iters=EM_ITERS, tol=EM_TOL,
                        progress=False)
    o = np.argsort(np.asarray(refit_b.params.emissions.rates))
    boot_rates.append(np.asarray(refit_b.params.emissions.rates)[o])
    boot_diag.append(np.diag(np.asarray(refit_b.params.transitions)[np.ix_(o, o)]))
boot = np.column_stack([np.array(boot_rates), np.array(boot_diag)])
estimate = np.r_[rates_k, np.diag(np.asarray(best_params.transitions)[np.ix_(order, order)])]
wald_se = np.array([se_of[f"emissions.rates[{i}]"] for i in order]
                   + [se_of[f"transitions[{i},{i}]"] for i in order])
boot_lo, boot_hi = np.quantile(boot, [0.05, 0.95], axis=0)
names = [f"lambda_{i + 1}" for i in range(k_best)] + [f"A[{i + 1},{i + 1}]"
                                                        for i in range(k_best)]
print(f"\n{NUM_BOOT} bootstrap refits (states sorted by rate)")
print(f"{'parameter':>10} {'estimate':>9} {'Hessian se':>10} {'bootstrap sd':>12} "
      f"{'Wald 90%':>16} {'bootstrap 90%':>16}")
for i, name in enumerate(names):
    wald = f"{estimate[i] - 1.645 * wald_se[i]:.3f}-{estimate[i] + 1.645 * wald_se[i]:.3f}"
    print(f"{name:>10} {estimate[i]:>9.3f} {wald_se[i]:>10.3f} {boot[:, i].std(ddof=1):>12.3f} "
          f"{wald:>16} {f'{boot_lo[i]:.3f}-{boot_hi[i]:.3f}':>16}")
width = boot_hi - boot_lo
print(f"bootstrap 90% interval widths: rates {width[:k_best].round(2)}, "
      f"persistences A[i,i] {width[k_best:].round(3)}")
wald_above_1 = [names[k_best + i] for i in range(k_best)
                if estimate[k_best + i] + 1.96 * wald_se[k_best + i] > 1]
print(f"95% Wald intervals above 1: {wald_above_1}")
ratio = boot[:, :k_best].std(axis=0, ddof=1) / wald_se[:k_best]
print(f"bootstrap sd / Hessian se of the rates: {ratio.round(2)}")
# the prose below: the high-rate state has the widest intervals; the two lower rates are
# within a few counts; the bootstrap spread of the rates is 1 to ~2.5 times the Hessian se
assert np.argmax(width[:k_best]) == np.argmax(width[k_best:]) == k_best - 1
assert width[:k_best - 1].max() < 6 and f"A[{k_best},{k_best}]" in wald_above_1
assert np.all(ratio > 0.9) and ratio.max() < 2.5
# ... and (with the full 60 refits) the high rate's interval reaches toward the middle one
assert SMOKE or boot_lo[k_best - 1] < rates_k[-2:].mean()

# %% [markdown]
# The rates of the two lower states are well determined: their bootstrap intervals are
# a few counts wide. The high-rate state's rate is less certain, and its bootstrap
# interval reaches down toward the middle rate: in some simulated centuries that state is
# visited so rarely that the refit can hardly tell it apart. The bootstrap standard
# deviations of the rates are as large as or larger than the Hessian standard errors (up
# to about twice, ratios printed above): the curvature at the maximum understates the
# uncertainty of a likelihood this far from quadratic. The transition probabilities are
# less certain still. The persistence of the high-rate state, $A_{33}$, has the widest
# bootstrap interval of the three: the series visits that state in only a few short
# spells, so it says little about how long such spells last. Its 95% Wald interval in
# the summary table reaches above 1 (printed above), which an interval made of refitted
# probabilities, as the bootstrap's is, cannot; and the bootstrap interval is far from
# symmetric about the estimate. With 60 refits (8 in the fast test mode) the bootstrap
# quantiles are themselves rough; more replicates sharpen them at the cost of one EM fit
# each.
#
# ## Conclusion
#
# The earthquake counts are overdispersed and serially correlated, and a Poisson HMM
# with a stationary initial law explains both. Both information criteria pick three
# states; the fitted likelihoods reproduce the published maximum likelihood values of
# Zucchini and MacDonald; the 3-state model's pseudo-residuals are consistent with
# independent standard normals, while those of a single Poisson are not; and on the
# held-out decade the 3-state model's log score beats the single Poisson's. The two
# lower rates are estimated to within a few counts. What remains uncertain is the
# high-rate state: its rate, and above all how long its spells last, rest on a handful
# of years and switches in 107, and the bootstrap intervals are wider than the Hessian
# standard errors suggest. The states describe the century's counts; they are not an
# identified physical mechanism.
