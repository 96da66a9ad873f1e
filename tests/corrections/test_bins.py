"""Token-level masks binned by the token's probability or entropy (:func:`mask_by_bins`): plain counts."""

import numpy as np
import pytest

from variance_lab import corrections as co

#: This module's random file: longest, scale, sd, advantages (the ``token_file`` fixture's arguments).
FILE = (20, 1.5, 0.5, (-1.0, 0.0, 2.0))


def test_fractions_are_plain_counts_per_bin(token_file):
    """Each bin's fraction, token and sequence counts are what a loop over its tokens gives."""
    lengths, off, log_r, log_mu, adv = token_file(1, 80, *FILE)
    p = np.exp(log_mu)
    edges = [0.0, 0.05, 0.3, 0.7, 1.0]
    df = co.mask_by_bins(
        log_r, off, "dppo-tv:0.1,kpop:0.05,icepop:1.5", p, edges, log_mu=log_mu, advantages=adv
    )
    assert df.shape[0] == 12
    assert (df.by == "p").all()
    seq = np.repeat(np.arange(lengths.size), lengths)
    d = p * np.expm1(log_r)  # pi - mu
    flags = {
        "dppo-tv:0.1": np.where(np.repeat(adv, lengths) > 0, d > 0.1, d < -0.1),
        "kpop:0.05": co.apply_prob(co.parse("kpop:0.05"), log_r, log_mu)[1],
        "icepop:1.5": np.abs(log_r) > np.log(1.5),
    }
    for row in df.itertuples(index=False):
        last = row.bin_hi == 1.0
        inside = (p >= row.bin_lo) & ((p <= row.bin_hi) if last else (p < row.bin_hi))
        assert row.n_tokens == inside.sum()
        assert row.n_seq == np.unique(seq[inside]).size
        assert row.frac_modified == pytest.approx(flags[row.correction][inside].mean(), rel=1e-12, abs=0)
        assert row.frac_modified_lo <= row.frac_modified <= row.frac_modified_hi


def test_predictions_per_bin(token_file):
    """A probability-aware row predicts the bin's mean of expected_masked; a ratio mask its lognormal's."""
    lengths, off, log_r, log_mu, adv = token_file(2, 80, *FILE)
    p = np.exp(log_mu)
    df = co.mask_by_bins(
        log_r, off, "dppo-kl:0.02,icepop:2", p, [0.0, 0.2, 1.0], log_mu=log_mu, advantages=adv
    )
    e = co.expected_masked(co.parse("dppo-kl:0.02"), log_r, log_mu, np.repeat(adv, lengths))
    low = p < 0.2
    kl = df[df.correction == "dppo-kl:0.02"]
    np.testing.assert_allclose(kl.pred_frac_modified, [e[low].mean(), e[~low].mean()], rtol=1e-12)
    ice = co.theory(co.fit_lognormal(log_r), [1], "icepop:2").frac_modified.iloc[0]
    np.testing.assert_allclose(df[df.correction == "icepop:2"].pred_frac_modified, [ice, ice], rtol=1e-15)


def test_entropy_bins_and_empty_bins(token_file):
    """Binned by any per-token value; an empty bin has no row; the top bin is closed."""
    _, off, log_r, log_mu, _ = token_file(3, 80, *FILE)
    h = np.linspace(0.0, 2.9, log_r.size)
    df = co.mask_by_bins(log_r, off, "kpop:0.05", h, [0.0, 1.0, 3.0, 5.0], by="entropy", log_mu=log_mu)
    assert df.bin_lo.tolist() == [0.0, 1.0]
    assert df.n_tokens.sum() == log_r.size
    default = co.mask_by_bins(log_r, off, "kpop:0.05", h, by="entropy", log_mu=log_mu)
    assert default.bin_lo.tolist() == list(co.ENTROPY_EDGES[:-1])


def test_bad_input_names_it(token_file):
    """Sequence-level specs, bad edges, values of the wrong length and an unknown variable are refused."""
    _, off, log_r, log_mu, _ = token_file(1, 80, *FILE)
    p = np.exp(log_mu)
    with pytest.raises(ValueError, match="seq-tis"):
        co.mask_by_bins(log_r, off, "seq-tis:2", p)
    with pytest.raises(ValueError, match="increasing"):
        co.mask_by_bins(log_r, off, "icepop", p, [0.5, 0.1])
    with pytest.raises(ValueError, match="one number per token"):
        co.mask_by_bins(log_r, off, "icepop", p[:-1])
    with pytest.raises(ValueError, match="by must be"):
        co.mask_by_bins(log_r, off, "icepop", p, by="q")
    with pytest.raises(ValueError, match="log_mu"):
        co.mask_by_bins(log_r, off, "kpop", p)


def test_cppo_bins_read_each_sequence(token_file):
    """The flags of cppo per bin come from the whole sequences (its budget), with no prediction."""
    lengths, off, log_r, log_mu, adv = token_file(4, 80, *FILE)
    p = np.exp(log_mu)
    df = co.mask_by_bins(log_r, off, "cppo:0.05:0.8:0.01", p, [0.0, 0.3, 1.0], log_mu=log_mu, advantages=adv)
    masked = co.apply_prob(
        co.parse("cppo:0.05:0.8:0.01"), log_r, log_mu, np.repeat(adv, lengths), offsets=off
    )[1]
    low = p < 0.3
    np.testing.assert_allclose(df.frac_modified, [masked[low].mean(), masked[~low].mean()], rtol=1e-12)
    assert masked.any()
    assert df.pred_frac_modified.isna().all()
    assert not df.pred_inside.any()
