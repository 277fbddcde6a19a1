"""Every model family works as a NumPyro distribution and has proper default priors.

One contract example per family (each case costs a few compilations, so not all of them):
`SequenceDistribution.log_prob` equals `statseq.log_prob` with a mask and inputs, every
default prior draws inside its leaf's constraint, and the joint NumPyro model used by
`fit_nuts`/`fit_svi` has log density ``log p(theta) + log p(y | theta)``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.distributions import constraints
from numpyro.infer.util import log_density

import statseq as ss
from statseq.bayes import SequenceDistribution, _joint, default_priors
from statseq.core.params import _is_constraint, is_shape
from tests.core.test_contract import EXAMPLES, T, example_params

NUM_SEQ = 2
CASES = [(name, 0) for name in (
    "AR", "PoissonHMM", "CategoricalHMM", "GaussianHMM", "BernoulliHMM", "LinearGaussianSSM",
    "LocalLevel", "StructuralModel", "GRU") if name in EXAMPLES]


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_sequence_distribution_and_default_priors(name, index):
    model = EXAMPLES[name][index]
    params = example_params(model)
    inputs = (jnp.asarray(np.sin(np.arange(T) / 3.0)[:, None].repeat(model.num_inputs, 1))
              if model.num_inputs else None)
    ys = ss.sample(model, params, num_timesteps=T, num_samples=NUM_SEQ, key=jax.random.key(0),
                   inputs=inputs)
    mask = np.ones((NUM_SEQ, T), bool)
    mask[:, -1] = False  # a missing last step (lagged models need observed lags)
    d = SequenceDistribution(model, params, mask=mask,
                             inputs=None if inputs is None else jnp.broadcast_to(
                                 inputs, (NUM_SEQ,) + inputs.shape))
    assert d.batch_shape == (NUM_SEQ,)
    assert d.event_shape == (T,) + tuple(model.event_shape)
    np.testing.assert_allclose(d.log_prob(ys), ss.log_prob(model, params, ys, mask=mask,
                                                           inputs=inputs), rtol=1e-10)

    priors = default_priors(model, ys)
    shapes = jax.tree.leaves(model.param_shapes(), is_leaf=is_shape)
    cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
    leaves = jax.tree.structure(model.param_shapes(), is_leaf=is_shape).flatten_up_to(priors)
    for shape, con, prior in zip(shapes, cons, leaves, strict=True):
        if prior is None:  # only constraints without a default
            assert con not in (constraints.real, constraints.positive, constraints.simplex,
                               constraints.unit_interval, constraints.positive_definite)
            continue
        draw = prior.sample(jax.random.key(1))
        assert draw.shape == tuple(shape)
        assert bool(jnp.all(con.check(draw)))
        assert np.all(np.isfinite(np.asarray(prior.log_prob(draw))))

    if all(p is not None for p in leaves):
        # the joint NumPyro model at the example params: log prior + log-likelihood
        spec = _joint.prepare_joint(model, ys, priors=None, mask=None, inputs=inputs,
                                    init_params=params, trainable=None, ordered=None,
                                    key=jax.random.key(2))
        values = {spec.names[i]: spec.fixed[i] for i in _joint.sampled_indices(spec)}
        lp, _ = log_density(_joint.numpyro_model, (spec,), {}, values)
        expected = ss.log_prob(model, params, ys, inputs=inputs).sum() + sum(
            jnp.sum(p.log_prob(v)) for p, v in zip(spec.priors, spec.fixed, strict=True)
            if p is not None)
        np.testing.assert_allclose(lp, expected, rtol=1e-9)
