"""Shared test configuration: float64, a headless matplotlib, XLA at -O0, no persistent cache.

The environment and JAX settings below must take effect before :mod:`statseq` is imported
anywhere, so they run at import time of this conftest (pytest imports it first).
"""

from __future__ import annotations

import os

# Compile time is most of the suite's time, so the tests trade XLA's optimization of the
# generated code for compile speed (-O0: about a quarter less CPU time on the Kalman tests,
# the same results to the tolerances checked; runtime-bound tests such as NUTS are
# unchanged). Benchmarks and the docs build (which executes the vignettes) run fully
# optimized. STATSEQ_TEST_XLA_OPT=1 runs the tests optimized too.
#
# On jaxlib 0.10.x the tests also compile with XLA:CPU's older elemental fusion emitters
# (``--xla_cpu_use_fusion_emitters=false``): the MLIR fusion emitters that are the default
# there cost about 30 % more CPU time to compile the suite's small programs (measured on
# tests/models/test_hmm.py + tests/inference/test_kalman.py: 44.2 -> 31.1 s of user time;
# test_mamba + test_rnn + bayes/test_nuts: 92.2 -> 65.1 s; same results). jaxlib 0.12
# no longer knows the flag (XLA aborts on an unknown flag), so it is added only on 0.10.x.
# Two more flags known to both jaxlib 0.10 and 0.12 save about a sixth more (29.6 -> 24.7 s
# on the first pair): one LLVM module per program instead of parallel split codegen (no gain
# with one worker per core) and no expensive LLVM passes.
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_parallel_codegen_split_count=1",
    "--xla_llvm_disable_expensive_passes=true",
)


def _fast_compile_flags() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    flags = list(FAST_COMPILE_FLAGS)
    try:
        if version("jaxlib").startswith("0.10."):
            flags.append("--xla_cpu_use_fusion_emitters=false")
    except PackageNotFoundError:  # pragma: no cover - jaxlib is a jax dependency
        pass
    return flags


if os.environ.get("STATSEQ_TEST_XLA_OPT", "").strip() in ("", "0"):
    _flags = os.environ.get("XLA_FLAGS", "")
    for _flag in _fast_compile_flags():
        if _flag.split("=")[0] not in _flags:
            _flags = f"{_flags} {_flag}"
    os.environ["XLA_FLAGS"] = _flags.strip()
# No persistent compilation cache, unless STATSEQ_CACHE_DIR names one (as .ci/run does, with
# a fresh directory per run, so that the two pytest-xdist workers and successive test
# modules reuse each other's compiled programs: about a tenth less CPU time).
if not os.environ.get("STATSEQ_CACHE_DIR"):
    os.environ["STATSEQ_NO_COMPILATION_CACHE"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")

import jax  # noqa: E402
import matplotlib  # noqa: E402

jax.config.update("jax_enable_x64", True)
matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The longest test modules, longest first (seconds of one CI core, measured Nov 26). Under
# pytest-xdist (`-n auto`, `--dist loadscope` in pyproject.toml) every module goes to one
# worker, in collection order (`--no-loadscope-reorder`: xdist's own reorder, by number of
# tests, put these few-test modules last, so the run ended with one worker on a 100 s
# module while the other idled). Starting them first lets the many short modules fill in
# around them, so the workers finish together. A module missing from the list only
# affects the balance, never what runs.
#: scripts run in subprocesses with their own devices and arguments, not test modules
#: (``--doctest-modules`` would import them in the pytest process)
collect_ignore_glob = ["distributed/_*.py"]

LONGEST_MODULES_FIRST = (
    "tests/evaluation/test_claims.py",           # ~115 s of one core (23 families, k <= 8)
    "tests/models/test_h_step_exact.py",         # ~114 s (regime-path mixtures vs references)
    "tests/bayes/test_nuts.py",                  # ~97 s of CPU under load (NUTS fits, SVI)
    "tests/fit/test_identified_counts.py",       # ~90 s (Jacobian ranks, every model)
    "tests/bayes/test_sbc.py",                   # ~80 s (119 s before it ran optimized)
    "tests/core/test_input_convention.py",       # ~77 s (every model, every entry point)
    "tests/models/neural/test_h_step_mc.py",     # ~60 s (every backbone, Monte Carlo)
    "tests/models/test_ar_gaps.py",              # ~50 s (enumeration, fit_lbfgs with gaps)
    "tests/test_docs.py",                        # README quick start 38 s in CI, doc pages
    "tests/test_cli.py",                         # `statseq demo` fixture 44 s in CI
    "tests/core/test_buckets.py",                # 3 x 17 s in CI
    "tests/bayes/test_sampler_entry_masks.py",   # ~56 s under load
    "tests/bayes/test_sampler_simplex_ties.py",  # ~40 s under load
    "tests/bayes/test_checks_lfo.py",            # ~26 s under load
)


#: The slow tier (``-m slow``; CI and the README's command run ``-m "not slow"``, from
#: pyproject's ``addopts``). Every check keeps at least one instance in the CI tier; the slow
#: tier holds repeats over models that share the code path under test. The model-wide tables
#: and the fuzz tables run the generic plumbing (validation, filters, fits, forecasts,
#: save/load) that every `ResidualStack` backbone shares: in CI they run S4D and the
#: Transformer for it (plus GRU/LSTM for the RNN cells, Mamba and LRU), and the other
#: backbones below in the slow tier; each backbone's own layer, its modes and its numerics
#: at extreme values are tested in its own file, in CI.
SLOW_TIER_MODEL_ROWS = frozenset({
    "S5", "s5", "LinearAttention", "linear_attention", "AFT", "aft", "RWKV", "rwkv",
    "MLSTM", "mlstm", "WaveNet", "wavenet", "ElmanRNN", "elman",
    # session 18: rows whose code path another CI row carries (Categorical/Poisson HMM for the
    # Bernoulli HMM, LocalLevel and StructuralModel for the local linear trend, GRU for the
    # LSTM cell's plumbing, Mamba for LRU's diagonal scan); each has its own test file in CI
    "BernoulliHMM", "bernoulli_hmm", "LocalLinearTrend", "local_linear_trend", "LSTM", "lstm",
    "LRU", "lru",
})
TABLE_MODULES = (
    "tests/core/test_contract.py", "tests/core/test_input_convention.py",
    "tests/fit/test_identified_counts.py", "tests/models/neural/test_h_step_mc.py",
    "tests/fuzz/", "tests/core/test_public_calls.py", "tests/bayes/test_every_model.py",
)
#: Single tests in the slow tier, with what covers their check in CI.
SLOW_TIER_TESTS = {
    # segmentation from a Gibbs fit: test_slds_transitions.py's ARI > 0.9 test covers it
    "tests/models/test_slds.py::test_gibbs_fit_recovers_parameters_and_segments",
}
#: More single tests in the slow tier (Nov 27: CI took 39 min at 3,118 tests), each beside
#: the CI-tier test that checks the same thing on a cheaper case.
SLOW_TIER_TESTS |= {
    # covered by test_kalman.py::test_steady_state_smoother_equals_exact_smoother
    "tests/models/test_lgssm.py::test_smoother_steady_state_path_equals_exact_smoother",
    # covered by ..._with_proper_prior_and_fixed_matrices and the zero-noise parallel tests
    "tests/inference/test_kalman_parallel.py::test_parallel_equals_sequential_on_hostile_models",
    # covered by test_em_with_ties_reaches_the_restricted_lbfgs_optimum_monotonically
    "tests/models/test_em_ties.py::test_em_with_ties_and_free_entries_beside_them",
    # covered by test_sbc_local_level and test_slds_gibbs.py::test_sbc_gibbs_with_gaps
    "tests/bayes/test_sbc.py::test_sbc_poisson_hmm",
    # covered by test_ssm_restricted.py::test_ties_equal_a_batch_of_independent_copies
    "tests/models/test_restricted_everywhere.py::"
    "test_tied_standard_errors_equal_a_batch_of_independent_copies",
    # covered by test_ssm_restricted.py::test_nuts_and_svi_sample_only_the_free_entries
    "tests/models/test_restricted_everywhere.py::"
    "test_nuts_and_svi_keep_ties_and_fixed_entries_in_every_draw",
    # covered by test_local_level_posterior_concentrates_and_svi_agrees
    "tests/bayes/test_nuts.py::test_poisson_hmm_posterior_concentrates_near_the_truth",
    # covered by ..._poisson_hmm_with_tied_rates_... and ..._categorical_hmm_with_fixed_emission_...
    "tests/models/test_em_entry_masks.py::"
    "test_glm_hmm_with_reference_logits_fixed_at_zero_matches_restricted_lbfgs",
}
#: Single test cases (node ids) in the slow tier: every CI-tier case that took 10 s or more in
#: a full `--durations=0` run on Nov 27 (2 loaded cores; about 5 s on a quiet CI core), except
#: those that alone check a published number, a peer's result or a front-door path (the
#: README, `statseq demo`), which stay in CI. Each file keeps its cheaper tests in CI, so
#: every module still runs there.
SLOW_TIER_NODEIDS = frozenset({
    "tests/bayes/test_checks_lfo.py::test_lfo_cv_equals_the_exact_conjugate_one_step_densities",
    "tests/bayes/test_neural_bayes.py::test_mean_field_elman_draws_frozen_leaf_and_forecast",
    "tests/bayes/test_sampler_simplex_ties.py::"
    "test_nuts_with_a_tied_switching_probability_matches_quadrature",
    "tests/bayes/test_sampler_simplex_ties.py::"
    "test_tied_covariance_variances_delta_guide_finds_the_restricted_map",
    "tests/bayes/test_sampler_simplex_ties.py::"
    "test_tied_covariance_variances_nuts_matches_quadrature",
    "tests/core/test_buckets.py::test_five_thousand_lengths_in_one_process",
    "tests/core/test_buckets.py::test_smoothers_and_forecast",
    "tests/distributed/test_data_parallel.py::test_sharded_equals_unsharded",
    "tests/fit/test_restarts.py::"
    "test_anti_persistent_optimum_is_reached_where_a_sticky_start_is_not",
    "tests/fit/test_restarts.py::"
    "test_lbfgs_restarts_reach_statsmodels_optimum_and_skip_degenerate_fits",
    "tests/fit/test_restarts.py::test_small_benchmark_success_criterion",
    "tests/fit/test_simplex_ties.py::test_em_and_lbfgs_reach_the_brute_force_restricted_mle",
    "tests/fuzz/test_issue20_entry_points.py::"
    "test_arhmm_predict_observations_refuses_bad_arguments",
    "tests/fuzz/test_new_entry_points.py::test_backtest_edge_origins_and_missing_tail",
    "tests/inference/test_deer.py::"
    "test_elk_converges_on_contractive_cells_with_the_implicit_gradient",
    "tests/inference/test_deer.py::test_elk_converges_where_undamped_newton_overflows",
    "tests/inference/test_deer.py::test_warm_start_and_batching",
    "tests/inference/test_deer_quasi_adjoint.py::"
    "test_parallel_adjoint_equals_backpropagation_through_time[gru]",
    "tests/inference/test_deer_scaling.py::test_contractive_cell_iterations_do_not_grow_with_T",
    "tests/inference/test_hmm_unrolled.py::test_unrolled_equals_plain_at_every_length[8]",
    "tests/inference/test_hmm_unrolled.py::test_unrolled_float32_at_a_million_steps",
    "tests/inference/test_hmm_unrolled.py::test_unrolled_gradients_equal_plain",
    "tests/inference/test_kalman.py::test_diffuse_likelihood_is_the_large_variance_limit",
    "tests/inference/test_kalman.py::test_posterior_samples_have_the_smoothed_moments[0]",
    "tests/inference/test_kalman.py::test_steady_state_log_likelihood_gradient_equals_exact[0]",
    "tests/inference/test_kalman.py::test_steady_state_log_probs_switches_as_soon_as_converged[0]",
    "tests/inference/test_kalman.py::"
    "test_steady_state_smoother_falls_back_when_short_or_not_converged",
    "tests/inference/test_kalman_diffuse.py::test_local_level_against_exact_rationals[0.01]",
    "tests/inference/test_kalman_diffuse.py::"
    "test_log_prob_and_gradient_near_zero_observation_variance",
    "tests/inference/test_kalman_diffuse.py::"
    "test_trend_and_quarterly_seasonal_against_exact_rationals[1e-13]",
    "tests/inference/test_kalman_diffuse.py::"
    "test_two_series_partly_diffuse_with_missing_entries_against_exact_rationals[correlated]",
    "tests/inference/test_kalman_extreme.py::"
    "test_filters_match_exact_rationals[sqrt_parallel-1.0-1.0-2]",
    "tests/inference/test_kalman_extreme.py::test_models_select_the_square_root_forms",
    "tests/inference/test_kalman_extreme.py::"
    "test_parallel_sqrt_equals_sequential_on_a_time_varying_model_with_inputs",
    "tests/inference/test_kalman_extreme.py::"
    "test_smoothers_match_exact_rationals[sqrt_parallel-1.0-1.0-2]",
    "tests/inference/test_kalman_small_kernels.py::"
    "test_filter_and_smoother_match_dense_conditioning_and_generic_path[4-2-1-False]",
    "tests/inference/test_kalman_small_kernels.py::test_gradients_equal_generic_path",
    "tests/inference/test_kalman_steady_padded.py::"
    "test_padded_steady_state_log_probs_equal_unpadded[11]",
    "tests/inference/test_kalman_zero_noise.py::"
    "test_model_smoother_parallel_with_diffuse_start_equals_sequential",
    "tests/inference/test_kalman_zero_noise.py::test_parallel_diffuse_fallback_and_gradient",
    "tests/models/neural/test_rnn_evaluation.py::test_fit_sgd_gives_the_same_parameters",
    "tests/models/neural/test_rnn_evaluation.py::"
    "test_log_prob_and_gradient_equal_the_sequential_scan[elman]",
    "tests/models/neural/test_rwkv.py::test_modes_match_numpy_and_generation_step_by_step",
    "tests/models/neural/test_rwkv.py::test_recurrent_and_parallel_modes_agree_with_gradients[1]",
    "tests/models/neural/test_ssm_evaluation.py::test_fit_sgd_gives_the_same_parameters",
    "tests/models/neural/test_ssm_evaluation.py::"
    "test_log_prob_and_gradient_equal_the_sequential_scan[lru]",
    "tests/models/neural/test_ssm_evaluation.py::test_the_other_solvers_on_one_layer",
    "tests/models/test_deepstate.py::test_fit_sgd_recovers_covariate_effect_on_noise",
    "tests/models/test_deepstate.py::test_gradients_match_finite_differences",
    "tests/models/test_deepstate.py::test_sample_and_sampled_forecast",
    "tests/models/test_em_entry_masks.py::"
    "test_categorical_hmm_with_fixed_emission_entries_matches_restricted_lbfgs",
    "tests/models/test_em_entry_masks.py::"
    "test_gaussian_hmm_with_a_fixed_mean_entry_takes_generalized_steps_monotonically",
    "tests/models/test_em_entry_masks.py::"
    "test_gaussian_hmm_with_a_structural_zero_transition_matches_restricted_lbfgs",
    "tests/models/test_em_ties.py::"
    "test_em_with_ties_reaches_the_restricted_lbfgs_optimum_monotonically",
    "tests/models/test_em_ties.py::test_expected_log_joint_is_maximized_by_the_closed_form_m_step",
    "tests/models/test_gaussian_forecast_frame.py::"
    "test_scalar_frame_has_the_sample_forecasts_columns_and_exact_values",
    "tests/models/test_h_step_exact.py::test_arhmm_claims_horizons_2_to_8[1]",
    "tests/models/test_h_step_exact.py::test_arhmm_two_dims_against_monte_carlo_and_dense_var",
    "tests/models/test_h_step_exact.py::test_msar_means_and_statsmodels_one_step",
    "tests/models/test_hmm_cdf_viterbi.py::"
    "test_poisson_h_step_predictive_cdf_is_the_weighted_scipy_cdf",
    "tests/models/test_hmm_emissions.py::test_dynamax_arhmm_log_likelihood_at_same_params",
    "tests/models/test_hmm_emissions.py::test_em_is_monotone_on_random_problems[gaussian-full]",
    "tests/models/test_lgssm.py::test_one_em_step_matches_dynamax",
    "tests/models/test_lgssm.py::test_quasi_newton_and_em_reach_the_same_optimum",
    "tests/models/test_ms_ar_restricted.py::test_a_frozen_field_is_held_inside_the_ecm_sweep",
    "tests/models/test_ms_ar_restricted.py::test_restricted_em_equals_restricted_lbfgs_on_gnp",
    "tests/models/test_slds.py::test_intercept_form_ms_ar2_equals_statsmodels_and_ms_ar",
    "tests/models/test_slds.py::test_kim_filter_close_to_the_exact_likelihood",
    "tests/models/test_slds.py::test_particle_filter_is_unbiased",
    "tests/models/test_slds_gibbs.py::test_sbc_gibbs_with_gaps",
    "tests/models/test_slds_transitions.py::test_zero_transition_weights_equal_the_plain_model",
    "tests/models/test_slds_vem.py::test_elbo_never_decreases",
    "tests/models/test_slds_vem.py::test_input_driven_elbo_never_decreases_and_recovers_w",
    "tests/models/test_ssm_restricted.py::"
    "test_em_with_rows_restricted_differently_and_a_full_q_is_monotone",
    "tests/models/test_ssm_restricted.py::"
    "test_frozen_singular_leaves_pass_through_every_fitting_method",
    "tests/models/test_ssm_restricted.py::test_nuts_and_svi_sample_only_the_free_entries",
    "tests/models/test_ssm_restricted.py::"
    "test_restricted_ar2_plus_noise_mle_matches_statsmodels_sarimax",
    "tests/models/test_ssm_restricted.py::"
    "test_restricted_em_is_monotone_and_reaches_the_quasi_newton_optimum",
    "tests/models/test_ssm_restricted.py::test_ties_equal_a_batch_of_independent_copies",
    "tests/models/test_ssm_singular.py::"
    "test_singular_state_cov_and_zero_obs_var_match_dense_conditioning_and_statsmodels[0.0]",
    "tests/models/test_ssm_sqrt_singular.py::"
    "test_the_gain_solves_its_equation_and_stays_finite_under_vmap",
    "tests/models/test_structural_regression.py::"
    "test_mle_matches_statsmodels_and_published_intervention",
    "tests/test_compat.py::test_large_batched_forecast_finishes",
    "tests/test_docs.py::test_docs_page_snippets_run[api/classify.md]",
    "tests/test_evaluation.py::test_backtest_too_early_origin_scores_nan",
    "tests/test_neural_vignette.py::test_tables_have_no_missing_scores",
    "tests/test_vignette_checks.py::test_earthquake_pseudo_residuals_reject_one_state_not_three",
    # session 18, second cut: CI cases of 7-10 s in that run that repeat a check a cheaper
    # CI case makes (fits that decrease a loss, save/load round trips, batches)
    "tests/bayes/test_neural_bayes.py::test_map_gru_predicts_held_out_ar1_like_the_true_model",
    "tests/bayes/test_nuts.py::test_importing_arviz_first_leaves_numpyro_whole",
    "tests/bayes/test_svi_subsample.py::test_batch_size_n_equals_full_data",
    "tests/core/test_compile_reuse.py::test_weak_params_reuse_the_smoother_and_fit_lbfgs_programs",
    "tests/fit/test_identified_counts.py::test_summary_counts_identified_parameters",
    "tests/fit/test_restarts.py::"
    "test_default_route_reaches_the_many_restart_best_where_the_old_default_did_not",
    "tests/inference/test_deer.py::test_float32_converges_with_a_looser_tolerance",
    "tests/models/neural/test_h_step_mc.py::"
    "test_vector_gru_marginals_and_per_dimension_backtest_scores",
    "tests/models/neural/test_rnn.py::test_trained_lstm_matches_true_ar1_held_out",
    "tests/models/neural/test_rnn_batch.py::"
    "test_batch_path_equals_step_by_step_filter_and_autodiff[elman]",
    "tests/models/neural/test_rwkv.py::test_fit_sgd_decreases_the_loss",
    "tests/models/neural/test_s4.py::test_fit_sgd_decreases_the_loss",
    "tests/models/neural/test_seq2seq.py::test_backtest_and_forecast_with_future_covariates",
    "tests/models/neural/test_transformer.py::"
    "test_fit_sgd_decreases_the_loss_and_save_load_round_trip",
    "tests/models/test_arhmm_tied_spherical.py::test_em_step_matches_weighted_least_squares[tied]",
    "tests/models/test_arhmm_tied_spherical.py::test_fit_em_is_monotone_and_saves[tied]",
    "tests/models/test_em_ties.py::test_contract_inverts_expand_under_a_restriction_with_ties",
    "tests/models/test_hmm_cdf_viterbi.py::"
    "test_viterbi_log_joint_for_a_batch_and_time_varying_transitions",
    "tests/models/test_hmm_emissions.py::test_arhmm_step_matches_predict_score_update_and_samples",
    "tests/models/test_hmm_tied_spherical.py::test_default_priors_have_the_parameter_shapes",
    "tests/models/test_hmm_tied_spherical.py::"
    "test_em_with_missing_entries_is_monotone_and_fit_em_runs[tied]",
    "tests/models/test_hmm_tied_spherical.py::test_save_load_sampling_and_errors",
    "tests/models/test_ms_ar.py::test_batches_masks_save_load_and_errors",
    "tests/models/test_ms_ar_restricted.py::test_fisher_identity_on_gnp",
    "tests/models/test_restricted_everywhere.py::"
    "test_sampler_log_density_equals_the_restricted_lbfgs_objective",
    "tests/models/test_slds.py::test_batches_equal_single_sequences",
    "tests/models/test_slds.py::test_one_regime_equals_the_linear_gaussian_ssm",
    "tests/models/test_slds_vem.py::test_input_driven_e_step_with_zero_w_is_unchanged",
})
#: Parametrized checks whose variants added up to more than ~8 s (measured Nov 27 with
#: `--durations=0` on 2 loaded cores): the first variant (in collection order) runs in CI,
#: the others (the same check on another size, seed, cell or model) in the slow tier.
FIRST_VARIANT_IN_CI = frozenset({
    "tests/core/test_buckets.py::test_gradient_fits_keep_a_bounded_number_of_programs",
    "tests/distributed/test_time_parallel.py::test_sharded_equals_sequential",
    "tests/inference/test_deer.py::"
    "test_converges_to_sequential_trajectory_with_the_implicit_gradient",
    "tests/inference/test_deer_quasi_adjoint.py::"
    "test_parallel_adjoint_equals_backpropagation_through_time",
    "tests/inference/test_hmm.py::test_smoother_matches_brute_force",
    "tests/inference/test_hmm_paths.py::test_sampled_path_frequencies_match_enumeration",
    "tests/inference/test_hmm_paths.py::test_viterbi_identical_to_the_sequential_scan",
    "tests/inference/test_hmm_unrolled.py::test_unrolled_equals_plain_at_every_length",
    "tests/inference/test_hmm_unrolled.py::test_unrolled_matches_brute_force",
    "tests/inference/test_kalman.py::test_filter_and_smoother_equal_dense_conditioning",
    "tests/inference/test_kalman.py::test_posterior_samples_have_the_smoothed_moments",
    "tests/inference/test_kalman.py::test_steady_state_log_likelihood_gradient_equals_exact",
    "tests/inference/test_kalman.py::test_steady_state_log_probs_switches_as_soon_as_converged",
    "tests/inference/test_kalman.py::test_steady_state_smoother_equals_exact_smoother",
    "tests/inference/test_kalman_diffuse.py::"
    "test_full_air_passengers_against_statsmodels_down_to_zero_variance",
    "tests/inference/test_kalman_diffuse.py::test_local_level_against_exact_rationals",
    "tests/inference/test_kalman_diffuse.py::"
    "test_trend_and_quarterly_seasonal_against_exact_rationals",
    "tests/inference/test_kalman_diffuse.py::"
    "test_two_series_partly_diffuse_with_missing_entries_against_exact_rationals",
    "tests/inference/test_kalman_diffuse_smoother.py::"
    "test_full_air_passengers_against_statsmodels_down_to_zero_variance",
    "tests/inference/test_kalman_small_kernels.py::"
    "test_filter_and_smoother_match_dense_conditioning_and_generic_path",
    "tests/inference/test_kalman_sqrt.py::test_equals_plain_filter_in_float64",
    "tests/inference/test_kalman_steady_padded.py::"
    "test_padded_steady_state_log_probs_equal_unpadded",
    "tests/models/neural/test_aft.py::test_every_mode_matches_the_dense_weights",
    "tests/models/neural/test_aft.py::test_modes_agree_in_log_prob_and_gradient",
    "tests/models/neural/test_linear_attention.py::test_modes_agree_in_log_prob_and_gradient",
    "tests/models/neural/test_mlstm.py::test_recurrent_and_parallel_modes_agree_with_gradients",
    "tests/models/neural/test_rnn_batch.py::"
    "test_batch_path_equals_step_by_step_filter_and_autodiff",
    "tests/models/neural/test_rnn_batch.py::test_lstm_layer_vjp_equals_autodiff",
    "tests/models/neural/test_rnn_evaluation.py::"
    "test_log_prob_and_gradient_equal_the_sequential_scan",
    "tests/models/neural/test_rwkv.py::test_recurrent_and_parallel_modes_agree_with_gradients",
    "tests/models/neural/test_s4.py::test_modes_agree_in_log_prob_and_gradient",
    "tests/models/neural/test_ssm_evaluation.py::"
    "test_deer_is_the_associative_scan_and_exact_after_one_newton_step",
    "tests/models/neural/test_ssm_evaluation.py::"
    "test_log_prob_and_gradient_equal_the_sequential_scan",
    "tests/models/neural/test_transformer.py::test_equals_flax_multi_head_attention",
    "tests/models/neural/test_transformer.py::test_every_form_matches_numpy_attention",
    "tests/models/neural/test_transformer.py::test_kv_cache_generation_equals_full_causal_forward",
    "tests/models/neural/test_wavenet.py::test_queue_generation_equals_the_convolution",
    "tests/models/test_arhmm_tied_spherical.py::test_em_step_matches_weighted_least_squares",
    "tests/models/test_arhmm_tied_spherical.py::test_fit_em_is_monotone_and_saves",
    "tests/models/test_deepstate.py::test_constant_network_log_prob_equals_structural_model",
    "tests/models/test_h_step_exact.py::test_arhmm_claims_horizons_2_to_8",
    "tests/models/test_h_step_exact.py::test_msar_forms_claims",
    "tests/models/test_hmm.py::test_filter_states_equal_brute_force",
    "tests/models/test_hmm.py::test_smoother_sequential_and_parallel_equal_brute_force",
    "tests/models/test_hmm_emissions.py::test_em_is_monotone_on_random_problems",
    "tests/models/test_hmm_emissions.py::test_em_matches_hmmlearn",
    "tests/models/test_hmm_emissions.py::test_log_prob_and_smoother_match_brute_force",
    "tests/models/test_hmm_published.py::test_em_reaches_the_published_mle",
    "tests/models/test_hmm_tied_spherical.py::test_em_matches_hmmlearn",
    "tests/models/test_hmm_tied_spherical.py::"
    "test_em_with_missing_entries_is_monotone_and_fit_em_runs",
    "tests/models/test_hmm_tied_spherical.py::test_score_matches_hmmlearn_and_brute_force",
    "tests/models/test_lgssm.py::test_steady_state_fast_path_equals_the_step_by_step_filter",
    "tests/models/test_ms_ar.py::test_em_is_monotone_and_reaches_a_stationary_point",
    "tests/models/test_ssm_singular.py::"
    "test_singular_state_cov_and_zero_obs_var_match_dense_conditioning_and_statsmodels",
    "tests/models/test_ssm_sqrt_singular.py::test_square_root_smoother_matches_dense_conditioning",
    "tests/models/test_structural.py::test_log_likelihood_and_smoothed_states",
    "tests/models/test_structural_regression.py::test_loglike_at_fixed_params_matches_statsmodels",
    "tests/test_bench_backbones.py::test_row_fields_and_loss",
    "tests/test_bench_deer.py::test_sequential_method_is_the_sequential_scan",
    "tests/test_compat.py::test_xla_flags_left_alone",
    "tests/test_evaluation.py::test_backtest_equals_direct_forecasts_on_truncated_series",
})
#: test_contract runs each model's first example in CI; its other examples (other emission,
#: covariance or component options of the same model, which the model's own file tests) run
#: in the slow tier.
#: h-step claims of these families run in the slow tier; CI keeps one family per code path
#: (GaussianHMM-diagonal, PoissonHMM-inputs, CategoricalHMM, AR-2-intercept-inputs,
#: TimeVaryingLinearGaussianSSM, LocalLevel, LinearGaussianSSM-D2, BernoulliHMM-D2).
CLAIMS_SLOW_IDS = frozenset({
    "GaussianHMM-full", "GaussianHMM-spherical", "GaussianHMM-tied", "GaussianHMM-inputs",
    "PoissonHMM", "BernoulliHMM", "AR-1", "AR-2", "LinearGaussianSSM", "LocalLinearTrend",
    "StructuralModel-trend-seasonal-ar-regression", "GaussianHMM-D2", "PoissonHMM-D2", "AR-D2",
})
#: Mode-equivalence tests run at T in {1, 17, 1000} in CI; T = 2 in the slow tier.
SLOW_TIER_MODE_TESTS = (
    "test_modes_agree_in_log_prob_and_gradient", "test_recurrent_and_parallel_modes_agree",
    "test_queue_generation_equals_the_convolution",
)


def _slow_tier(nodeid: str, seen: set) -> bool:
    path, _, rest = nodeid.partition("::")
    name, _, params = rest.partition("[")
    params = params.rstrip("]")
    tokens = set(params.split("-")) if params else set()
    base = nodeid.split("[")[0]
    if base in FIRST_VARIANT_IN_CI:
        if base in seen:
            return True
        seen.add(base)  # the first variant, also when it is slow below: one at most in CI
    if nodeid in SLOW_TIER_NODEIDS:
        return True
    if path.startswith(TABLE_MODULES) and tokens & SLOW_TIER_MODEL_ROWS:
        return True
    if path == "tests/core/test_contract.py" and params.rsplit("-", 1)[-1] not in ("", "0"):
        return True
    if path == "tests/evaluation/test_claims.py" and params in CLAIMS_SLOW_IDS:
        return True
    if nodeid.split("[")[0] in SLOW_TIER_TESTS:
        return True
    return name.startswith(SLOW_TIER_MODE_TESTS) and "2" in tokens


def pytest_collection_modifyitems(config, items):
    """Mark the slow tier; under pytest-xdist, move `LONGEST_MODULES_FIRST` to the front."""
    seen: set = set()
    for item in items:
        if _slow_tier(item.nodeid, seen):
            item.add_marker(pytest.mark.slow)
    if not hasattr(config, "workerinput"):
        return  # a plain run keeps pytest's order
    rank = {name: i for i, name in enumerate(LONGEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def log_lynx():
    """The classic log10 lynx trappings series (114 annual values, 1821-1934)."""
    import statseq as ss

    return np.log10(ss.datasets.load_lynx().to_numpy().astype(float))


@pytest.fixture
def rng():
    """A fresh, seeded NumPy generator for each test."""
    return np.random.default_rng(20240611)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Drop JAX's in-memory compilation caches after each test module.

    A single pytest process compiles some thousands of XLA programs; keeping them all
    loaded grew the process until XLA:CPU crashed (a segfault while compiling) late in a CI
    run on 2 cores. Modules rarely share programs, so clearing costs little.
    """
    yield
    import gc

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module")
def xla_optimized():
    """Compile this module's programs with XLA's full backend optimization.

    The suite compiles at ``--xla_backend_optimization_level=0`` (above), which saves
    compile time but about doubles the run time of the generated code. A few modules are
    runtime-bound (NUTS chains of hundreds of iterations, SBC): they opt back in with
    ``pytestmark = pytest.mark.usefixtures("xla_optimized")``. The level goes into each
    compilation's options (as ``jax.jit(..., compiler_options=...)`` would put it), so the
    persistent cache keys of the two kinds of program differ; the in-memory caches are
    cleared after the module (``_release_compiled_programs``), so no optimized program
    outlives it.
    """
    if os.environ.get("STATSEQ_TEST_XLA_OPT", "").strip() not in ("", "0"):
        yield  # the whole suite runs optimized already
        return
    from jax._src import compiler

    original = getattr(compiler, "get_compile_options", None)
    if original is None:  # a JAX without this (private) hook: the module runs at -O0
        yield
        return

    def optimized(*args, env_options_overrides=None, **kwargs):
        overrides = dict(env_options_overrides or {})
        overrides.setdefault("xla_backend_optimization_level", 3)
        overrides.setdefault("xla_llvm_disable_expensive_passes", False)
        return original(*args, env_options_overrides=overrides, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(compiler, "get_compile_options", optimized)
    jax.clear_caches()  # nothing compiled at -O0 earlier in this process is reused
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(scope="session", autouse=True)
def _one_program_per_length():
    """Length buckets off (`statseq.set_length_buckets("never")`) for the suite.

    The default policy pads every new length after the first 32 a process sees, so in one
    long pytest process whether a test ran padded would depend on the tests before it.
    tests/core/test_buckets.py turns buckets on explicitly and checks that padded results
    equal these unpadded ones for every model family.

    Likewise the fits' bounded program caches (`statseq.core.buckets.bound_cache` drops a
    fitting loop's programs once it holds more than ``MAX_PROGRAMS_PER_FUNCTION``) are
    unbounded here: the suite fits dozens of models in one process, and the contract test
    that a repeated fit reuses its program would otherwise depend on how many fits ran
    before it. test_buckets.py sets small bounds itself and checks them.
    """
    import statseq as ss
    from statseq.core import buckets

    ss.set_length_buckets("never")
    buckets.MAX_PROGRAMS_PER_FUNCTION = 10**9
    yield


@pytest.fixture(scope="session")
def run_vignette_smoke():
    """A function ``name -> namespace`` that runs ``vignettes/<name>.py`` top to bottom in
    smoke mode (``STATSEQ_SMOKE=1``, figures discarded) and returns its globals."""
    import runpy
    from pathlib import Path

    import matplotlib.pyplot as plt

    def run(name: str) -> dict:
        path = Path(__file__).resolve().parents[1] / "vignettes" / f"{name}.py"
        mp = pytest.MonkeyPatch()
        mp.setenv("STATSEQ_SMOKE", "1")
        mp.setattr(plt, "show", lambda *a, **k: None)
        try:
            return runpy.run_path(str(path), run_name="__main__")
        finally:
            plt.close("all")
            mp.undo()

    return run


if os.environ.get("STATSEQ_TEST_CPU_LOG"):
    # Profiling aid (off by default): append "nodeid<TAB>cpu seconds" of each test's
    # setup + call + teardown (this process's CPU time, compile threads included) to the
    # file STATSEQ_TEST_CPU_LOG names, so a suite run on a loaded machine still says
    # where its CPU time goes.
    import time as _time

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start = _time.process_time()
        yield
        with open(os.environ["STATSEQ_TEST_CPU_LOG"], "a") as fh:
            fh.write(f"{item.nodeid}\t{_time.process_time() - start:.3f}\n")
