"""Starts that explore: `initialize` draws every block, `fit_restarts` covers the regimes.

References: EM started from the true (simulating) parameters, hmmlearn's EM from several
random initializations, statsmodels' ``UnobservedComponents`` maximum likelihood.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.fit.em import _fit_em_compiled
from statseq.fit.lbfgs import _fit_lbfgs_compiled
from statseq.models.hmm.base import HMMBase, random_transition_matrix
from statseq.models.hmm.gaussian import seed_from_key

# Two fits reach "the same optimum" when their log-likelihoods differ by less than 0.5 nats:
# half the 95% chi^2(1) likelihood-ratio threshold (1.92), far below the gaps between the
# distinct local optima seen on these problems (>= 5 nats), and above what EM's stopping
# rule (tol 1e-7 relative, |log lik| ~ 10^3) leaves unconverged (~0.01-0.1 nats).
SAME_OPTIMUM = 0.5


def simulate_gaussian_hmm(seed, transition, means, sd, num_timesteps):
    """``(T, D)`` observations of a Gaussian HMM with isotropic noise ``sd`` (NumPy)."""
    rng = np.random.default_rng(seed)
    transition, means = np.asarray(transition), np.asarray(means, float)
    k = len(transition)
    cum = np.cumsum(transition, axis=1)
    z = np.empty(num_timesteps, int)
    z[0] = rng.integers(k)
    u = rng.random(num_timesteps)
    for t in range(1, num_timesteps):
        z[t] = min(np.searchsorted(cum[z[t - 1]], u[t]), k - 1)
    return means[z] + sd * rng.normal(size=(num_timesteps, means.shape[1]))


def switching(k, stay):
    a = np.full((k, k), (1.0 - stay) / (k - 1))
    np.fill_diagonal(a, stay)
    return a


def true_params(model, y, transition, means, sd):
    start = model.initialize(y, key=jax.random.key(0))
    em = start.emissions
    k, d = np.shape(means)
    cov = sd**2 * np.broadcast_to(np.eye(d), (k, d, d))
    return start._replace(
        transitions=jnp.asarray(transition),
        # a NumPy array, not jnp.full(..., 1 / k): a weakly typed leaf is another jit cache
        # key, and EM from these parameters would compile its loop a second time
        initial_probs=jnp.asarray(np.full(k, 1.0 / k)),
        emissions=em._replace(means=jnp.asarray(means, float), covs=jnp.asarray(cov)),
    )


def em(model, params, y, num_iters=500):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ss.fit_em(model, params, y, num_iters=num_iters, progress=False)


# ---- 1. initialize draws every block ----------------------------------------------------
def test_random_transitions_span_persistent_and_anti_persistent():
    y = ss.datasets.load_earthquakes().to_numpy()
    model = ss.PoissonHMM(num_states=3)
    diag_means = {}
    for family in model.transition_starts:
        vals = []
        for i in range(10):
            p = model.initialize(y, key=jax.random.key(i), method="random",
                                 transitions=family)
            a = np.asarray(p.transitions)
            np.testing.assert_allclose(a.sum(axis=1), 1.0, atol=1e-12)
            assert a.min() >= 1e-3 / (1 + 3e-3) - 1e-15  # EM can leave every entry
            pi = np.asarray(p.initial_probs)
            assert abs(pi.sum() - 1) < 1e-12 and pi.min() >= 0.5 / 3 - 1e-12
            vals.append(np.mean(np.diag(a)))
        diag_means[family] = np.array(vals)
    assert np.all(diag_means["anti_persistent"] < 1 / 3)
    assert np.all(diag_means["sticky"] > 0.8)
    np.testing.assert_allclose(diag_means["uniform"], 1 / 3, atol=1e-12)
    # Dirichlet(1) rows: mean diagonal 1/3 on average, spread out
    assert 0.15 < diag_means["dirichlet"].mean() < 0.55
    assert np.ptp(diag_means["dirichlet"]) > 0.2
    # transitions=None draws the family from the key: both regimes appear over 40 draws
    drawn = [np.mean(np.diag(np.asarray(model.initialize(
        y, key=jax.random.key(i), method="random").transitions))) for i in range(40)]
    assert min(drawn) < 1 / 3 and max(drawn) > 0.8
    # the initial law varies across random starts; the data start keeps it uniform
    pis = np.stack([np.asarray(model.initialize(y, key=jax.random.key(i),
                                                method="random").initial_probs)
                    for i in range(5)])
    assert np.ptp(pis, axis=0).max() > 0.05
    np.testing.assert_allclose(model.initialize(y, key=jax.random.key(0)).initial_probs, 1 / 3)


def test_transition_family_moments_match_the_dirichlet():
    """Monte Carlo mean of the diagonal against the Dirichlet means (5 sigma)."""
    rng = np.random.default_rng(0)
    k, n = 3, 4000
    expected = {"sticky": 0.9, "dirichlet": 1 / 3, "anti_persistent": 0.5 / 4.5}
    for family, mean in expected.items():
        diag = np.array([random_transition_matrix(k, family, rng)[0, 0] for _ in range(n)])
        assert abs(diag.mean() - mean) < 5 * diag.std() / np.sqrt(n) + 2e-3, family


def test_input_driven_and_stationary_models_get_the_family():
    y = ss.datasets.load_earthquakes().to_numpy().astype(float)
    u = np.stack([np.ones_like(y), np.linspace(-1, 1, y.size)], axis=1)
    model = ss.PoissonHMM(num_states=2, input_dim=2)
    p = model.initialize(y, key=jax.random.key(3), inputs=u, method="random",
                         transitions="anti_persistent")
    a = np.asarray(jax.nn.softmax(p.transitions.bias, axis=-1))
    assert np.all(np.diag(a) < 0.5) and not np.any(np.asarray(p.transitions.weights))
    stat = ss.PoissonHMM(num_states=2, initial="stationary")
    p = stat.initialize(y, key=jax.random.key(3), method="random", transitions="sticky")
    assert p.initial_probs is None and np.all(np.diag(np.asarray(p.transitions)) > 0.5)


def test_bad_transition_family_and_method():
    y = ss.datasets.load_earthquakes().to_numpy()
    model = ss.PoissonHMM(num_states=2)
    with pytest.raises(ValueError, match="transitions must be None or one of"):
        model.initialize(y, key=jax.random.key(0), method="random", transitions="persistent")
    with pytest.raises(ValueError, match="method must be 'data' or 'random'"):
        model.initialize(y, key=jax.random.key(0), method="kmeans")
    with pytest.raises(ValueError, match="method must be 'em', 'lbfgs' or 'sgd'"):
        ss.fit_restarts(model, y, key=jax.random.key(0), method="newton")


def test_kmeanspp_emissions_start_from_spread_data_points():
    """Random Gaussian means are data rows, one in each of three far-apart clusters (the
    D^2 seeding; uniformly drawn rows would repeat a cluster with probability 7/9)."""
    rng = np.random.default_rng(1)
    centers = np.array([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0]])
    y = centers[rng.integers(3, size=300)] + rng.normal(size=(300, 2))
    model = ss.GaussianHMM(num_states=3, emission_dim=2)
    for i in range(20):
        means = np.asarray(model.initialize(y, key=jax.random.key(i),
                                            method="random").emissions.means)
        assert all(np.any(np.all(y == m, axis=1)) for m in means)
        clusters = np.argmin(((means[:, None] - centers[None]) ** 2).sum(-1), axis=1)
        assert sorted(clusters) == [0, 1, 2]
    # Poisson rates: observed counts plus an offset in [0.05, 0.5)
    counts = ss.datasets.load_earthquakes().to_numpy()
    pm = ss.PoissonHMM(num_states=3)
    for i in range(5):
        rates = np.asarray(pm.initialize(counts, key=jax.random.key(i),
                                         method="random").emissions.rates)
        offset = rates - np.floor(rates)
        assert np.all(np.isin(np.floor(rates), counts)) and np.all((offset >= 0.05)
                                                                   & (offset < 0.5))
    # AR-HMM: random starts differ from each other and from the data start
    ar = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=1, num_lags=1)
    ys = np.log(ss.datasets.load_lynx().to_numpy().astype(float))[:, None]
    b = [np.asarray(ar.initialize(ys, key=jax.random.key(i), method="random").emissions.biases)
         for i in range(3)]
    assert np.ptp(np.stack(b), axis=0).max() > 1e-3


def test_ssm_random_starts_spread_variances_over_orders_of_magnitude():
    y = np.log(ss.datasets.load_air_passengers().to_numpy().astype(float))
    model = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=12),
                                ss.ARComponent(order=3)))
    starts = [model.initialize(y, key=jax.random.key(i), method="random") for i in range(30)]
    leaves = np.array([[float(v) for v in (p.obs_var, p.components[0].level_var,
                                           p.components[0].slope_var,
                                           p.components[1].var, p.components[2].var)]
                       for p in starts])
    assert np.all(leaves > 0)
    spread = np.log10(leaves.max(0) / leaves.min(0))
    assert np.all(spread > 3.0), spread  # decades covered by each variance
    ratio = np.log10(leaves[:, 0] / leaves[:, 1])  # noise to level variance
    assert np.ptp(ratio) > 3.0
    for p in starts:  # AR coefficients stationary: the model accepts them
        model.check_params(p)
        assert np.abs(np.asarray(p.components[2].coeffs)).sum() < 0.9
    lg = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    yl = np.cumsum(np.random.default_rng(0).normal(size=(200, 2)), axis=0)
    ps = [lg.initialize(yl, key=jax.random.key(i), method="random") for i in range(30)]
    q = np.array([np.diag(np.asarray(p.dynamics_cov)) for p in ps])
    r = np.array([np.diag(np.asarray(p.emission_cov)) for p in ps])
    assert np.all(np.log10(q.max(0) / q.min(0)) > 2.5)
    assert np.all(np.log10(r.max(0) / r.min(0)) > 2.5)
    f = np.array([np.diag(np.asarray(p.dynamics_weights)) for p in ps])
    assert f.min() >= 0.3 and f.max() < 0.98 and np.ptp(f) > 0.3


# ---- 2. fit_restarts covers the starts ----------------------------------------------------
def test_fit_restarts_cycles_families_and_compiles_once(monkeypatch):
    y = ss.datasets.load_earthquakes().to_numpy()
    model = ss.PoissonHMM(num_states=2)
    seen = []
    original = HMMBase.initialize

    def spy(self, *args, **kwargs):
        seen.append((kwargs.get("method"), kwargs.get("transitions")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(HMMBase, "initialize", spy)
    ss.fit_restarts(model, y, key=jax.random.key(0), num_restarts=2, num_iters=50)
    before = _fit_em_compiled._cache_size()
    res = ss.fit_restarts(model, y, key=jax.random.key(1), num_restarts=6, num_iters=50)
    assert _fit_em_compiled._cache_size() == before  # every start reuses the program
    fams = model.transition_starts
    assert seen[2:] == [("data", None)] + [("random", fams[i % 4]) for i in range(5)]
    assert set(fams) == {"sticky", "uniform", "dirichlet", "anti_persistent"}
    assert res.best.final_log_joint == np.nanmax(res.final_log_joints)



def test_default_number_of_starts_and_em_iterations(monkeypatch):
    """HMMs: 5 starts per transition family (20) and EM with num_iters=500 unless given;
    other models: 10 starts and the fitting function's own defaults."""
    import statseq.fit.em as em_module

    real, calls = em_module.fit_em, []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("num_iters"))
        return real(*args, **{**kwargs, "num_iters": 2})

    monkeypatch.setattr(em_module, "fit_em", spy)
    y = ss.datasets.load_earthquakes().to_numpy()
    res = ss.fit_restarts(ss.PoissonHMM(num_states=2), y, key=jax.random.key(0))
    assert calls == [500] * 20 and res.final_log_joints.shape == (20,)
    calls.clear()
    ss.fit_restarts(ss.PoissonHMM(num_states=2), y, key=jax.random.key(0), num_restarts=3,
                    num_iters=7)
    assert calls == [7] * 3
    calls.clear()
    nile = ss.datasets.load_nile().to_numpy().astype(float)[:, None]
    res = ss.fit_restarts(ss.LinearGaussianSSM(state_dim=1, emission_dim=1), nile,
                          key=jax.random.key(0))
    assert calls == [None] * 10 and res.final_log_joints.shape == (10,)

def test_only_the_chosen_starts_warnings_are_reissued(monkeypatch):
    import statseq.fit.em as em_module

    y = ss.datasets.load_earthquakes().to_numpy()
    model = ss.PoissonHMM(num_states=2)
    real, calls = em_module.fit_em, []

    def noisy(*args, **kwargs):
        calls.append(len(calls))
        fit = real(*args, **kwargs)
        warnings.warn(f"from start {calls[-1]}", RuntimeWarning, stacklevel=2)
        return fit

    monkeypatch.setattr(em_module, "fit_em", noisy)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = ss.fit_restarts(model, y, key=jax.random.key(0), num_restarts=4, num_iters=50)
    messages = [str(w.message) for w in record if "from start" in str(w.message)]
    assert len(calls) == 4 and messages == [f"from start {res.best_index}"]


# The three tests below run dozens of EM fits of hundreds of iterations on T = 300-1000
# from a handful of compiled programs: run time, not compile time, dominates, so they run
# with XLA's full optimization (about a quarter to two fifths less CPU time each, measured
# against -O0 in the same conditions). The fixture is module-scoped: the tests after them
# in this file run optimized too.
@pytest.mark.usefixtures("xla_optimized")
def test_anti_persistent_optimum_is_reached_where_a_sticky_start_is_not():
    """The reported failure: 3 states that switch at 95% of steps, overlapping 2-D
    emissions. From the same random emissions, EM from the old persistent start (0.9 on
    the diagonal, the only transitions the old random starts used) ends > 5 nats short of
    EM from the true parameters, EM from a uniform matrix reaches it, and `fit_restarts`
    (default settings) reaches it."""
    transition = switching(3, 0.05)
    means = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    y = simulate_gaussian_hmm(1, transition, means, 0.7, 1000)
    model = ss.GaussianHMM(num_states=3, emission_dim=2)
    optimum = em(model, true_params(model, y, transition, means, 0.7), y).final_log_joint
    uniform = jnp.asarray(np.full((3, 3), 1 / 3))  # strongly typed: EM's program is reused
    stuck = 0
    for i in (0, 4):
        p = model.initialize(y, key=jax.random.key(i), method="random",
                             transitions="uniform")
        # the old random emissions, reproduced: the data's covariance (1e-3 ridge) times
        # one factor U(1/4, 1) from the same seed (random starts now spread each state's
        # variance over two decades, which alone rescues these two starts)
        seed = seed_from_key(jax.random.split(jax.random.key(i), 4)[0])
        factor = np.random.default_rng(seed).uniform(0.25, 1.0)
        cov = np.cov(y.T, bias=True) + 1e-3 * np.diag(np.var(y, axis=0))
        p = p._replace(emissions=p.emissions._replace(covs=jnp.asarray(
            np.broadcast_to(factor * cov + model.min_variance * np.eye(2), (3, 2, 2)))))
        sticky = em(model, p._replace(transitions=model.default_transitions()), y)
        if sticky.final_log_joint < optimum - 5.0:
            stuck += 1
        assert em(model, p._replace(transitions=uniform), y).final_log_joint \
            > optimum - SAME_OPTIMUM
    assert stuck == 2  # measured gaps: 11.5 and 40.4 nats
    res = ss.fit_restarts(model, y, key=jax.random.key(0), num_iters=500)
    assert res.best.final_log_joint > optimum - SAME_OPTIMUM


def best_regular_optimum(model, y, key, num_starts):
    """Best and worst final log-likelihoods of ``num_starts`` EM fits (the data start, then
    random starts cycling the transition families), excluding near-singular fits: a state
    whose variance is below 1% of the data's (spurious maximizers of the unbounded
    Gaussian likelihood, McLachlan and Peel 2000, sec. 3.10)."""
    fams = model.transition_starts
    keys = jax.random.split(key, num_starts)
    finals = []
    for i in range(num_starts):
        start = model.initialize(y, key=keys[i], method="data" if i == 0 else "random",
                                 **({} if i == 0 else {"transitions": fams[i % 4]}))
        fit = em(model, start, y, num_iters=1000)
        if np.asarray(fit.params.emissions.covs).min() >= 0.01 * np.var(y):
            finals.append(fit.final_log_joint)
    return max(finals), min(finals)


@pytest.mark.usefixtures("xla_optimized")
def test_small_benchmark_success_criterion():
    """benchmarks/bench_restarts.py in miniature: on 3 seeds of an anti-persistent
    Gaussian HMM (K = 3, stay 0.1, T = 300), the best known optimum is the best of EM from
    the true parameters and of 20 random starts with another key, excluding near-singular
    fits (`best_regular_optimum`; on seed 101 one of 20 starts ends at one, a state with
    variance 7e-4 of the data's on 8 observations, 6 nats above every other fit).
    `fit_restarts` with its default settings must reach it on every seed (the benchmark
    asks 90% of 20 seeds; hmmlearn's references are left to the benchmark: 30-70 s a
    fit on the shared test machine)."""
    transition = switching(3, 0.1)
    means = np.array([[-1.0], [0.0], [1.0]])
    model = ss.GaussianHMM(num_states=3, emission_dim=1)
    spreads = []
    for seed in range(3):
        y = simulate_gaussian_hmm(100 + seed, transition, means, 0.5, 300)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ours = ss.fit_restarts(model, y, key=jax.random.key(seed))
        best_start, worst_start = best_regular_optimum(model, y, jax.random.key(1000 + seed),
                                                       20)
        truth = em(model, true_params(model, y, transition, means, 0.5), y)
        best = max(best_start, truth.final_log_joint)
        assert ours.best.final_log_joint > best - SAME_OPTIMUM, seed
        spreads.append(best - worst_start)
    # the problem has local optima: on some seed a regular start ends short of the best
    assert max(spreads) > 1.0, spreads


@pytest.mark.usefixtures("xla_optimized")
def test_default_route_reaches_the_many_restart_best_where_the_old_default_did_not():
    """Regression (issue 11 point 1): anti3 of benchmarks/bench_restarts.py (K = 3, stay
    0.1, means -1/0/1, sd 0.5), T = 300, the benchmark's seeds 4 and 13 (its simulator,
    copied). The old default (10 starts sharing one variance factor in [1/4, 1]) ended
    0.93 and 3.24 nats short of the best known optimum: those optima have a narrow state
    (variance 1.4% and 3.6% of the data's, on 8 and 11 steps), whose basin starts with
    one common, wide variance rarely reach. The default route (20 starts, per-state
    variances over two decades, 500 EM iterations) must end within 0.5 nats of the best
    of 30 other starts (near-singular fits excluded) and of EM from the true parameters."""
    transition = switching(3, 0.1)
    means = np.array([[-1.0], [0.0], [1.0]])
    model = ss.GaussianHMM(num_states=3, emission_dim=1)
    for seed in (4, 13):
        rng = np.random.default_rng([seed, 300])  # bench_restarts.simulate
        cum = np.cumsum(transition, axis=1)
        z = np.empty(300, int)
        z[0] = rng.integers(3)
        u = rng.random(300)
        for t in range(1, 300):
            z[t] = min(np.searchsorted(cum[z[t - 1]], u[t]), 2)
        y = (means[z, 0] + 0.5 * rng.normal(size=300))[:, None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ours = ss.fit_restarts(model, y, key=jax.random.key(seed))
        many, _ = best_regular_optimum(model, y, jax.random.key(10_000 + seed), 30)
        truth = em(model, true_params(model, y, transition, means, 0.5), y, num_iters=1000)
        best = max(many, truth.final_log_joint)
        assert len(ours.final_log_joints) == 20
        assert ours.best.final_log_joint > best - SAME_OPTIMUM, seed
        # EM from the true parameters stops in a worse optimum: the problem is multimodal
        assert truth.final_log_joint < ours.best.final_log_joint - 0.5, seed


def test_gaussian_random_starts_spread_state_variances_over_two_decades():
    """Each state's start variance is the data's times 10^u, u ~ U(-2, 0), drawn per state
    (plus ``min_variance``): 30 starts of 3 states cover most of the two decades, and the
    states of one start differ."""
    y = np.random.default_rng(0).normal(size=(400, 1)) * 3.0
    model = ss.GaussianHMM(num_states=3, emission_dim=1)
    var = 1.001 * np.var(y)  # the overall covariance keeps a 1e-3 ridge (_observed_moments)
    v = np.array([np.asarray(model.initialize(y, key=jax.random.key(i), method="random")
                             .emissions.covs)[:, 0, 0] for i in range(30)])
    ratio = np.log10((v - model.min_variance) / var)
    assert ratio.min() >= -2.0 - 1e-9 and ratio.max() <= 1e-9
    assert ratio.min() < -1.8 and ratio.max() > -0.2
    assert np.all(np.ptp(ratio, axis=1) > 1e-3)


# ---- 3. the L-BFGS route for structural models -------------------------------------------
def test_lbfgs_restarts_reach_statsmodels_optimum_and_skip_degenerate_fits():
    """Trend + 6-harmonic seasonal on the raw air passengers: statsmodels' exact-diffuse
    MLE (tight BFGS) as the reference. One random start there drives ``obs_var`` towards
    0 (1e-13 of the level variance). The augmented diffuse filter lost its precision there
    (its trace decreased and it reported -32 against the optimum's -544, so the start came
    back as NaN); the exact initial filter (`statseq.inference.kalman_diffuse`) keeps it, so
    that start now reports a true log-likelihood, no better than the optimum."""
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    y = ss.datasets.load_air_passengers().to_numpy().astype(float)
    model = ss.StructuralModel((ss.Trend(slope=True), ss.TrigSeasonal(period=12,
                                                                       harmonics=6)))
    before = _fit_lbfgs_compiled._cache_size()
    res = ss.fit_restarts(model, y, key=jax.random.key(0), num_restarts=4, method="lbfgs")
    assert _fit_lbfgs_compiled._cache_size() - before <= 1
    assert res.best.method == "lbfgs"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        uc = sm.UnobservedComponents(y, level="lltrend", use_exact_diffuse=True,
                                     freq_seasonal=[{"period": 12, "harmonics": 6}])
        uc.ssm.tolerance = 0.0
        ref = uc.fit(disp=False, method="bfgs", gtol=1e-10, maxiter=1000)
    assert abs(res.best.final_log_joint - ref.llf) < 1e-4  # ~1e-5 seen
    # the start that ran to obs_var -> 0: a finite value, no better than the optimum
    assert np.isfinite(res.final_log_joints[3])
    assert res.final_log_joints[3] <= ref.llf + 1e-4
    assert abs(float(ss.log_prob(model, res.best.params, y)) - res.best.final_log_joint) < 1e-8
