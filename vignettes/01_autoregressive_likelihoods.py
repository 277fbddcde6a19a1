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
# # Sequence models as autoregressive likelihoods
#
# Every model in statseq is a probability distribution over a whole sequence, written with
# the chain rule as a product of one-step predictive distributions:
#
# $$\log p(y_{1:T}) = \sum_{t=1}^{T} \log p(y_t \mid y_{1:t-1}).$$
#
# The models differ in how they summarize the past $y_{1:t-1}$. statseq asks every model
# for a **fixed-size state** (the *carry*) that a recurrence updates with each observation:
#
# * `initial_carry(params)`: the state before any data;
# * `predict(params, carry, u_t)`: the one-step predictive $p(y_t \mid y_{<t})$, a numpyro
#   distribution;
# * `update(params, carry, y_t, mask_t, u_t)`: the state after seeing $y_t$.
#
# For a hidden Markov model the carry is the normalized forward message; for a linear
# Gaussian state space model it is the Kalman filter's predicted mean and covariance; for
# an RNN it is the hidden state. Log-likelihoods, sampling, forecasting and gradient
# fitting are written once over this protocol.
#
# This tutorial uses the simplest member of the family, the Gaussian autoregressive model
# AR(p), whose carry is the window of the last $p$ values,
#
# $$y_t = c + \sum_{k=1}^{p} \phi_k \, y_{t-k} + \varepsilon_t, \qquad
# \varepsilon_t \sim \mathcal{N}(0, \sigma^2),$$
#
# on a classic series: the annual number of Canadian lynx trapped, 1821-1934.

# %%
import os

import jax
import matplotlib.pyplot as plt
import numpy as np
import optax

import statseq as ss

jax.config.update("jax_enable_x64", True)  # float64 for exact comparisons below
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests
NUM_SGD_STEPS = 200 if SMOKE else 3000
NUM_SAMPLES = 200 if SMOKE else 4000

lynx = ss.datasets.load_lynx()
y = np.log10(lynx.to_numpy().astype(float))
years = lynx.index.to_numpy()

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(years, y, color="k", lw=1)
ax.set(xlabel="year", ylabel="log10 lynx trapped", title="Canadian lynx trappings")
plt.show()

# %% [markdown]
# The series cycles with a period of about ten years. An AR(2) model can represent such
# cycles: when the characteristic roots of $1 - \phi_1 z - \phi_2 z^2$ are complex, the
# model's autocorrelation is a damped oscillation.
#
# ## The likelihood as a sum of one-step predictions
#
# `model.fit_least_squares` computes the conditional maximum likelihood estimate in
# closed form (ordinary least squares of $y_t$ on its lags).

# %%
model = ss.AR(order=2)
params = model.fit_least_squares(y)
phi = np.asarray(params.coeffs[:, 0, 0])
print(f"c = {float(params.intercept[0]):.4f}, phi = {phi.round(4)}, "
      f"sigma^2 = {float(params.cov[0, 0]):.5f}")
roots = np.roots([-phi[1], -phi[0], 1.0])
print(f"characteristic roots {roots.round(3)}; implied period "
      f"{2 * np.pi / abs(np.angle(roots[0])):.1f} years")

# %% [markdown]
# `ss.filter` runs the recurrence and returns every one-step predictive log-density. By
# default an AR(p) likelihood *conditions* on its first $p$ values (as least squares
# does), so those steps contribute zero. We check the total against the chain rule written
# out by hand.

# %%
result = ss.filter(model, params, y)
print("first log_probs:", np.asarray(result.log_probs[:4]).round(4))

c, s2 = float(params.intercept[0]), float(params.cov[0, 0])
by_hand = sum(
    -0.5 * np.log(2 * np.pi * s2) - (y[t] - c - phi[0] * y[t - 1] - phi[1] * y[t - 2]) ** 2
    / (2 * s2)
    for t in range(2, y.size)
)
print(f"statseq log p(y) = {float(result.log_prob):.10f}")
print(f"by hand          = {by_hand:.10f}")

# %% [markdown]
# The same number comes out of statsmodels' `AutoReg`, a peer implementation:

# %%
try:
    from statsmodels.tsa.ar_model import AutoReg

    print(f"statsmodels AutoReg llf = {AutoReg(y, lags=2, trend='c').fit().llf:.10f}")
except ImportError:  # statsmodels is a test extra, not a run-time dependency
    print("statsmodels not installed")

# %% [markdown]
# ## One objective, two fitting methods
#
# Least squares is special to linear Gaussian models. Gradient ascent works for every
# statseq model: `ss.fit_sgd` maximizes the same log-likelihood (plus a log prior when one
# is given) with an optax optimizer, compiled as a single loop. Its trace is in the same
# units as the closed-form answer, so the two can share one axis.

# %%
fit = ss.fit_sgd(model, model.default_params(), y, optimizer=optax.adam(0.02),
                 num_steps=NUM_SGD_STEPS, key=jax.random.key(0), progress=False)
print(f"least squares log p(y) = {float(result.log_prob):.4f}")
print(f"fit_sgd final log p(y) = {fit.final_log_joint:.4f} after {fit.num_iterations} steps "
      f"({fit.wall_time:.1f} s including compilation)")

ax = ss.plot_traces({"fit_sgd (adam)": fit})
ax.axhline(float(result.log_prob), color="k", ls="--", lw=1, label="least squares")
ax.set_ylim(float(result.log_prob) - 40, float(result.log_prob) + 5)
ax.legend()
plt.show()

# %% [markdown]
# ## Conditional or exact likelihood
#
# Conditioning on the first $p$ values throws away a little information. With
# `initial="stationary"` the pre-sample values are drawn from the model's stationary
# distribution instead, which gives the exact Gaussian likelihood of all $T$ values
# (the likelihood `statsmodels.tsa.arima.model.ARIMA` maximizes). The carry is then a
# Gaussian belief over the lag window rather than known values.

# %%
exact = ss.AR(order=2, initial="stationary")
print(f"conditional log p(y_3:T | y_1:2) = {float(ss.log_prob(model, params, y)):.4f}")
print(f"exact       log p(y_1:T)         = {float(ss.log_prob(exact, params, y)):.4f}")
exact_fit = ss.fit_sgd(exact, params, y, optimizer=optax.adam(5e-3),
                       num_steps=NUM_SGD_STEPS, key=jax.random.key(1), progress=False)
print(f"exact MLE: phi = {np.asarray(exact_fit.params.coeffs[:, 0, 0]).round(4)}, "
      f"log p(y) = {exact_fit.final_log_joint:.4f}")

# %% [markdown]
# ## Choosing the order
#
# Information criteria need likelihoods of the *same* observations. We use the exact
# likelihood evaluated at the least-squares estimates for each order, so every row scores
# all 114 years.

# %%
print(f"{'order':>5} {'k':>3} {'log-lik':>9} {'AIC':>8} {'BIC':>8}")
for p in range(1, 7):
    m = ss.AR(order=p, initial="stationary")
    est = ss.AR(order=p).fit_least_squares(y)
    ic = ss.information_criteria(m, est, y)
    print(f"{p:>5} {ic['num_params']:>3} {ic['log_lik']:>9.2f} {ic['aic']:>8.2f} "
          f"{ic['bic']:>8.2f}")

# %% [markdown]
# BIC prefers the AR(2); AIC, with its lighter penalty, leans to slightly larger orders.
#
# ## Missing years are marginalized, not imputed
#
# Suppose some years were never recorded. A mask marks observed values; the filter then
# keeps the missing values inside its state as Gaussian unknowns, so the likelihood is the
# exact marginal density of the years we have. Nothing is filled in.

# %%
rng = np.random.default_rng(0)
mask = np.ones(y.size, bool)
mask[rng.choice(np.arange(5, y.size), size=15, replace=False)] = False
y_gappy = np.where(mask, y, np.nan)

gappy_fit = ss.fit_sgd(exact, params, y_gappy, mask=mask, optimizer=optax.adam(5e-3),
                       num_steps=NUM_SGD_STEPS, key=jax.random.key(2), progress=False)
print(f"{(~mask).sum()} years masked; phi from the gappy series: "
      f"{np.asarray(gappy_fit.params.coeffs[:, 0, 0]).round(3)} "
      f"(complete series: {np.asarray(exact_fit.params.coeffs[:, 0, 0]).round(3)})")

res = ss.filter(exact, gappy_fit.params, y_gappy, mask=mask, return_carries=True)
# the carry after step t holds the belief over (y_t, y_{t-1}); its first entry is y_t
belief_mean = np.asarray(res.carries.mean[:, 0])
belief_sd = np.sqrt(np.maximum(np.asarray(res.carries.cov[:, 0, 0]), 0.0))
fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(years, y_gappy, "k.-", lw=0.8, label="observed")
miss = ~mask
ax.errorbar(years[miss], belief_mean[miss], yerr=1.64 * belief_sd[miss], fmt="o",
            color="C3", ms=4, label="filtered belief at missing years (90%)")
ax.plot(years[miss], y[miss], "x", color="C0", label="true (hidden) value")
ax.set(xlabel="year", ylabel="log10 lynx")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Forecasts with uncertainty
#
# `ss.forecast` filters the history and then samples future paths one step at a time
# (predict, draw, update), so the paths carry the model's full predictive uncertainty. We
# hold out the last 14 years, fit to the rest, and check the held-out values against the
# intervals.

# %%
horizon = 14
y_train, y_test = y[:-horizon], y[-horizon:]
train_params = ss.AR(order=2).fit_least_squares(y_train)
fc = ss.forecast(model, train_params, y_train, num_steps=horizon, num_samples=NUM_SAMPLES,
                 key=jax.random.key(3))
lo, hi = fc.interval(0.9)
coverage = np.mean((y_test >= np.asarray(lo)) & (y_test <= np.asarray(hi)))
score = ss.log_score(model, train_params, y_train, y_test)
print(f"90% interval coverage on the held-out years: {coverage:.0%}")
print(f"held-out one-step log score log p(y_test | y_train) = {score:.2f}")

ax = fc.plot(time=years[:-horizon], future_time=years[-horizon:])
ax.plot(years[-horizon:], y_test, "ko", ms=3, label="held out")
ax.set(xlabel="year", ylabel="log10 lynx", title="AR(2) forecast, 50% and 90% intervals")
ax.legend(fontsize=8, loc="upper left")
plt.show()

# %% [markdown]
# ## Simulating from the model
#
# Because the model is a distribution over sequences, `ss.sample` draws whole series by
# ancestral sampling. Simulations from the fitted AR(2) cycle like the data, a quick
# posterior-predictive style check of the fit.

# %%
sims = ss.sample(exact, exact_fit.params, num_timesteps=y.size, num_samples=3,
                 key=jax.random.key(4))
fig, axes = plt.subplots(4, 1, figsize=(9, 6), sharex=True, sharey=True)
axes[0].plot(years, y, "k", lw=1)
axes[0].set_title("observed and three simulated series", fontsize=9)
for ax, sim in zip(axes[1:], np.asarray(sims), strict=True):
    ax.plot(years, sim, color="C0", lw=1)
plt.show()

# %% [markdown]
# ## Saving a fitted model
#
# `ss.save` writes the model's configuration and parameters to a portable `.npz` file with
# JSON metadata (no pickle); `ss.load` checks the file and rebuilds both.

# %%
import tempfile  # noqa: E402

path = ss.save(os.path.join(tempfile.mkdtemp(), "lynx_ar2"), exact, exact_fit.params)
loaded_model, loaded_params = ss.load(path)
print(loaded_model, float(ss.log_prob(loaded_model, loaded_params, y)))
