"""Mode-equivalence runs shared by the backbone tests (RWKV, mLSTM, AFT, linear attention): a
model's whole-sequence log-likelihood and its gradient in each evaluation mode, at several
lengths, and optionally by the generation step (`Steps`: a `jax.lax.scan` of ``model.step``,
what the filter runs on masked data and what sampling runs).

A length ``T`` below the longest one reuses the longest program with weights ``w_t = 1`` for
``t <= T`` and 0 after (the models are causal: the first ``T`` one-step log-densities of a
longer series are those of ``y_{1:T}``), so two compiles (``T = 1`` and the longest) serve
every length.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import statseq as ss


@dataclasses.dataclass(frozen=True)
class Steps:
    """The generation-step path of ``model`` as one more "mode" of `mode_runs`: the
    one-step log-densities from a `jax.lax.scan` of ``model.step`` (every step observed)."""

    model: Any


@partial(jax.jit, static_argnames="models")
def _value_and_grads(params, y, weights, models):
    """``sum_t w_t log p(y_t | y_{<t})`` and its gradient for each ``(name, model)``."""
    inputs = jnp.zeros((1, y.shape[0], 0))

    def loglik(model):
        def total(p):
            if isinstance(model, Steps):
                def one(carry, y_t):
                    lp, carry = model.model.step(p, carry, y_t, jnp.asarray(True),
                                                 inputs[0, 0])
                    return carry, lp

                log_probs = jax.lax.scan(one, model.model.initial_carry(p), y)[1]
            else:
                log_probs = model.complete_data_log_probs_batch(p, y[None], inputs)[0][0]
            return jnp.sum(weights * log_probs)
        return total

    return {name: jax.value_and_grad(loglik(model))(params) for name, model in models}


def mode_runs(models: dict, params, y, lengths) -> dict:
    """``{T: {mode: (log-likelihood, gradient)}}`` for ``models = {mode: model}`` (a value
    may be `Steps` of a model: the generation step)."""
    pairs = tuple(sorted(models.items()))
    longest = max(lengths)
    runs = {}
    for t_len in lengths:
        n = 1 if t_len == 1 else longest
        weights = (np.arange(n) < t_len).astype(float)
        runs[t_len] = _value_and_grads(params, jnp.asarray(y[:n]), jnp.asarray(weights),
                                       pairs)
    return runs


def assert_modes_agree(runs_at_t: dict, reference: str = "recurrent",
                       rtol: float = 1e-10) -> None:
    """Every mode's log-likelihood and gradient equal the ``reference`` mode's (relative
    ``rtol``; gradient entries against the largest one's scale), all finite and nonzero."""
    lp_r, g_r = runs_at_t[reference]
    assert np.isfinite(float(lp_r))
    flat_r = np.concatenate([np.ravel(a) for a in jax.tree.leaves(g_r)])
    scale = np.max(np.abs(flat_r))
    assert scale > 0 and np.all(np.isfinite(flat_r))
    others = set(runs_at_t) - {reference}
    assert others, "no mode to compare with the reference"
    for mode in others:
        lp, g = runs_at_t[mode]
        np.testing.assert_allclose(float(lp), float(lp_r), rtol=rtol)
        flat = np.concatenate([np.ravel(a) for a in jax.tree.leaves(g)])
        np.testing.assert_allclose(flat, flat_r, rtol=rtol, atol=rtol * scale)


def assert_missing_steps_match_whole_sequence(model, params, y, mask, modes) -> None:
    """The filter on ``y`` with missing steps (the generation step, one step at a time)
    against the whole-sequence backbone in each of ``modes`` fed the same network inputs
    (0 and indicator 0 at each gap): the same one-step log-probabilities, 0 at the gaps."""
    step = np.asarray(ss.filter(model, params, y, mask=mask).log_probs)
    assert np.all(step[~mask] == 0.0) and np.all(np.isfinite(step))
    head = model.head
    enc = jax.vmap(head.encode)(jnp.asarray(y), jnp.asarray(mask))
    xs = jnp.concatenate([jnp.zeros_like(enc[:1]), enc[:-1]])

    @jax.jit
    def whole(p, xs):
        return [dataclasses.replace(model, mode=m).backbone.sequence(p, xs) for m in modes]

    for hs in whole(params.backbone, xs):
        lp = np.where(mask, head.distribution(params.head, hs).log_prob(y), 0.0)
        np.testing.assert_allclose(lp, step, rtol=1e-10, atol=1e-12)
