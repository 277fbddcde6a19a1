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
# # Neural sequence models beside the classics: where each one wins
#
# A recurrent neural network is one more way of writing the autoregressive likelihood
#
# $$\log p(y_{1:T}) = \sum_{t=1}^T \log p(y_t \mid y_{<t}),$$
#
# with a learned state: the network reads the previous observation, updates its hidden
# state $h_t = f_\theta(h_{t-1}, y_{t-1})$, and an *emission head* turns $h_t$ into the
# one-step predictive distribution, here $y_t \mid y_{<t} \sim \mathcal{N}(\mu(h_t),
# \sigma(h_t)^2)$. In statseq the hidden state is the model's carry, exactly as the forward
# message is an HMM's and the Kalman belief a state space model's, so the same functions
# fit, score and forecast all of them, and comparisons are like for like.
#
# This vignette trains networks the way a careful practitioner would on short series, and
# then asks where they beat the classical models and where they do not:
#
# 1. **a short real series** (289 yearly sunspot numbers): AR(9) and the naive method
#    (a random walk) against GRU, LSTM and Mamba networks, each trained with weight decay, small hidden
#    layers and early stopping whose patience counts only after the learning-rate
#    warm-up, from 3 random seeds, and scored at 3 rolling forecast origins;
# 2. **a long nonlinear series** (simulated, since no bundled series is long enough): the
#    same GRU recipe against the best linear AR;
# 3. **many related series** (simulated from a hidden Markov model): a GRU learns to act
#    like the HMM's forward filter.
#
# Every comparison is scored by the exact one-step log score per observation (higher is
# better) and the exact one-step CRPS (lower is better), both from each model's Gaussian
# one-step predictive.

# %%
import os
from functools import partial

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
import pandas as pd
from scipy.stats import norm

import statseq as ss
from statseq.models.hmm import CategoricalEmissions

jax.config.update("jax_enable_x64", True)
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests

SEEDS = (0,) if SMOKE else (0, 1, 2)
NUM_STEPS = 40 if SMOKE else 1000  # Adam steps at most
WARMUP = 10 if SMOKE else 50  # linear learning-rate warm-up
EVAL_EVERY, PATIENCE = 10, 20  # validation every 10 steps; stop after 20 without progress
HMM_SGD_STEPS = 30 if SMOKE else 500

# %% [markdown]
# ## The training recipe
#
# With a few hundred observations a network with hundreds of weights overfits within a few
# hundred Adam steps, so the recipe matters as much as the architecture:
#
# * **small networks**: 8 hidden units (GRU: 290 weights; LSTM: 370; Mamba, one layer of
#   width 8 with state size 4: 778);
# * **weight decay**: AdamW (`optax.adamw`, decay 0.1 of the unconstrained weights), with
#   gradients clipped to norm 1;
# * **learning rate**: a linear warm-up over the first 50 steps to $5 \times 10^{-3}$, then
#   cosine decay;
# * **early stopping** on the last 15% of each training window (`validation=0.15`),
#   evaluated every 10 steps; the fit keeps the parameters with the best validation log
#   score and stops after 20 evaluations without progress. `min_steps=WARMUP` makes the
#   patience count only *after* the warm-up: during the warm-up the validation score is
#   noisy and an early plateau there must not end the fit;
# * **3 seeds** per network: the spread over seeds is part of the result.
#
# One optimizer object is built once and passed to every fit, so each architecture is
# compiled once (see `ss.fit_sgd`).

# %%
schedule = optax.warmup_cosine_decay_schedule(0.0, 5e-3, WARMUP, NUM_STEPS, 1e-4)
optimizer = optax.adamw(schedule, weight_decay=0.1)


def fit_network(model, y, seed):
    start = model.initialize(y, key=jax.random.key(seed))
    return ss.fit_sgd(model, start, y, optimizer=optimizer, num_steps=NUM_STEPS,
                      key=jax.random.key(100 + seed), clip_norm=1.0, validation=0.15,
                      eval_every=EVAL_EVERY, patience=PATIENCE, min_steps=WARMUP,
                      progress=False)


@partial(jax.jit, static_argnums=0)
def predictive_moments(model, params, carries):
    """Mean and standard deviation of the Gaussian one-step predictive after each carry."""
    def moments(carry):
        d = model.predict(params, carry, jnp.zeros((0,)))
        return jnp.reshape(d.mean, ()), jnp.sqrt(jnp.reshape(d.variance, ()))

    return jax.vmap(moments)(carries)


def one_step(model, params, history, future):
    """Exact one-step predictive means and standard deviations of ``future``.

    The filter runs over history and future; the carry before each future step gives
    that step's Gaussian predictive ``N(mean_t, sd_t^2)`` (``model.predict``).
    """
    y = np.concatenate([history, future])
    carries = ss.filter(model, params, y, return_carries=True).carries
    before = jax.tree.map(lambda c: c[history.size - 1:-1], carries)
    mean, sd = predictive_moments(model, params, before)
    return np.asarray(mean), np.asarray(sd)


def scores(model, params, history, future):
    """One-step log score and CRPS per observation, both exact for Gaussian predictives.

    (tests/test_neural_vignette.py checks them against ``ss.log_score`` and a sample CRPS.)
    """
    mean, sd = one_step(model, params, history, future)
    return (norm.logpdf(future, mean, sd).mean(),
            ss.evaluation.crps_gaussian(mean, sd, future).mean())


def mean_sd_table(rows, reference):
    """Mean and standard deviation over seeds of each model's scores, best first."""
    frame = pd.DataFrame(rows)
    per_seed = frame.groupby(["model", "seed"])[["log score", "CRPS"]].mean()
    table = per_seed.groupby("model").agg(["mean", "std"])
    table.columns = [f"{a} {b}" for a, b in table.columns]
    table["seeds"] = per_seed.groupby("model").size()
    table[f"log score minus {reference}"] = (
        table["log score mean"] - table.loc[reference, "log score mean"])
    return table.sort_values("log score mean", ascending=False)


# %% [markdown]
# ## 1. A short real series: yearly sunspots
#
# We model the square root of the yearly sunspot numbers 1700-1988 (the classic
# variance-stabilizing root), standardized with the years before the first forecast
# origin. **Rolling origins**: at each of the origins 1959, 1969 and 1979 every model is
# refitted on the 259 years before the origin (a window of fixed length, so the networks
# compile once) and scores the next 10 years one step ahead, each year forecast from all
# the years before it. Together the three origins score the 30 years 1959-1988.

# %%
sunspots = ss.datasets.load_sunspots()
years = sunspots.index.to_numpy()
root = np.sqrt(sunspots.to_numpy().astype(float))
WINDOW, BLOCK = 259, 10
ORIGINS = (279,) if SMOKE else (259, 269, 279)  # index of the first year forecast
z = (root - root[:ORIGINS[0]].mean()) / root[:ORIGINS[0]].std()
print(f"{z.size} years {years[0]}-{years[-1]}; origins "
      f"{[int(years[o]) for o in ORIGINS]}, each scoring {BLOCK} years")

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(years, z, "k-", lw=0.8, label="standardized sqrt(sunspots)")
for o in ORIGINS:
    ax.axvline(years[o] - 0.5, color="C3", ls="--", lw=0.8)
ax.axvspan(years[ORIGINS[0]] - 0.5, years[-1] + 0.5, color="C3", alpha=0.08,
           label="years scored (one step ahead)")
ax.set(xlabel="year", ylabel="standardized sqrt(sunspots)",
       title="Yearly sunspot numbers; dashed lines: forecast origins")
ax.legend(loc="upper left", fontsize=8)
plt.show()

# %% [markdown]
# **The linear baseline.** The AR order is chosen by AIC on the first training window,
# with every order scored on the same years (the first 12 are conditioned on), so the
# AICs are comparable. The order is AIC's choice on our data, not a textbook's: Box,
# Jenkins and Reinsel's sunspot example (Series E, 100 yearly Wolfer numbers 1770-1869)
# is a shorter series, for which they identify AR(2) and AR(3).

# %%
first = z[ORIGINS[0] - WINDOW:ORIGINS[0]]
aic = pd.Series({p: ss.information_criteria(ss.AR(order=p),
                                            ss.AR(order=p).fit_least_squares(first[12 - p:]),
                                            first[12 - p:])["aic"]
                 for p in ((8, 9, 10) if SMOKE else range(1, 13))}, name="AIC")
AR_ORDER = int(aic.idxmin())
print(aic.round(1).to_string())
print(f"AIC chooses AR({AR_ORDER})")
assert AR_ORDER == 9  # the prose below calls the baseline AR(9)

# %%
ar = ss.AR(order=AR_ORDER)
walk = ss.AR(order=1)  # with coefficient 1 and no intercept: a random walk


def naive_params(history):
    """The naive method (Hyndman and Athanasopoulos, *Forecasting: Principles and
    Practice*, 3rd ed., sec. 5.2) with Gaussian errors:
    y_t ~ N(y_{t-1}, s^2), s^2 the mean squared one-step change in the history."""
    s2 = np.mean(np.diff(history) ** 2)
    return ss.ARParams(coeffs=jnp.ones((1, 1, 1)), intercept=jnp.zeros(1),
                       input_weights=jnp.zeros((1, 0)), cov=jnp.full((1, 1), s2))


networks = {
    "GRU": ss.GRU(hidden_dim=8),
    "LSTM": ss.LSTM(hidden_dim=8),
    "Mamba": ss.Mamba(hidden_dim=8, state_dim=4, num_layers=1),
}
assert [ss.num_params(m) for m in networks.values()] == [290, 370, 778]  # as stated above
if SMOKE:  # the test suite's fast mode: one network
    networks = {"GRU": networks["GRU"]}

rows, fits = [], {}
for o in ORIGINS:
    history, future = z[o - WINDOW:o], z[o:o + BLOCK]
    ar_params = ar.fit_least_squares(history)
    for name, model, params in [("AR(9)", ar, ar_params),
                                ("naive (random walk)", walk, naive_params(history))]:
        lp, cr = scores(model, params, history, future)
        rows.append(dict(model=name, seed=0, origin=int(years[o]), **{"log score": lp,
                                                                      "CRPS": cr}))
        fits[name, o, 0] = params
    for name, model in networks.items():
        for seed in SEEDS:
            fit = fit_network(model, history, seed)
            lp, cr = scores(model, fit.params, history, future)
            best = int(np.argmax(fit.validation_log_prob))
            rows.append(dict(model=name, seed=seed, origin=int(years[o]),
                             **{"log score": lp, "CRPS": cr},
                             stopped=fit.num_iterations,
                             best_step=int(fit.validation_steps[best]) + 1))
            fits[name, o, seed] = fit

sunspot_table = mean_sd_table(rows, "AR(9)")
sunspot_table.round(3)

# %% [markdown]
# The table averages each model's one-step log score and CRPS over the 30 scored years,
# then gives the mean and standard deviation of that average over the seeds (AR(9) and
# the naive method are deterministic fits: one "seed", no spread). The last column is the
# difference in log score per year from AR(9). The naive method forecasts each year by
# the one before, with the spread of the year-to-year changes.
#
# **AR(9) wins on this series.** It has the highest log score and the lowest CRPS of all
# models, and every network trails it by more than its seed-to-seed spread. The networks
# do beat the naive method, which knows nothing of the 11-year cycle. The assertions
# below check these statements against the table.

# %%
ar_row = sunspot_table.loc["AR(9)"]
for name in networks:
    row = sunspot_table.loc[name]
    assert row["log score mean"] < ar_row["log score mean"], name
    assert row["CRPS mean"] > ar_row["CRPS mean"], name
    if not SMOKE:  # with 3 seeds: the gap exceeds the spread over seeds
        assert ar_row["log score mean"] - row["log score mean"] > row["log score std"], name
assert sunspot_table["log score mean"].idxmax() == "AR(9)"
assert sunspot_table["CRPS mean"].idxmin() == "AR(9)"
if not SMOKE:  # (40 Adam steps leave the smoke-mode GRU below even the naive method)
    assert sunspot_table["log score mean"].idxmin() == "naive (random walk)"
gaps = -sunspot_table.loc[list(networks), "log score minus AR(9)"]
if not SMOKE:  # the networks' own ranking is within their spread over seeds
    net = sunspot_table.loc[list(networks)]
    assert net["log score mean"].max() - net["log score mean"].min() < net[
        "log score std"].max()
print(f"AR(9) beats the networks by {gaps.min():.2f} to {gaps.max():.2f} nats per year "
      f"({BLOCK * len(ORIGINS) * gaps.min():.1f} to {BLOCK * len(ORIGINS) * gaps.max():.1f} "
      f"nats over the {BLOCK * len(ORIGINS)} scored years)")

# %% [markdown]
# ### Did the networks train?
#
# The issue with early stopping on a short series is that it can stop a network before
# it has learned anything. Below, for the GRU at the last origin, the training objective
# (negative log-likelihood per training year) and the validation log score per
# validation year against the Adam step, for each seed; the dotted line is the end of the
# warm-up, the dots the steps whose parameters the fit returns. The axes are linear: both
# quantities can be negative.

# %%
last = ORIGINS[-1]
num_val = int(round(0.15 * WINDOW))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for seed in SEEDS:
    fit = fits["GRU", last, seed]
    n = fit.num_iterations
    axes[0].plot(np.arange(1, n + 1), -fit.log_joint[:n] / (WINDOW - num_val), lw=0.8,
                 color=f"C{seed}", label=f"seed {seed}")
    axes[1].plot(fit.validation_steps + 1, fit.validation_log_prob / num_val, lw=0.8,
                 color=f"C{seed}", label=f"seed {seed}")
    best = int(np.argmax(fit.validation_log_prob))
    axes[1].plot(fit.validation_steps[best] + 1, fit.validation_log_prob[best] / num_val,
                 "o", color=f"C{seed}")
for ax in axes:
    ax.axvline(WARMUP, color="gray", ls=":", label="end of warm-up")
    ax.set(xlabel="Adam step")
axes[0].set(ylabel="negative log-likelihood per year", title="training objective")
axes[1].set(ylabel="log score per validation year", title="validation (last 15% of window)")
axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()

network_rows = pd.DataFrame([r for r in rows if r["model"] in networks])
print(network_rows.groupby("model")[["best_step", "stopped"]].agg(["min", "median", "max"]))
# patience counts only after the warm-up: no fit stopped before warm-up + patience
assert network_rows["stopped"].min() >= min(NUM_STEPS, WARMUP + PATIENCE * EVAL_EVERY)
if not SMOKE:  # the statements below the figure
    assert network_rows["best_step"].min() > WARMUP
    for seed in SEEDS:
        fit = fits["GRU", last, seed]
        best = int(np.argmax(fit.validation_log_prob))
        assert fit.validation_log_prob[-1] < fit.validation_log_prob[best]
        assert fit.log_joint[fit.num_iterations - 1] > fit.log_joint[
            fit.validation_steps[best]]

# %% [markdown]
# The training objective keeps falling while the validation score peaks and then declines:
# past its best step the network fits the noise of 220 years. The best steps (table above)
# lie after the warm-up, and the fit returns those parameters, not the last ones. With
# 39 validation years the validation curve is itself noisy, one reason the seeds disagree.
#
# ### Diagnostics and parameter uncertainty of the winner
#
# AR(9)'s one-step residuals on the last training window (Ljung-Box, heteroskedasticity
# and normality tests), the same tests for the first GRU seed, and AR(9)'s coefficients
# with standard errors from the observed information.

# %%
history = z[last - WINDOW:last]
diag_ar = ss.diagnose(ar, fits["AR(9)", last, 0], history)
diag_gru = ss.diagnose(networks["GRU"], fits["GRU", last, 0].params, history)
pd.concat({"AR(9)": diag_ar.tests, "GRU (seed 0)": diag_gru.tests}, axis=1).round(3)

# %%
diag_ar.plot()
plt.show()
ar_summary = ss.summary(ar, fits["AR(9)", last, 0], history)
print(ar_summary)
assert diag_ar.tests.loc["ljung_box", "pvalue"] > 0.05  # no residual autocorrelation left
lag_rows = [i for i, n in enumerate(ar_summary.names) if n.startswith("coeffs")]
covers_zero = [ar_summary.names[i] for i in lag_rows
               if ar_summary.ci_lower[i] < 0 < ar_summary.ci_upper[i]]
print("lag coefficients whose 95% interval contains 0:", covers_zero)
assert len(covers_zero) >= 2  # "several" in the text below

# %% [markdown]
# AR(9)'s residuals show no autocorrelation left (Ljung-Box), so the linear model has
# captured the cycle's memory; the other two tests in the table say whether the
# Gaussian predictive's variance and shape fit too (a small p-value there is a reason to
# model the variance, not a reason to prefer a network, whose scores are worse). The
# coefficient table gives the parameter uncertainty: several lag coefficients have
# intervals that include zero, but dropping lags by significance is a different model
# selection rule from AIC and is not pursued here.
#
# ## 2. A long nonlinear series (simulated)
#
# No bundled series is long or nonlinear enough to show the networks' strength (the
# longest, sunspots, has 289 values; the lynx trappings are the classic nonlinear series,
# but 114 values). So we **simulate** one: an exponential autoregression (Haggan and
# Ozaki, 1981), whose dynamics change with the level of the series,
#
# $$y_t = 0.5 + (0.5 - 1.8 e^{-y_{t-1}^2})\, y_{t-1} + 0.4\,\varepsilon_t, \qquad
# \varepsilon_t \sim \mathcal{N}(0, 1),$$
#
# 1200 steps: 1000 to train (the last 15% for early stopping), 200 to score. The
# baseline is the best linear AR by AIC, and the true model's one-step log score is the
# ceiling any model can reach on average.

# %%
def expar_mean(y_prev):
    return 0.5 + (0.5 - 1.8 * np.exp(-y_prev**2)) * y_prev


rng = np.random.default_rng(2024)
# (smoke mode: the sunspot windows' shapes, so the compiled fit is reused)
num_sim = WINDOW + BLOCK if SMOKE else 1200
num_sim_test = BLOCK if SMOKE else 200
x = np.zeros(num_sim + 100)
for t in range(1, x.size):
    x[t] = expar_mean(x[t - 1]) + 0.4 * rng.standard_normal()
x = x[100:]  # drop the burn-in
sim_train, sim_test = x[:-num_sim_test], x[-num_sim_test:]

sim_aic = {p: ss.information_criteria(ss.AR(order=p),
                                      ss.AR(order=p).fit_least_squares(sim_train[8 - p:]),
                                      sim_train[8 - p:])["aic"] for p in range(1, 9)}
sim_order = min(sim_aic, key=sim_aic.get)
sim_ar = ss.AR(order=sim_order)
sim_rows = []
lp, cr = scores(sim_ar, sim_ar.fit_least_squares(sim_train), sim_train, sim_test)
sim_rows.append(dict(model=f"AR({sim_order}) (AIC)", seed=0, **{"log score": lp, "CRPS": cr}))
true_mean = expar_mean(x[-num_sim_test - 1:-1])
sim_rows.append(dict(model="true model", seed=0,
                     **{"log score": norm.logpdf(sim_test, true_mean, 0.4).mean(),
                        "CRPS": ss.evaluation.crps_gaussian(true_mean, 0.4, sim_test).mean()}))
gru = networks["GRU"]
for seed in SEEDS:
    fit = fit_network(gru, sim_train, seed)
    lp, cr = scores(gru, fit.params, sim_train, sim_test)
    sim_rows.append(dict(model="GRU", seed=seed, **{"log score": lp, "CRPS": cr}))

sim_table = mean_sd_table(sim_rows, f"AR({sim_order}) (AIC)")
sim_table.round(3)

# %% [markdown]
# **Here the GRU wins.** With 850 training steps of a series whose one-step mean is a
# nonlinear function of the last value, the same small GRU and the same recipe beat the
# best linear AR on both scores, for every seed, and close much of the gap to the true
# model. A linear AR can only fit the best straight line through that curve.

# %%
gru_seeds = pd.DataFrame(sim_rows).query("model == 'GRU'")
ar_sim = sim_table.loc[f"AR({sim_order}) (AIC)"]
if not SMOKE:  # 40 Adam steps (smoke mode) are not enough to learn the curve
    assert (gru_seeds["log score"] > ar_sim["log score mean"]).all()
    assert (gru_seeds["CRPS"] < ar_sim["CRPS mean"]).all()
    assert sim_table["log score mean"].idxmax() == "true model"
    true_sim = sim_table.loc["true model", "log score mean"]
    closed = (sim_table.loc["GRU", "log score mean"] - ar_sim["log score mean"]) / (
        true_sim - ar_sim["log score mean"])
    print(f"the GRU closes {closed:.0%} of the gap between the linear AR and the true model")
    assert closed > 0.5

# %% [markdown]
# ## 3. Many related series: an RNN that learns to be a forward filter
#
# Networks also earn their keep when there are many related sequences to pool. A hidden
# Markov model's one-step predictive is computed by the forward recursion: the carry is
# $\alpha_t = p(z_t \mid y_{<t})$, updated by Bayes' rule and the transition matrix. A
# GRU has no such structure built in, but it has a hidden state, and trained by maximum
# likelihood on data from an HMM it should learn a state that carries the same
# information. We **simulate** 300 sequences of 100 symbols from a sticky two-state HMM
# whose states prefer different symbols, fit a GRU with a categorical head, and compare
# its one-step predictive probabilities with the exact ones of the true HMM on 100 new
# sequences.

# %%
true_hmm = ss.CategoricalHMM(num_states=2, num_classes=3)
true_params = ss.HMMParams(
    initial_probs=jnp.array([0.5, 0.5]),
    transitions=jnp.array([[0.95, 0.05], [0.10, 0.90]]),
    emissions=CategoricalEmissions(
        probs=jnp.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]])),
)
sims = ss.sample(true_hmm, true_params, num_timesteps=100, num_samples=400,
                 key=jax.random.key(7))
train, test = sims[:300], sims[300:]

cat_gru = ss.GRU(hidden_dim=8, emission="categorical", num_classes=3)
cat_fit = ss.fit_sgd(cat_gru, cat_gru.initialize(train, key=jax.random.key(8)), train,
                     optimizer=optax.adam(1e-2), num_steps=HMM_SGD_STEPS, batch_size=32,
                     key=jax.random.key(9), clip_norm=1.0, progress=False)

per_step = {
    "true HMM (forward filter)": float(jnp.mean(ss.log_prob(true_hmm, true_params, test))),
    "GRU (8 units)": float(jnp.mean(ss.log_prob(cat_gru, cat_fit.params, test))),
    "i.i.d. symbol frequencies": float(
        np.log(np.bincount(np.asarray(train).ravel(), minlength=3) / train.size)[
            np.asarray(test)].sum(axis=1).mean()),
}
hmm_table = pd.Series(per_step, name="held-out log-likelihood per sequence (100 symbols)")
hmm_table.round(2)

# %%
if not SMOKE:
    assert per_step["GRU (8 units)"] < per_step["true HMM (forward filter)"]
    assert per_step["GRU (8 units)"] > per_step["i.i.d. symbol frequencies"]
    gru_gap = per_step["true HMM (forward filter)"] - per_step["GRU (8 units)"]
    iid_gap = per_step["true HMM (forward filter)"] - per_step["i.i.d. symbol frequencies"]
    assert gru_gap < 0.25 * iid_gap  # the GRU recovers most of what the hidden state is worth
    print(f"the GRU recovers {1 - gru_gap / iid_gap:.0%} of the gain of the forward filter "
          "over i.i.d. frequencies")

# %% [markdown]
# The true model is the best any model can do on average; the GRU comes close to it and
# far above the i.i.d. baseline that ignores the hidden state. The gap between the GRU and
# the HMM is the price of learning the filter from 30,000 symbols instead of knowing it.
# Below, the one-step predictive probability of symbol 2 (the one state 2 prefers) along
# one test sequence: the GRU's curve follows the forward filter's.

# %%
def predictive_probs(model, params, y, num_classes):
    """p(y_t = k | y_<t) for every t and k, from the filter's carries."""
    carries = ss.filter(model, params, y, return_carries=True).carries
    start = model.initial_carry(params)
    before = jax.tree.map(lambda c0, c: jnp.concatenate([c0[None], c[:-1]]), start, carries)
    return class_probs(model, params, before, num_classes)


@partial(jax.jit, static_argnums=(0, 3))
def class_probs(model, params, carries, num_classes):
    def probs(carry):
        d = model.predict(params, carry, jnp.zeros((0,)))
        return jnp.exp(jnp.stack([d.log_prob(k) for k in range(num_classes)]))

    return jax.vmap(probs)(carries)


seq = test[0]
p_hmm = predictive_probs(true_hmm, true_params, seq, 3)
p_gru = predictive_probs(cat_gru, cat_fit.params, seq, 3)
fig, ax = plt.subplots(figsize=(10, 3))
ax.plot(p_hmm[:, 2], "k-", label="true HMM: forward filter")
ax.plot(p_gru[:, 2], "C1--", label="GRU")
ax.plot(np.arange(seq.size), np.asarray(seq) / 2, "C0.", ms=3, label="observed symbol / 2")
ax.set(xlabel="t", ylabel="p(y_t = 2 | y_<t)", title="One-step predictive probability")
ax.legend(fontsize=8, loc="upper right")
plt.show()
print("largest difference in predictive probabilities along this sequence: "
      f"{float(jnp.max(jnp.abs(p_hmm - p_gru))):.3f}")

# %% [markdown]
# ## What to take away
#
# * **Short univariate series: the classical model wins.** On 259 years of sunspots, AR(9)
#   (11 parameters, chosen by AIC) has a better one-step log score and CRPS than GRU, LSTM
#   and Mamba networks with hundreds of weights, averaged over three rolling origins, and
#   by more than the networks' spread over seeds, even with weight decay, small hidden
#   layers and early stopping that starts counting after the warm-up. Its residuals show
#   no autocorrelation left.
# * **Long series with nonlinear dynamics: the network wins.** On 1000 simulated steps of
#   an exponential autoregression, the same GRU recipe beats the best linear AR for every
#   seed, because the one-step mean is a curve a linear model cannot follow.
# * **Many related series: the network learns the structure.** Pooling 300 simulated
#   sequences, a GRU learns a hidden state that reproduces most of an HMM forward filter's
#   advantage over a model without memory.
# * **What remains uncertain.** The sunspot comparison rests on 30 scored years and 3
#   seeds per network; the spread over seeds is larger than the differences between the
#   networks, so their ranking among themselves is not established. The two settings
#   where networks win are simulated: no bundled real series is long enough to show it
#   on real data.
