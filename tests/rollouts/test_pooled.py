"""Pooled statistics from a held array of log-ratios: the batch's fit, autocorrelation and CGF, exactly."""

import numpy as np
import pytest

from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.cgf import EmpiricalCGF
from variance_lab.rollouts.pooled import needs_reload, pooled_fit, set_moments, y_autocorrelation
from variance_lab.rollouts.statistics import TokenLayout, fit_with_autocorrelation


def _batch(seed: int) -> TokenBatch:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, size=int(rng.integers(2, 150)))
    n = int(lengths.sum())
    old = -rng.exponential(1.0, n) - 0.01
    new = np.minimum(old + rng.standard_normal(n) * [0.01, 0.3, 3.0][seed % 3], 0.0)
    mask = (rng.random(n) > 0.1).astype(float) if seed % 2 else None  # holes in half the batches
    return TokenBatch.from_flat(new, old, lengths, mask=mask, on_bad="drop")


@pytest.mark.parametrize("seed", range(12))
def test_pooled_fit_is_fit_with_autocorrelation(seed):
    """The fit, autocorrelation (or why none) and CGF of the held array are the batch's, bit for bit."""
    batch = _batch(seed)
    y = batch.log_ratio
    layout = TokenLayout.of(batch)
    s = np.concatenate([[1.0, 2.0], 1.0 / batch.lengths, 2.0 * (1.0 / batch.lengths)])
    moments = set_moments(y, float(np.max(np.abs(y))), s)
    h = y.copy()
    acf, note = y_autocorrelation(h, layout, moments, c=5.0)
    assert not np.array_equal(h, y)  # centred in place
    if needs_reload(layout, moments):
        h[:] = y
    fit = pooled_fit(h, layout, moments, acf, c=5.0, y_constant=bool(np.all(y == y[0])))
    want_fit, want_acf, want_note = fit_with_autocorrelation(batch)
    assert fit == want_fit
    assert note == want_note
    assert (acf is None) == (want_acf is None)
    if acf is not None:
        assert np.array_equal(acf.acf, want_acf.acf)
        assert (acf.gamma0, acf.tau_int, acf.window) == (want_acf.gamma0, want_acf.tau_int, want_acf.window)
    cgf, want = moments.cgf(), EmpiricalCGF(y)
    assert (cgf.mean, cgf.zmax, cgf.n) == (want.mean, want.zmax, want.n)
    assert np.array_equal(cgf.L(s), want.L(s))


def test_a_cgf_of_sums_needs_its_values_for_a_new_direct_point():
    """L(s) where the series does not serve, at an s not computed: an error, or the values where given."""
    y = np.random.default_rng(0).standard_normal(1000) * 3.0
    moments = set_moments(y, float(np.max(np.abs(y))), [1.0])
    assert moments.direct  # L(1) needed every value: 1 * zmax > 2
    with pytest.raises(ValueError, match="needs every value"):
        moments.cgf().L(0.9)
    assert moments.cgf(lambda: y).L(0.9) == EmpiricalCGF(y).L(0.9)
