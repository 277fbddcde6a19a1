# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # A throwaway vignette
#
# Fit an AR(2) to the lynx series.

# %%
import os
import jax
import numpy as np
import matplotlib.pyplot as plt
import statseq as ss

print("SMOKE:", os.environ.get("STATSEQ_SMOKE"), "MPLBACKEND:", os.environ.get("MPLBACKEND"))
y = np.log10(ss.datasets.load_lynx().to_numpy())
model = ss.AR(order=2)
params = model.fit_least_squares(y)
fc = ss.forecast(model, params, y, num_steps=10, num_samples=500, key=jax.random.key(0))
fc.plot()
plt.show()

# %% [markdown]
# ## Second section
