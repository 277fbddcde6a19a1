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
# # Forecasting from context: electricity demand with a temperature forecast
#
# Day-ahead electricity demand is the textbook case of a forecast that should *read its
# context*: the last days of demand, the hour of the day, whether tomorrow is a working
# day, and the temperature tomorrow (in practice a weather forecast; here the observed
# temperature stands in for it). We forecast the hourly demand of the state of Victoria,
# Australia, in 2014 (`ss.datasets.load_electricity_demand()`, R's `fpp2::elecdemand`
# aggregated to hours; AEMO demand, Melbourne temperature) 24 hours ahead from every
# midnight, and compare
#
# 1. a **seasonal structural model** (random-walk level, a stochastic daily cycle and a
#    regression on the covariates; Kalman filter, exact likelihood),
# 2. the same structural model **without the temperature**, to see what the covariate buys,
# 3. an **autoregressive GRU** reading $[y_{t-1}, u_t]$,
# 4. a causal **Transformer** (`ss.Transformer`) with a one-week attention window,
# 5. an **encoder-decoder** (`ss.EncoderDecoder`, GRU encoder and decoder): the encoder
#    summarizes the past, the decoder generates the next day from that summary and the
#    next day's covariates, trained on (one week, next day) windows,
#
# in a rolling-origin backtest (`ss.backtest`) scored by the log score, the CRPS and the
# coverage of the central intervals at each horizon (as in vignette 07). Every model
# reads the same known-ahead covariates $u_t$ over the forecast horizon
# (`backtest(..., inputs=u)` passes the future rows to the forecasts).

# %%
import os
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # numpyro's tqdm import

import jax  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import statseq as ss  # noqa: E402

jax.config.update("jax_enable_x64", True)
SMOKE = os.environ.get("STATSEQ_SMOKE", "") not in ("", "0")  # fast mode for the tests
WEEK = 7 * 24
NUM_TRAIN = (2 if SMOKE else 8) * WEEK  # from 1 Jan: 8 summer weeks, with two heat waves
H = 24  # forecast horizon: the next day, hour by hour
NUM_TEST = 2 * H if SMOKE else 4 * WEEK  # then daily origins for four weeks
NUM_SAMPLES = 50 if SMOKE else 500
NUM_PATHS = 50 if SMOKE else 500  # Monte Carlo paths for the neural log scores
NUM_SGD = 10 if SMOKE else 400

elec = ss.datasets.load_electricity_demand().iloc[: NUM_TRAIN + NUM_TEST]
y = elec["demand"].to_numpy()
temp = elec["temperature"].to_numpy()
workday = elec["workday"].to_numpy(float)
hour = elec.index.hour.to_numpy()
print(f"{y.size} hours, {elec.index[0]} to {elec.index[-1]}; training on the first "
      f"{NUM_TRAIN} hours (to {elec.index[NUM_TRAIN - 1]})")

fig, ax = plt.subplots(figsize=(10, 3))
ax.plot(elec.index, y, "k-", lw=0.5, label="demand (GW)")
ax.axvspan(elec.index[NUM_TRAIN], elec.index[-1], color="0.9", zorder=0,
           label="backtest period")
ax2 = ax.twinx()
ax2.plot(elec.index, temp, color="C3", lw=0.4, alpha=0.7)
ax2.set_ylabel("temperature (°C)", color="C3")
ax.set(xlabel="time", ylabel="demand (GW)", title="Victoria electricity demand, 2014")
ax.legend(fontsize=8, loc="upper right")
plt.show()

# %% [markdown]
# ## 1. The covariates
#
# Demand rises on hot afternoons (air conditioning), so the temperature enters through
# its standardized value $\tau_t$ and its square (a U-shaped response). The daily cycle
# differs between working days and weekends or holidays. The structural model carries a
# stochastic daily cycle (`TrigSeasonal(24, harmonics=4)`) and reads the working-day
# indicator and its products with two daily harmonics; the networks read the indicator
# and the two harmonics themselves (they can form the products). All of these are known
# in advance.

# %%
tau = (temp - temp[:NUM_TRAIN].mean()) / temp[:NUM_TRAIN].std()
harm = np.column_stack([f(2 * np.pi * k * hour / 24) for k in (1, 2) for f in (np.sin, np.cos)])
u_struct = np.column_stack([tau, tau**2, workday, workday[:, None] * harm])
# without the temperature: the same model (one compiled program) with those columns 0
u_struct_notemp = np.column_stack([np.zeros((y.size, 2)), u_struct[:, 2:]])
u_net = np.column_stack([tau, tau**2, workday, harm])
origins = np.arange(NUM_TRAIN, y.size - H + 1, H)  # every midnight of the test period
print(f"{origins.size} origins, {H} hours each; inputs: structural {u_struct.shape[1]}, "
      f"networks {u_net.shape[1]}")

# %% [markdown]
# ## 2. The forecasters
#
# All parameters are estimated once on the training weeks and kept fixed in the
# backtest (each forecast still conditions on all the demand up to its origin). The
# structural models are fitted by maximum likelihood (L-BFGS); the networks by Adam on
# the training log-likelihood, with the last week held out for early stopping.

# %%
t0 = time.perf_counter()
y_train = y[:NUM_TRAIN]


structural = ss.StructuralModel((ss.Trend(), ss.TrigSeasonal(24, harmonics=4)),
                                input_dim=u_struct.shape[1])


def fit_structural(model, inputs):
    start = model.initialize(y_train, inputs=inputs[:NUM_TRAIN])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a variance on the boundary 0
        fit = ss.fit_lbfgs(model, start, y_train, inputs=inputs[:NUM_TRAIN],
                           num_iters=10 if SMOKE else 150, progress=False)
    return fit.params


structural_params = fit_structural(structural, u_struct)
structural0_params = fit_structural(structural, u_struct_notemp)
beta = np.asarray(structural_params.regression)
print(f"structural: temperature coefficients {beta[0]:.3f} GW (linear), {beta[1]:.3f} GW "
      f"(square), working day {beta[2]:.3f} GW; obs. sd "
      f"{float(structural_params.obs_var) ** 0.5:.3f} GW ({time.perf_counter() - t0:.0f} s)")


def fit_network(model, seed):
    t0 = time.perf_counter()
    start = model.initialize(y_train, inputs=u_net[:NUM_TRAIN], key=jax.random.key(seed))
    fit = ss.fit_sgd(model, start, y_train, inputs=u_net[:NUM_TRAIN], num_steps=NUM_SGD,
                     learning_rate=0.01, clip_norm=10.0, validation=1 / 8, eval_every=10,
                     patience=10, key=jax.random.key(seed + 1), progress=False)
    print(f"{type(model).__name__}: {len(fit.log_joint)} Adam steps, training "
          f"log-likelihood per hour {float(fit.log_joint[-1]) / NUM_TRAIN:.3f} "
          f"({time.perf_counter() - t0:.0f} s)")
    return fit.params


gru = ss.GRU(input_dim=u_net.shape[1], hidden_dim=16)
gru_params = fit_network(gru, 0)
transformer = ss.Transformer(input_dim=u_net.shape[1], hidden_dim=16, num_layers=2,
                             num_heads=2, max_len=48 if SMOKE else WEEK)
transformer_params = fit_network(transformer, 2)

# %% [markdown]
# The encoder-decoder is trained on its own objective: windows of one week of context
# followed by one day, scored on the day only (`EncoderDecoder.windows`; the teacher-forced
# likelihood of the next day given the week before it). For forecasting, the same
# parameters go into the model without `context_length`: the encoder reads the whole
# history up to the origin, then the decoder samples the day.

# %%
t0 = time.perf_counter()
seq2seq_train = ss.EncoderDecoder(encoder=ss.GRU(hidden_dim=16), input_dim=u_net.shape[1],
                                  context_length=WEEK)
windows, scored, window_inputs = seq2seq_train.windows(y_train, horizon=H, stride=12,
                                                       inputs=u_net[:NUM_TRAIN])
start = seq2seq_train.initialize(windows, inputs=window_inputs, key=jax.random.key(4))
seq2seq_fit = ss.fit_sgd(seq2seq_train, start, windows, inputs=window_inputs, scored=scored,
                         num_steps=NUM_SGD, learning_rate=0.01, clip_norm=10.0,
                         batch_size=min(32, windows.shape[0]), key=jax.random.key(5),
                         progress=False)
seq2seq = ss.EncoderDecoder(encoder=ss.GRU(hidden_dim=16), input_dim=u_net.shape[1])
seq2seq_params = seq2seq_fit.params
print(f"EncoderDecoder: {windows.shape[0]} windows of {windows.shape[1]} hours, "
      f"{len(seq2seq_fit.log_joint)} Adam steps ({time.perf_counter() - t0:.0f} s)")

# %% [markdown]
# ## 3. Rolling-origin backtest

# %%
forecasters = {
    "structural": (structural, structural_params, u_struct),
    "structural, no temperature": (structural, structural0_params, u_struct_notemp),
    "GRU": (gru, gru_params, u_net),
    "Transformer": (transformer, transformer_params, u_net),
    "encoder-decoder": (seq2seq, seq2seq_params, u_net),
}
results = {}
for name, (model, params, inputs) in forecasters.items():
    t0 = time.perf_counter()
    results[name] = ss.backtest(model, params, y, horizon=H, origins=origins, inputs=inputs,
                                num_samples=NUM_SAMPLES, levels=(0.8, 0.95),
                                num_paths=NUM_PATHS, key=jax.random.key(0))
    print(f"{name}: {time.perf_counter() - t0:.0f} s")


def by_horizon(column):
    return pd.DataFrame({name: r.summary[column] for name, r in results.items()})


crps_h, logs_h = by_horizon("crps"), by_horizon("log_score")
cov80_h, cov95_h = by_horizon("coverage_80"), by_horizon("coverage_95")
overall = pd.DataFrame({
    "CRPS h=1": crps_h.loc[1], "CRPS mean": crps_h.mean(), "CRPS h=24": crps_h.loc[H],
    "log score h=1": logs_h.loc[1], "log score mean": logs_h.mean(),
    "coverage 80%": cov80_h.mean(), "coverage 95%": cov95_h.mean(),
})
print(overall.round(3).to_string())
print("\nmean CRPS (GW) at horizons 1, 6, 12, 18, 24:")
print(crps_h.loc[[1, 6, 12, 18, 24]].round(3).to_string())

fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
for name in results:
    axes[0].plot(crps_h.index, crps_h[name], "o-", ms=2, label=name)
    axes[1].plot(logs_h.index, logs_h[name], "o-", ms=2, label=name)
    axes[2].plot(cov80_h.index, cov80_h[name], "o-", ms=2, label=name)
axes[0].set(xlabel="horizon (hours)", ylabel="mean CRPS (GW)", title="CRPS (lower is better)")
axes[1].set(xlabel="horizon (hours)", ylabel="mean log score",
            title="log score (higher is better)")
axes[2].axhline(0.8, color="k", ls="--", lw=0.8, label="nominal 80%")
axes[2].set(xlabel="horizon (hours)", ylabel="coverage", ylim=(0, 1.05),
            title="80% interval coverage")
for ax in axes:
    ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# ## 4. One day ahead, drawn
#
# The forecasts from the origin before the hottest day of the backtest period.

# %%
day_max = pd.Series(temp[origins[:, None] + np.arange(H)].max(axis=1), index=origins)
o_hot = int(day_max.idxmax())
i_hot = int(np.flatnonzero(origins == o_hot)[0])
print(f"hottest forecast day: {elec.index[o_hot].date()}, maximum {day_max.max():.1f} °C")
fig, axes = plt.subplots(1, len(results), figsize=(16, 3), sharey=True)
hours = np.arange(o_hot - 24, o_hot + H)
for ax, (name, r) in zip(axes, results.items(), strict=True):
    draws = r.samples[i_hot]
    lo, hi = np.quantile(draws, [0.1, 0.9], axis=0)
    ax.plot(elec.index[hours], y[hours], "k-", lw=1, label="demand")
    ax.fill_between(elec.index[o_hot:o_hot + H], lo, hi, color="C0", alpha=0.3,
                    label="80% interval")
    ax.plot(elec.index[o_hot:o_hot + H], draws.mean(axis=0), "C0-", lw=1, label="mean")
    ax.set_title(name, fontsize=9)
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
axes[0].set_ylabel("demand (GW)")
axes[0].legend(fontsize=7)
plt.show()

# %% [markdown]
# ## 5. What the tables say
#
# In full mode (eight training weeks, 28 daily origins from 26 February to 25 March,
# the numbers printed above) the ranking is:
#
# - **The GRU has the lowest mean CRPS** (0.13 GW over the 24 hours, against 0.22 GW for
#   the structural model) and the highest mean log score; the **encoder-decoder** is
#   close behind on the CRPS (0.15 GW) and is the best forecaster one hour ahead
#   (CRPS 0.04 GW and log score 1.17 at $h = 1$). Both networks learned the daily
#   profile and the temperature response well enough to beat the structural model at
#   every horizon in the CRPS table.
# - **The Transformer** is as good as the others one hour ahead but loses accuracy
#   quickly over the day (mean CRPS 0.20 GW), and it has the worst mean log score:
#   eight weeks of hourly data are little for an attention model.
# - **The networks' intervals are too narrow**: their 80% intervals cover 57-70% of the
#   outcomes (their 95% intervals 78-87%). The structural model errs the other way (80%
#   intervals cover 95%): its random-walk level accumulates variance over the day. Its
#   log score is lower than the GRU's, but its probabilities are conservative, not
#   overconfident.
# - **The temperature helps the structural model in the first hours** (CRPS at $h = 1$
#   0.11 against 0.16 GW without it, mean log score -0.50 against -0.60) but hardly over
#   the whole day (mean CRPS 0.224 against 0.232 GW): a single quadratic response in the
#   observation equation is a crude description of air-conditioning load, which the
#   networks capture better.
#
# These are four weeks of late-summer forecasts from one training period and one seed per
# network; with 28 origins the differences between the GRU and the encoder-decoder are
# within the noise of such a backtest, while the gaps to the structural model and to
# the Transformer are large.

# %%
if not SMOKE:
    assert crps_h.mean()[["GRU", "encoder-decoder"]].max() < crps_h.mean()["structural"]
    assert crps_h.mean().idxmin() == "GRU"
    assert crps_h.loc[1].idxmin() == "encoder-decoder"
    assert logs_h.loc[1].idxmax() == "encoder-decoder"
    assert logs_h.mean().idxmin() == "Transformer"
    assert crps_h.mean()["Transformer"] > crps_h.mean()[["GRU", "encoder-decoder"]].max()
    assert all(cov80_h[m].mean() < 0.75 for m in ("GRU", "Transformer", "encoder-decoder"))
    assert cov80_h["structural"].mean() > 0.9
    assert logs_h.mean()["structural"] > logs_h.mean()["structural, no temperature"]
    assert crps_h.loc[1, "structural"] < 0.8 * crps_h.loc[1, "structural, no temperature"]
    assert abs(crps_h.mean()["structural"] - crps_h.mean()["structural, no temperature"]) < 0.02
