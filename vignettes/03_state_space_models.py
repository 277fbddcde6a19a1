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
# # State space models: the Nile, the Kalman filter, EM and gradients
#
# A linear Gaussian state space model explains a series by an unobserved state $x_t$ that
# evolves by a linear recursion and is observed with noise,
#
# $$x_{t+1} = F x_t + w_t, \quad w_t \sim \mathcal{N}(0, Q), \qquad
# y_t = H x_t + d + v_t, \quad v_t \sim \mathcal{N}(0, R).$$
#
# In statseq's terms the carry of this model is the Kalman filter's Gaussian belief about
# the state, so the log-likelihood is again a sum of one-step predictive log-densities,
# computed exactly by the Kalman filter.
#
# The sections are:
#
# 1. the local level model of the Nile, fitted by maximum likelihood (with standard
#    errors) and checked against the published estimates;
# 2. filtering and smoothing the level, and what the Kalman gain does;
# 3. missing years, and a ten-year forecast;
# 4. a bivariate model (lynx and sunspots) fitted by EM and by gradient ascent.

# %%
import os
import warnings

import jax
import matplotlib.pyplot as plt
import numpy as np
import optax

import statseq as ss

jax.config.update("jax_enable_x64", True)  # float64, so that comparisons show rounding only
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests
NUM_SGD_STEPS_NILE = 1000  # Adam on the Nile runs only in the full run
NUM_EM_ITERS = 20 if SMOKE else 1000
NUM_SGD_STEPS = 50 if SMOKE else 1000

nile = ss.datasets.load_nile()
y = nile.to_numpy().astype(float)
years = nile.index.to_numpy()
print(f"{y.size} years, {years[0]}-{years[-1]}: mean flow {y.mean():.0f}, "
      f"standard deviation {y.std(ddof=1):.0f} (10^8 m^3 per year)")

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(years, y, "k.-", lw=0.8)
ax.set(xlabel="year", ylabel="flow (10^8 m^3)", title="Annual flow of the Nile at Aswan")
plt.show()

# %% [markdown]
# ## 1. The local level model
#
# The flow drops around 1899 (the first Aswan dam was built then) and otherwise wanders
# around a slowly moving level. The **local level model** of Durbin and Koopman's *Time
# Series Analysis by State Space Methods* (2012, ch. 2) says exactly that: the observation
# is a level plus noise, and the level is a random walk,
#
# $$y_t = \mu_t + \varepsilon_t, \quad \varepsilon_t \sim \mathcal{N}(0, \sigma^2_\varepsilon),
# \qquad \mu_{t+1} = \mu_t + \eta_t, \quad \eta_t \sim \mathcal{N}(0, \sigma^2_\eta).$$
#
# A random walk has no stationary distribution, so the first level gets an **exact diffuse**
# prior (infinite variance): the first observation is spent learning where the level is,
# and the likelihood is the diffuse likelihood of the remaining 99 observations.
#
# In statseq this is `ss.LocalLevel()`, with parameters
# `ss.LocalLevelParams(obs_var, level_var)` $= (\sigma^2_\varepsilon, \sigma^2_\eta)$. (It is
# the same model as a `LinearGaussianSSM` with a one-dimensional state, $F = H = 1$, zero
# biases and `initial="diffuse"`, with only the two variances free.)
#
# `model.initialize(y)` gives a data-based start, and `ss.fit_lbfgs` maximizes the exact
# diffuse log-likelihood by a quasi-Newton method (L-BFGS on the log variances, as
# statsmodels' `fit()` does). `ss.summary` then prints the estimates with standard errors
# from the observed information (the curvature of the log-likelihood at the maximum), the
# log-likelihood and the information criteria.

# %%
model = ss.LocalLevel()
start = model.initialize(y)
print(f"start: sigma2_eps = {float(start.obs_var):.1f}, sigma2_eta = {float(start.level_var):.1f}, "
      f"log p(y) = {float(ss.log_prob(model, start, y)):.4f}")
fit = ss.fit_lbfgs(model, start, y, progress=False)
params = fit.params
s2_eps, s2_eta = float(params.obs_var), float(params.level_var)
print(ss.summary(model, params, y, fit=fit))

# %% [markdown]
# The same maximum is checked against the published values (Durbin and Koopman, 2012,
# ch. 2) and, when statsmodels is installed, against its `UnobservedComponents`
# model with an exact diffuse start. The full run also fits the model by Adam
# (`ss.fit_sgd`), a first-order method that needs many more steps; the smoke test skips
# these comparisons. (The local level model has no EM steps in statseq.)

# %%
rows = [("fit_lbfgs", s2_eps, s2_eta, fit.final_log_joint)]
sm_at_ours = None
if not SMOKE:
    sgd_nile = ss.fit_sgd(model, start, y, optimizer=optax.adam(0.05),
                          num_steps=NUM_SGD_STEPS_NILE, key=jax.random.key(0), progress=False)
    rows.append(("fit_sgd (adam)", float(sgd_nile.params.obs_var),
                 float(sgd_nile.params.level_var), sgd_nile.final_log_joint))
    try:
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            uc = UnobservedComponents(y, "llevel", use_exact_diffuse=True)
            sm = uc.fit(disp=False)
            sm_at_ours = float(uc.loglike([s2_eps, s2_eta]))
        rows.append(("statsmodels UC", float(sm.params[0]), float(sm.params[1]), float(sm.llf)))
    except ImportError:  # statsmodels is a test extra, not a run-time dependency
        pass
rows.append(("Durbin & Koopman", 15099.0, 1469.1, -632.54))

print(f"{'':>18} {'sigma2_eps':>11} {'sigma2_eta':>11} {'log-lik':>10}")
for name, e, h, ll in rows:
    print(f"{name:>18} {e:>11.1f} {h:>11.1f} {ll:>10.4f}")
print(f"fit_lbfgs: {fit.num_iterations} iterations ({fit.wall_time:.1f} s including "
      f"compilation)" + ("" if SMOKE else f"; fit_sgd: {sgd_nile.num_iterations} steps "
                         f"({sgd_nile.wall_time:.1f} s)"))
if sm_at_ours is not None:
    print(f"statsmodels' log-likelihood at the statseq estimates: {sm_at_ours:.4f}")
gap = -632.54 - fit.final_log_joint
half_log_2pi = 0.5 * np.log(2 * np.pi)
print(f"published minus statseq log-likelihood: {gap:.4f} (+-0.005 from the book's rounding); "
      f"0.5 log(2 pi) = {half_log_2pi:.4f}; remainder {gap - half_log_2pi:.4f}")

# %% [markdown]
# The quasi-Newton fit reproduces the published variances to within a part in ten
# thousand in about ten iterations; Adam reaches the same log-likelihood only after many
# more steps. The standard error of $\sigma^2_\eta$ is almost as large as the estimate:
# a hundred years pin down the noise variance much better than the variance of the
# level's steps. statsmodels' own optimizer stops a little short of the maximum (compare
# its variances), but at the statseq estimates its exact diffuse log-likelihood is the
# same number statseq reports.
#
# The value printed in the book is higher by about 0.92. Most of that is the constant
# $\frac{1}{2}\log 2\pi = 0.919$, which suggests that the book counts the constant term
# $-\frac{1}{2}\log 2\pi$ for 99 rather than 100 observations (the diffuse first
# observation contributes none); the printed remainder is slightly larger than the
# book's rounding to two decimals allows, and we cannot account for it from the book
# alone. A constant does not move the maximum, and the variances agree.
#
# The signal-to-noise ratio $q = \sigma^2_\eta / \sigma^2_\varepsilon$ says how fast the
# level moves compared with the noise around it:

# %%
q = s2_eta / s2_eps
print(f"q = sigma2_eta / sigma2_eps = {q:.4f}")

# %% [markdown]
# ## 2. Filtering, smoothing and the Kalman gain
#
# The **filtered** level $\mathrm{E}[\mu_t \mid y_{1:t}]$ uses the data up to year $t$ (what
# an observer in year $t$ would know); the **smoothed** level
# $\mathrm{E}[\mu_t \mid y_{1:T}]$ uses the whole series. `model.decompose` returns both,
# with their standard deviations, for every component of a structural model (here the
# only component is the level); we draw 90% bands.

# %%
level = model.decompose(params, y)["level"]
z90 = 1.6449
f_mean, f_sd = np.asarray(level.filtered_mean), np.asarray(level.filtered_std)
s_mean, s_sd = np.asarray(level.smoothed_mean), np.asarray(level.smoothed_std)

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
for ax, mean, sd, title in [(axes[0], f_mean, f_sd, "filtered level"),
                            (axes[1], s_mean, s_sd, "smoothed level")]:
    ax.plot(years, y, "k.", ms=3, label="flow")
    ax.plot(years, mean, color="C0", label=title)
    ax.fill_between(years, mean - z90 * sd, mean + z90 * sd, color="C0", alpha=0.25,
                    lw=0, label="90% band")
    ax.set(xlabel="year", title=title)
    ax.legend(fontsize=8)
axes[0].set_ylabel("flow")
plt.show()
print(f"filtered sd of the level: {f_sd[0]:.1f} after one year (sqrt(sigma2_eps) = "
      f"{np.sqrt(s2_eps):.1f}), {f_sd[1]:.1f} after two, {f_sd[-1]:.1f} at the end")
print(f"smoothed sd of the level: {s_sd[0]:.1f} in 1871, {s_sd[50]:.1f} in 1921, "
      f"{s_sd[-1]:.1f} in 1970")

# %% [markdown]
# The smoothed level is smoother and its band narrower, because it also sees the years
# that follow; in the last year the two coincide. The smoothed band is widest at the ends
# of the series, where there is data on one side only.
#
# Each filtering step moves the level towards the new observation by a fraction of the
# prediction error, the **Kalman gain**. For the local level model, with $P_t$ the
# variance of the predicted level $\mu_t \mid y_{1:t-1}$,
#
# $$\mathrm{E}[\mu_t \mid y_{1:t}] = \mathrm{E}[\mu_t \mid y_{1:t-1}] + K_t\,(y_t -
# \mathrm{E}[\mu_t \mid y_{1:t-1}]), \qquad K_t = \frac{P_t}{P_t + \sigma^2_\varepsilon},$$
#
# and $P_{t+1} = \mathrm{Var}[\mu_t \mid y_{1:t}] + \sigma^2_\eta$, the filtered variance
# plus one step of the random walk. A large $P_t$ (little known about the level) gives a
# gain near 1: believe the new observation. As evidence accumulates, $P_t$ settles to the
# fixed point of the Riccati recursion,
# $\bar P = \frac{1}{2}\sigma^2_\varepsilon\,(q + \sqrt{q^2 + 4q})$, and the filter becomes
# an exponentially weighted moving average with constant weight
# $\bar K = \bar P / (\bar P + \sigma^2_\varepsilon)$.

# %%
pred_var = f_sd[:-1] ** 2 + s2_eta  # P_t for t = 1872, ..., 1970
gain = pred_var / (pred_var + s2_eps)
p_bar = 0.5 * s2_eps * (q + np.sqrt(q * q + 4 * q))
k_bar = p_bar / (p_bar + s2_eps)
print("predicted variances P_t, 1872-1876:", pred_var[:5].round(1))
print("gains K_t, 1872-1878:", gain[:7].round(4))
print(f"steady state: P = {p_bar:.1f}, K = {k_bar:.4f}; last year's K_t = {gain[-1]:.4f}")

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(years[1:], gain, "o-", ms=3, label="$K_t$")
ax.axhline(k_bar, color="k", ls="--", lw=1, label=r"steady state $\bar K$")
ax.set(xlabel="year", ylabel="Kalman gain", title="The gain settles within a few years")
ax.legend()
plt.show()

# %% [markdown]
# (In 1871 the level is diffuse: its predicted variance is infinite, the gain is 1 and the
# filtered level is the first observation itself, with variance $\sigma^2_\varepsilon$.
# The plot starts in 1872.) The steady-state gain says that, once settled, each year's
# observation moves the estimated level by about a quarter of its surprise.
#
# ## 3. Missing years and forecasts
#
# A mask marks the observed values. Here we hide two decades, 1891-1900 (which contains
# the break) and 1941-1950. The filter skips the update step in masked years (its
# prediction variance grows by $\sigma^2_\eta$ per year), and the smoother fills the gap
# from both sides, with bands that widen towards the middle of the gap.

# %%
missing = ((years >= 1891) & (years <= 1900)) | ((years >= 1941) & (years <= 1950))
mask = ~missing
y_gap = np.where(mask, y, np.nan)
level_gap = model.decompose(params, y_gap, mask=mask)["level"]
g_mean, g_sd = np.asarray(level_gap.smoothed_mean), np.asarray(level_gap.smoothed_std)
print(f"log p(observed years) = {float(ss.log_prob(model, params, y_gap, mask=mask)):.4f} "
      f"({mask.sum()} of {y.size} years)")
print("smoothed sd through the 1891-1900 gap:", g_sd[(years >= 1890) & (years <= 1901)].round(0))

fig, ax = plt.subplots(figsize=(9, 3.5))
ax.plot(years, y_gap, "k.", ms=3, label="observed")
ax.plot(years[missing], y[missing], "x", color="C3", ms=4, label="hidden")
ax.plot(years, g_mean, color="C0", label="smoothed level")
ax.fill_between(years, g_mean - z90 * g_sd, g_mean + z90 * g_sd, color="C0", alpha=0.25,
                lw=0, label="90% band")
for lo, hi in [(1891, 1900), (1941, 1950)]:
    ax.axvspan(lo - 0.5, hi + 0.5, color="0.9", zorder=0)
ax.set(xlabel="year", ylabel="flow", title="Smoothing through two missing decades")
ax.legend(fontsize=8, ncol=2)
plt.show()

# %% [markdown]
# Inside a gap the smoothed level is a straight line between the ends (the conditional
# mean of a random walk pinned at both ends), and its variance is that of a Brownian
# bridge, largest in the middle. The gap hides the 1899 break, so the smoother can only
# spread the drop evenly over the decade.
#
# A forecast continues the same recursion without observations. `model.forecast_moments`
# computes the exact predictive mean and variance of $y_{T+h}$ (no sampling): the mean
# stays at the last filtered level, and the variance grows linearly in $h$,
# $P_{T+1} + (h-1)\sigma^2_\eta + \sigma^2_\varepsilon$ with
# $P_{T+1} = \mathrm{Var}[\mu_T \mid y_{1:T}] + \sigma^2_\eta$. The forecast's own `plot`
# method draws the fan chart.

# %%
horizon = 10
fc = model.forecast_moments(params, y, num_steps=horizon)
future = years[-1] + np.arange(1, horizon + 1)
lo90, hi90 = (np.asarray(a) for a in fc.interval(0.9))
print(f"forecast mean {float(fc.mean[0]):.1f} for every year 1971-1980 "
      f"(last filtered level {f_mean[-1]:.1f})")
print(f"predictive sd {float(fc.std[0]):.1f} in 1971, {float(fc.std[-1]):.1f} in 1980; "
      f"by the formula {np.sqrt(f_sd[-1] ** 2 + s2_eta + s2_eps):.1f} and "
      f"{np.sqrt(f_sd[-1] ** 2 + horizon * s2_eta + s2_eps):.1f}")
print(f"90% interval 1971: ({lo90[0]:.0f}, {hi90[0]:.0f}); 1980: ({lo90[-1]:.0f}, {hi90[-1]:.0f})")

fig, ax = plt.subplots(figsize=(9, 3.5))
fc.plot(ax=ax, time=years, future_time=future)  # exact 50% and 90% intervals
ax.set(xlabel="year", ylabel="flow", title="Local level forecast, 1971-1980")
plt.show()

# %% [markdown]
# ## 4. A bivariate model fitted by EM and by gradient ascent
#
# statseq bundles no multivariate series, so we build one: the Canadian lynx trappings
# ($\log_{10}$) and the annual sunspot numbers (square root, the usual variance
# stabilizing transform) over their common years 1821-1934, each standardized. Both
# series cycle with a period near ten years, and whether the lynx cycle follows the
# sunspot cycle is an old question (Moran, 1949). We fit a `LinearGaussianSSM` with a
# two-dimensional state, a full $2 \times 2$ emission matrix and an exact diffuse
# initial state, so that $F$, $Q$, $H$, $d$ and $R$ are all estimated.

# %%
lynx, sun = ss.datasets.load_lynx(), ss.datasets.load_sunspots()
common = lynx.index.intersection(sun.index)
Y = np.column_stack([np.log10(lynx.loc[common].to_numpy(float)),
                     np.sqrt(sun.loc[common].to_numpy(float))])
Y = (Y - Y.mean(0)) / Y.std(0)
print(f"{Y.shape[0]} years ({common[0]}-{common[-1]}), {Y.shape[1]} series; "
      f"contemporaneous correlation {np.corrcoef(Y.T)[0, 1]:.3f}")

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(common, Y[:, 0], lw=1, label="log10 lynx (standardized)")
ax.plot(common, Y[:, 1], lw=1, label="sqrt sunspots (standardized)")
ax.set(xlabel="year")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# `model.initialize` gives a data-based start (emission weights from the principal
# directions of the data, distinct diagonal dynamics). From that one start, EM and Adam
# maximize the same log-likelihood; each records it at every iteration (EM's first entry
# is the log-likelihood at the start). The smoke test runs EM only, with few iterations.

# %%
biv = ss.LinearGaussianSSM(state_dim=2, emission_dim=2, initial="diffuse")
biv_start = biv.initialize(Y, key=jax.random.key(1))
fits = {"EM": ss.fit_em(biv, biv_start, Y, num_iters=NUM_EM_ITERS, tol=1e-9, progress=False)}
if not SMOKE:
    fits["Adam (fit_sgd)"] = ss.fit_sgd(biv, biv_start, Y, optimizer=optax.adam(0.02),
                                        num_steps=NUM_SGD_STEPS, key=jax.random.key(2),
                                        progress=False)
print(f"log p(Y) at the start = {float(fits['EM'].log_joint[0]):.4f}")
best = -np.inf
for name, res in fits.items():
    trace = np.asarray(res.log_joint)
    trace = trace[np.isfinite(trace)]
    best = max(best, trace.max())
    print(f"{name:>14}: log p(Y) = {res.final_log_joint:.4f} after {res.num_iterations} "
          f"iterations ({res.wall_time:.1f} s); best along the way {trace.max():.4f}, "
          f"largest decrease between iterations {max(0.0, -np.diff(trace).min()):.2e}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
ss.plot_traces(fits, ax=axes[0])
axes[0].set_ylim(best - 60, best + 5)
axes[0].set_title("log-likelihood")
ss.plot_traces(fits, ax=axes[1], relative=True)
axes[1].set_title("distance below the best value reached")
plt.show()

# %% [markdown]
# Both traces are the same quantity, the exact diffuse log-likelihood, so the curves can
# share an axis. EM's trace never decreases (each iteration maximizes a lower bound that
# touches the log-likelihood at the current parameters, and the printed largest decrease
# is zero). Adam's steps carry no such guarantee: in the full run its trace dips (its
# final value is below the best it reached), but on this problem it gets higher within
# the same number of iterations. The reason shows in the estimates below: the
# measurement noise $R$ is heading towards zero, a boundary of the parameter space,
# where EM is known to converge slowly, and neither method has fully converged in the
# budget.
#
# What did the model learn? The eigenvalues of the fitted $F$:

# %%
for name, res in fits.items():
    eig = np.linalg.eigvals(np.asarray(res.params.dynamics_weights))
    period = 2 * np.pi / abs(np.angle(eig[0])) if abs(eig[0].imag) > 1e-12 else np.inf
    print(f"{name:>14}: eigenvalues of F {np.round(eig, 3)}, modulus {abs(eig[0]):.3f}, "
          f"period {period:.1f} years; diag(R) = "
          f"{np.diag(np.asarray(res.params.emission_cov)).round(4)}")

# %% [markdown]
# The two fits of the full run agree closely. The eigenvalues are nearly real with modulus about 0.8, so
# the two-dimensional state describes year-to-year persistence, not the ten-year cycles
# visible in the plot (the implied period is printed above). With $R$ near zero the model
# is close to a first-order vector autoregression of the two series. A cycle in each
# series needs at least two state dimensions per series; with four states, though, the
# likelihood of this model is unbounded (EM drives $R$, part of $Q$ and the initial
# covariance to zero), so a richer model needs constraints or priors, which is beyond
# this tutorial.
