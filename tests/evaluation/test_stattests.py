"""Residual tests against statsmodels' implementations on the same residuals (to 1e-10)."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.diagnostic import acorr_ljungbox
from statsmodels.stats.stattools import jarque_bera as sm_jarque_bera
from statsmodels.tsa.stattools import acf as sm_acf
from statsmodels.tsa.stattools import breakvar_heteroskedasticity_test

from statseq.evaluation import stattests


@pytest.fixture
def resid(rng):
    e = rng.standard_t(df=5, size=150)
    return e + 0.3 * np.concatenate([[0.0], e[:-1]])  # some autocorrelation


def test_acf_equals_statsmodels(resid):
    np.testing.assert_allclose(stattests.acf(resid, 12), sm_acf(resid, nlags=12, fft=False),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("model_df", [0, 2])
def test_ljung_box_equals_statsmodels(resid, model_df):
    ours = stattests.ljung_box(resid, 10, model_df=model_df)
    ref = acorr_ljungbox(resid, lags=10, model_df=model_df)
    np.testing.assert_allclose(ours.statistic, ref["lb_stat"], rtol=1e-10)
    np.testing.assert_allclose(ours.pvalue, ref["lb_pvalue"], rtol=1e-10, equal_nan=True)
    if model_df:
        assert np.isnan(ours.pvalue[:model_df]).all()
    assert ours.pvalue[-1] < 0.05  # the MA(1) correlation is detected


@pytest.mark.parametrize("alternative", ["two-sided", "increasing", "decreasing"])
def test_heteroskedasticity_equals_statsmodels_breakvar(resid, alternative):
    x = resid * np.linspace(1.0, 2.0, resid.size)
    x[[3, 10, 140]] = np.nan  # missing residuals: unequal block sizes
    ours = stattests.heteroskedasticity(x, alternative=alternative)
    ref = breakvar_heteroskedasticity_test(x, subset_length=50, alternative=alternative)
    np.testing.assert_allclose(ours.statistic, ref.statistic, rtol=1e-10)
    np.testing.assert_allclose(ours.pvalue, ref.pvalue, rtol=1e-10)
    sub = stattests.heteroskedasticity(x, subset_length=20)
    ref = breakvar_heteroskedasticity_test(x, subset_length=20)
    np.testing.assert_allclose([sub.statistic, sub.pvalue], [ref.statistic, ref.pvalue],
                               rtol=1e-10)


def test_jarque_bera_equals_statsmodels(resid):
    ours = stattests.jarque_bera(resid)
    np.testing.assert_allclose(ours, sm_jarque_bera(resid), rtol=1e-10)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="finite"):
        stattests.ljung_box(np.array([1.0, np.nan, 2.0, 3.0]), 1)
    with pytest.raises(ValueError, match="lags"):
        stattests.ljung_box(np.arange(5.0), 0)
    with pytest.raises(ValueError, match="below the number"):
        stattests.acf(np.arange(5.0), 5)
    with pytest.raises(ValueError, match="constant"):
        stattests.jarque_bera(np.ones(10))
    with pytest.raises(ValueError, match="alternative"):
        stattests.heteroskedasticity(np.arange(1.0, 10.0), alternative="up")
    with pytest.raises(ValueError, match="subset_length"):
        stattests.heteroskedasticity(np.arange(1.0, 10.0), subset_length=20)
    with pytest.raises(ValueError, match="one-dimensional"):
        stattests.jarque_bera(np.ones((3, 3)))
