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
# 1. the local level model of the Nile, fitted by maximum likelihood and checked against
#    the published estimates;
# 2. filtering and smoothing the level, and what the Kalman gain does;
# 3. missing years, and a ten-year forecast;
# 4. a bivariate model (lynx and sunspots) fitted by EM and by gradient ascent.

# %%
import os
import warnings

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

import statseq as ss

jax.config.update("jax_enable_x64", True)  # float64, so that comparisons show rounding only
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests
NUM_SGD_STEPS_NILE = 150 if SMOKE else 1000
NUM_EM_ITERS = 50 if SMOKE else 1000
NUM_SGD_STEPS = 100 if SMOKE else 1000

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
# In statseq this is a `LinearGaussianSSM` with a one-dimensional state, $F = H = 1$, zero
# biases and `initial="diffuse"`. A `trainable` mask (a pytree of booleans shaped like the
# parameters) freezes everything except the two variances, which are then the only
# parameters the fit moves.

# %%
model = ss.LinearGaussianSSM(state_dim=1, emission_dim=None, initial="diffuse")
half_var = float(np.var(y)) / 2
start = model.default_params()._replace(
    dynamics_weights=jnp.ones((1, 1)),
    emission_weights=jnp.ones((1, 1)),
    dynamics_cov=jnp.full((1, 1), half_var),  # sigma2_eta
    emission_cov=jnp.full((1, 1), half_var),  # sigma2_eps
)
trainable = jax.tree.map(lambda _: False, start)._replace(dynamics_cov=True, emission_cov=True)
print("trainable leaves:", [k for k, v in trainable._asdict().items() if v])
print(f"log p(y) at the start = {float(ss.log_prob(model, start, y)):.4f}")

# %% [markdown]
# Two maximizers of the same objective: Adam on the unconstrained parameters
# (`ss.fit_sgd`; the variances are optimized on the log scale), and EM (`ss.fit_em`),
# whose M-step for a frozen $F$ and $H$ updates only the two variances.

# %%
nile_sgd = ss.fit_sgd(model, start, y, optimizer=optax.adam(0.05),
                      num_steps=NUM_SGD_STEPS_NILE, key=jax.random.key(0),
                      trainable=trainable, progress=False)
nile_em = ss.fit_em(model, start, y, num_iters=2000, tol=1e-12, trainable=trainable,
                    progress=False)
params = nile_sgd.params
s2_eps, s2_eta = float(params.emission_cov[0, 0]), float(params.dynamics_cov[0, 0])

rows = [
    ("fit_sgd (adam)", s2_eps, s2_eta, nile_sgd.final_log_joint),
    ("fit_em", float(nile_em.params.emission_cov[0, 0]),
     float(nile_em.params.dynamics_cov[0, 0]), nile_em.final_log_joint),
]
try:
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sm = UnobservedComponents(y, "llevel", use_exact_diffuse=True).fit(disp=False)
    rows.append(("statsmodels UC", float(sm.params[0]), float(sm.params[1]), float(sm.llf)))
    sm_at_ours = float(UnobservedComponents(y, "llevel", use_exact_diffuse=True)
                       .loglike([s2_eps, s2_eta]))
except ImportError:  # statsmodels is a test extra, not a run-time dependency
    sm_at_ours = None
rows.append(("Durbin & Koopman", 15099.0, 1469.1, -632.54))

print(f"{'':>18} {'sigma2_eps':>11} {'sigma2_eta':>11} {'log-lik':>10}")
for name, e, h, ll in rows:
    print(f"{name:>18} {e:>11.1f} {h:>11.1f} {ll:>10.4f}")
print(f"fit_sgd: {nile_sgd.num_iterations} steps; fit_em: {nile_em.num_iterations} iterations")
if sm_at_ours is not None:
    print(f"statsmodels' log-likelihood at the statseq estimates: {sm_at_ours:.4f}")
print(f"published minus statseq log-likelihood: {-632.54 - nile_sgd.final_log_joint:.4f}; "
      f"0.5 log(2 pi) = {0.5 * np.log(2 * np.pi):.4f}")

# %% [markdown]
# Both statseq fits agree with the published variances to about one part in ten
# thousand, and with each other. statsmodels' own optimizer stops a little short of the
# maximum (compare its variances), but at the statseq estimates its exact diffuse
# log-likelihood is the same number statseq reports. The value printed in the book is
# higher by 0.92, close to the constant $\frac{1}{2}\log 2\pi = 0.919$, which points to a
# different convention for the constant term of the diffuse first observation (the
# book's two decimals do not settle it exactly). A constant does not move the maximum.
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
# $\mathrm{E}[\mu_t \mid y_{1:T}]$ uses the whole series. `model.filter_states` and
# `model.smoother` return both with their variances; we draw 90% bands.

# %%
filt = model.filter_states(params, y)
smooth = model.smoother(params, y)
z90 = 1.6449
f_mean, f_sd = np.asarray(filt.filtered_means[:, 0]), np.sqrt(np.asarray(filt.filtered_covs[:, 0, 0]))
s_mean, s_sd = np.asarray(smooth.smoothed_means[:, 0]), np.sqrt(np.asarray(smooth.smoothed_covs[:, 0, 0]))

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
print(f"filtered sd of the level: {f_sd[1]:.1f} after two years, {f_sd[-1]:.1f} at the end")
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
# \mathrm{E}[\mu_t \mid y_{1:t-1}]), \qquad K_t = \frac{P_t}{P_t + \sigma^2_\varepsilon}.$$
#
# A large $P_t$ (little known about the level) gives a gain near 1: believe the new
# observation. As evidence accumulates, $P_t$ settles to the fixed point of the Riccati
# recursion, $\bar P = \tfrac{1}{2}\sigma^2_\varepsilon\,(q + \sqrt{q^2 + 4q})$, and the
# filter becomes an exponentially weighted moving average with constant weight
# $\bar K = \bar P / (\bar P + \sigma^2_\varepsilon)$.

# %%
pred_var = np.asarray(filt.predicted_covs[:, 0, 0])
gain = pred_var / (pred_var + s2_eps)
p_bar = 0.5 * s2_eps * (q + np.sqrt(q * q + 4 * q))
k_bar = p_bar / (p_bar + s2_eps)
print("predicted variances P_t, first 5 years:", pred_var[:5].round(1))
print("gains K_t, years 2-8:", gain[1:8].round(4))
print(f"steady state: P = {p_bar:.1f}, K = {k_bar:.4f}; last year's K_t = {gain[-1]:.4f}")

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(years[1:], gain[1:], "o-", ms=3, label="$K_t$")
ax.axhline(k_bar, color="k", ls="--", lw=1, label=r"steady state $\bar K$")
ax.set(xlabel="year", ylabel="Kalman gain", title="The gain settles within a few years")
ax.legend()
plt.show()

# %% [markdown]
# (In 1871 the level is diffuse: its predicted variance is infinite, the gain is 1 and the
# filtered level is the first observation itself. The printed $P_1 = 0$ is only the finite
# part of that variance; the exact diffuse filter carries the infinite part separately.
# The plot starts in 1872.) The steady-state gain says that, once settled, each year's observation
# moves the estimated level by about a quarter of its surprise.
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
smooth_gap = model.smoother(params, y_gap, mask=mask)
g_mean = np.asarray(smooth_gap.smoothed_means[:, 0])
g_sd = np.sqrt(np.asarray(smooth_gap.smoothed_covs[:, 0, 0]))
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
# $P_{T+1} + (h-1)\sigma^2_\eta + \sigma^2_\varepsilon$.

# %%
horizon = 10
fc = model.forecast_moments(params, y, num_steps=horizon)
lo90, hi90 = (np.asarray(a) for a in fc.interval(0.9))
lo50, hi50 = (np.asarray(a) for a in fc.interval(0.5))
future = years[-1] + np.arange(1, horizon + 1)
print(f"forecast mean {float(fc.mean[0]):.1f} for every year 1971-1980 "
      f"(last filtered level {f_mean[-1]:.1f})")
print(f"90% interval 1971: ({lo90[0]:.0f}, {hi90[0]:.0f}); 1980: ({lo90[-1]:.0f}, {hi90[-1]:.0f})")

# the fan chart is drawn by hand from the exact intervals
fig, ax = plt.subplots(figsize=(9, 3.5))
ax.plot(years, y, "k", lw=1, label="observed")
ax.fill_between(future, lo90, hi90, color="C0", alpha=0.2, lw=0, label="90% interval")
ax.fill_between(future, lo50, hi50, color="C0", alpha=0.4, lw=0, label="50% interval")
ax.plot(future, np.asarray(fc.mean), color="C0", lw=1.5, label="mean")
ax.set(xlabel="year", ylabel="flow", title="Local level forecast, 1971-1980")
ax.legend(fontsize=8, loc="upper right")
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
# directions of the data). From that one start, EM and Adam maximize the same log
# likelihood; each records it at every iteration.

# %%
biv = ss.LinearGaussianSSM(state_dim=2, emission_dim=2, initial="diffuse")
biv_start = biv.initialize(Y, key=jax.random.key(1))
print(f"log p(Y) at the start = {float(ss.log_prob(biv, biv_start, Y)):.4f}")

em = ss.fit_em(biv, biv_start, Y, num_iters=NUM_EM_ITERS, tol=1e-9, progress=False)
sgd = ss.fit_sgd(biv, biv_start, Y, optimizer=optax.adam(0.02), num_steps=NUM_SGD_STEPS,
                 key=jax.random.key(2), progress=False)
em_trace = np.asarray(em.log_joint)[np.isfinite(np.asarray(em.log_joint))]
sgd_trace = np.asarray(sgd.log_joint)
print(f"EM:   log p(Y) = {em.final_log_joint:.4f} after {em.num_iterations} iterations "
      f"({em.wall_time:.1f} s); largest decrease between iterations "
      f"{max(0.0, -np.diff(em_trace).min()):.2e}")
print(f"Adam: log p(Y) = {sgd.final_log_joint:.4f} after {sgd.num_iterations} steps "
      f"({sgd.wall_time:.1f} s); best along the way {np.nanmax(sgd_trace):.4f}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
ss.plot_traces({"EM": em, "Adam (fit_sgd)": sgd}, ax=axes[0])
axes[0].set_ylim(np.nanmax(sgd_trace) - 60, max(em.final_log_joint, np.nanmax(sgd_trace)) + 5)
axes[0].set_title("log-likelihood")
ss.plot_traces({"EM": em, "Adam (fit_sgd)": sgd}, ax=axes[1], relative=True)
axes[1].set_title("distance below the best value reached")
plt.show()

# %% [markdown]
# Both traces are the same quantity, the exact diffuse log-likelihood, so the curves can
# share an axis. EM's trace never decreases (each iteration maximizes a lower bound that
# touches the log-likelihood at the current parameters, and the printed largest decrease
# is zero). Adam's steps carry no such guarantee: its trace can dip (its final value is
# below the best it reached), but on this problem it gets higher within the same number
# of iterations. The reason shows in the estimates below: the measurement noise $R$ is
# heading towards zero, a boundary of the parameter space, where EM is known to converge
# slowly, and neither method has fully converged in the budget.
#
# What did the model learn? The eigenvalues of the fitted $F$:

# %%
for name, fit in [("EM", em), ("Adam", sgd)]:
    eig = np.linalg.eigvals(np.asarray(fit.params.dynamics_weights))
    period = 2 * np.pi / abs(np.angle(eig[0])) if abs(eig[0].imag) > 1e-12 else np.inf
    print(f"{name:>4}: eigenvalues of F {np.round(eig, 3)}, modulus {abs(eig[0]):.3f}, "
          f"period {period:.1f} years; diag(R) = "
          f"{np.diag(np.asarray(fit.params.emission_cov)).round(4)}")

# %% [markdown]
# The two fits agree closely. The eigenvalues are nearly real with modulus about 0.8, so
# the two-dimensional state describes year-to-year persistence, not the ten-year cycles
# visible in the plot (the implied period is printed above). With $R$ near zero the model
# is close to a first-order vector autoregression of the two series. A cycle in each
# series needs at least two state dimensions per series; with four states, though, the
# likelihood of this model is unbounded (EM drives $R$, part of $Q$ and the initial
# covariance to zero), so a richer model needs constraints or priors, which is beyond
# this tutorial.
