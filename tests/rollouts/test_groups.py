"""Responses grouped by prompt: prompt_id in the data model, clustered intervals, held-out judgment.

The coverage tests draw synthetic GRPO-style rollouts: prompts with 4 responses each, a share
``q`` of the prompts (0 to 0.9) with 4 identical responses, the others with 4 responses of their
own lengths and tokens; every response of a prompt shares the prompt's random scale
``v ~ Gamma(ALPHA, THETA)``, tokens ``log r ~ N(-v/2, v)`` i.i.d. given ``v``, lengths with
``P(T) ~ 1/T`` on 8..255. Marginally each response is a random-scale sequence, so the true
GSPO clip fraction of a length bucket is the average over its lengths of
``E_v[P(mean log r outside the range | v, T)]``, computed here by quadrature (scipy), not by
the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as st
from scipy.stats import binomtest

from variance_lab.cli import main
from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.heldout import heldout_judgment, prompt_folds
from variance_lab.rollouts.io import load_batch, save_batch, write_records
from variance_lab.rollouts.judgment import group_summary
from variance_lab.rollouts.statistics import bucket_variances
from variance_lab.stats import cluster_counts, cluster_ratio, design_effect, wilson_interval

LA, LB = math.log(1 - 3e-4), math.log(1 + 4e-4)  # GSPO's default range, log
ALPHA, THETA = 0.5, 2e-5
EDGES = np.array([8, 16, 32, 64, 128, 256])
M = 4  # responses per prompt


# --------------------------------------------------------------------------------------
# the synthetic design and its truth
# --------------------------------------------------------------------------------------
def _length_pmf():
    T = np.arange(8, 256)
    p = 1.0 / T
    return T, p / p.sum()


def _outside(v, T):
    """P(mean of T tokens outside (LA, LB) | v): the mean is N(-v/2, v/T)."""
    s = np.sqrt(v / T)
    return st.norm.cdf((LA + v / 2) / s) + st.norm.sf((LB + v / 2) / s)


def _p_clip_quad(T: int) -> float:
    """E_v[_outside(v, T)], v ~ Gamma(ALPHA, THETA), by adaptive quadrature over u = v / THETA."""
    return integrate.quad(
        lambda u: _outside(THETA * u, T) * st.gamma.pdf(u, ALPHA), 0, 80, limit=200, points=[0.01, 0.1, 1, 5]
    )[0]


def _p_clip_grid(T: np.ndarray) -> np.ndarray:
    """Compute it for every T at once: u = w^2 (no singularity at 0), Simpson's rule in w on [0, 9]."""
    assert ALPHA == 0.5
    w = np.linspace(1e-9, 9.0, 4001)
    dens = 2 * np.exp(-w * w) / math.sqrt(math.pi)  # density of w = sqrt(u), u ~ Gamma(1/2)
    vals = _outside(THETA * w[None, :] ** 2, np.asarray(T, dtype=float)[:, None]) * dens
    return integrate.simpson(vals, x=w, axis=1)


@pytest.fixture(scope="module")
def truth() -> np.ndarray:
    """Return the true GSPO clip fraction of each bucket of EDGES."""
    T, p = _length_pmf()
    pc = _p_clip_grid(T)
    for t in (8, 60, 255):  # the fast grid against adaptive quadrature
        assert pc[t - 8] == pytest.approx(_p_clip_quad(t), abs=1e-7)
    b = np.searchsorted(EDGES, T, side="right") - 1
    return np.array([np.sum(p[b == k] * pc[b == k]) / p[b == k].sum() for k in range(EDGES.size - 1)])


def _design(rng, n_prompts: int, share: float):
    """(lengths, prompt of each response, identical flag per prompt, v per prompt) of one data set."""
    T, p = _length_pmf()
    v = rng.gamma(ALPHA, THETA, size=n_prompts)
    ident = rng.random(n_prompts) < share
    lengths = rng.choice(T, size=(n_prompts, M), p=p)
    lengths[ident] = lengths[ident, :1]  # identical responses: one length
    return lengths.ravel(), np.repeat(np.arange(n_prompts), M), ident, v


def _mean_log_r(rng, n_prompts: int, share: float):
    """Per response: (length, prompt, mean log r ~ N(-v/2, v/T)); identical responses share it."""
    lengths, prompt, ident, v = _design(rng, n_prompts, share)
    vv = np.repeat(v, M)
    ybar = rng.normal(-vv / 2, np.sqrt(vv / lengths)).reshape(n_prompts, M)
    ybar[ident] = ybar[ident, :1]
    return lengths, prompt, ybar.ravel()


def grouped_batch(rng, n_prompts: int, share: float) -> TokenBatch:
    """Draw a TokenBatch of the design: old_logp = -1, logp = -1 + log r, with prompt_id."""
    lengths, prompt, ident, v = _design(rng, n_prompts, share)
    seqs = []
    for g in range(n_prompts):
        first = rng.normal(-v[g] / 2, math.sqrt(v[g]), size=lengths[g * M])
        seqs.append(first)
        for j in range(1, M):
            seqs.append(
                first if ident[g] else rng.normal(-v[g] / 2, math.sqrt(v[g]), size=lengths[g * M + j])
            )
    y = np.concatenate(seqs)
    return TokenBatch.from_flat(-1.0 + y, np.full(y.size, -1.0), lengths, prompt_id=prompt)


def _clipped(ybar):
    return ((ybar < LA) | (ybar > LB)).astype(float)


# --------------------------------------------------------------------------------------
# prompt_id in the data model
# --------------------------------------------------------------------------------------
def _tiny(prompt_id=None, **kw) -> TokenBatch:
    logp = [np.full(3, -0.5), np.full(2, -0.4), np.full(3, -0.5), np.full(4, -0.3)]
    old = [np.full(3, -0.6), np.full(2, -0.4), np.full(3, -0.6), np.full(4, -0.2)]
    return TokenBatch.from_ragged(logp, old, prompt_id=prompt_id, **kw)


def test_prompt_id_is_kept_through_constructors_and_select():
    """prompt_id survives from_ragged, from_padded and select; group_index numbers the prompts."""
    b = _tiny(prompt_id=["a", "b", "a", "c"])
    assert b.has_groups
    assert b.prompt_id.tolist() == ["a", "b", "a", "c"]
    assert b.group_index().tolist() == [0, 1, 0, 2]
    assert b.select([3, 0]).prompt_id.tolist() == ["c", "a"]
    assert not _tiny().has_groups
    assert _tiny().group_index().tolist() == [0, 1, 2, 3]
    padded = TokenBatch.from_padded(np.full((2, 3), -0.5), np.full((2, 3), -0.6), prompt_id=[7, 7])
    assert padded.prompt_id.tolist() == [7, 7]
    assert padded.prompt_id.dtype == np.int64


def test_prompt_id_follows_dropped_sequences():
    """A dropped sequence takes its prompt id with it."""
    logp = [np.full(3, -0.5), np.array([np.nan, -1.0]), np.full(3, -0.5)]
    old = [np.full(3, -0.6), np.full(2, -0.4), np.full(3, -0.6)]
    b = TokenBatch.from_ragged(logp, old, prompt_id=[1, 2, 3], on_bad="drop")
    assert b.prompt_id.tolist() == [1, 3]
    assert b.n_dropped == 1


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ([1, None, 2, 3], "prompt_id of sequence 1 is null"),
        ([1, [2], 2, 3], "prompt_id of sequence 1 must be a string or an integer, got list"),
        ([1, 2, 2.5, 3], "prompt_id of sequence 2 must be a string or an integer, got float"),
        ([1, 2, True, 3], "prompt_id of sequence 2 must be a string or an integer, got bool"),
        ([1, 2, 3], "prompt_id must be a 1-D sequence of 4 ids"),
    ],
)
def test_bad_prompt_id_is_a_value_error_naming_it(bad, match):
    """None, a list, a float, a bool or a wrong length: ValueError naming the sequence."""
    with pytest.raises(ValueError, match=match):
        _tiny(prompt_id=bad)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "npz"])
def test_prompt_id_round_trips_through_every_format(tmp_path, fmt):
    """save_batch writes prompt_id, load_batch reads it back; files without it load without groups."""
    pytest.importorskip("pyarrow") if fmt == "parquet" else None
    b = _tiny(prompt_id=["p1", "p2", "p1", "p3"])
    back = load_batch(save_batch(b, tmp_path / f"b.{fmt}"))
    assert back.prompt_id.tolist() == ["p1", "p2", "p1", "p3"]
    assert not load_batch(save_batch(_tiny(), tmp_path / f"n.{fmt}")).has_groups


def _records(prompts):
    recs = [{"id": i, "logp": [-0.5, -0.4], "old_logp": [-0.6, -0.4]} for i in range(len(prompts))]
    for rec, p in zip(recs, prompts, strict=True):
        if p != "absent":
            rec["prompt_id"] = p
    return recs


@pytest.mark.parametrize(
    ("prompts", "match"),
    [
        ([0, None, 1], r"record 1 \(id=1\): field 'prompt_id' is null"),
        ([0, [1, 2], 1], r"record 1 \(id=1\): field 'prompt_id' must be a string or an integer, got list"),
        ([0, 1.5, 1], r"record 1 \(id=1\): field 'prompt_id' must be a string or an integer, got float"),
        ([0, "absent", 1], "record 1: no prompt_id, though other records have one"),
    ],
)
def test_bad_prompt_id_in_a_file_names_the_record(tmp_path, prompts, match):
    """A null, list or float prompt_id, or one missing where others have it: one error naming the record."""
    path = write_records(_records(prompts), tmp_path / "r.jsonl")
    with pytest.raises(ValueError, match=match):
        load_batch(path)


def test_nemo_rl_idx_is_not_a_prompt(tmp_path):
    """NeMo-RL's idx is the line's number (its logger writes ``{**sample, "idx": i}``), never a group.

    The group is the prompt's token ids (before the first token of token_loss_mask); without
    token_ids the dump cannot say, and the batch has no groups and a note.
    """
    recs = [
        {
            "idx": i,
            "token_ids": [[7 + i // 2, 3, 40 + i]],
            "token_loss_mask": [[0, 0, 1]],
            "prev_logprobs": [[0.0, 0.0, -0.4]],
            "generation_logprobs": [[0.0, 0.0, -0.41]],
        }
        for i in range(4)
    ]
    b = load_batch(write_records(recs, tmp_path / "n.jsonl"), preset="nemo-rl")
    assert b.ids.tolist() == [0, 1, 2, 3]
    assert b.prompt_id.tolist() == [0, 0, 1, 1]
    for r in recs:
        del r["token_ids"]
    b = load_batch(write_records(recs, tmp_path / "m.jsonl"), preset="nemo-rl")
    assert not b.has_groups
    assert len(b.notes) == 1
    assert "cannot say which responses answer one prompt" in b.notes[0]


def test_cli_bad_prompt_id_is_one_line_exit_2(tmp_path, capsys):
    """On the command line a bad prompt_id is one line on stderr and exit status 2."""
    path = write_records(_records([0, None, 1]), tmp_path / "r.jsonl")
    assert main(["analyze", str(path), "--n-boot", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "record 1" in err
    assert "prompt_id" in err


def test_identical_responses_without_prompt_id_are_counted_and_noted():
    """Without prompt_id, identical responses are counted and the note suggests the field."""
    b = _tiny()  # sequences 0 and 2 are identical
    assert b.n_identical() == 1
    g = group_summary(b)
    assert g["n_identical"] == 1
    assert "add a prompt_id" in g["note"].lower()
    assert "over sequences" in g["interval_method"]
    g2 = group_summary(_tiny(prompt_id=[0, 1, 0, 2]))
    assert g2["note"] == ""
    assert g2["n_prompts"] == 3
    assert "over prompts" in g2["interval_method"]


# --------------------------------------------------------------------------------------
# cluster statistics
# --------------------------------------------------------------------------------------
def test_design_effect_of_exact_copies_is_the_group_size():
    """Four identical responses per prompt: design effect 4, times (G/(G-1)) / (n/(n-1))."""
    rng = np.random.default_rng(1)
    y = np.repeat(rng.random(50) < 0.3, 4).astype(float)
    g = np.repeat(np.arange(50), 4)
    G, n = 50, 200
    assert design_effect(y, np.ones(n), g) == pytest.approx(4 * (G / (G - 1)) / (n / (n - 1)), rel=1e-12)
    assert design_effect(y, np.ones(n), np.arange(n)) == pytest.approx(1.0, rel=1e-12)


def test_cluster_counts_resample_whole_clusters():
    """A resample weights every unit of a cluster alike and draws as many clusters as there are."""
    g = np.array([0, 0, 1, 2, 2, 2])
    W = cluster_counts(g, 500, np.random.default_rng(0))
    assert W.shape == (500, 6)
    assert np.all(W[:, 0] == W[:, 1])
    assert np.all(W[:, 3] == W[:, 5])
    assert np.all(W[:, [0, 2, 3]].sum(axis=1) == 3)  # 3 clusters drawn per resample


def test_cluster_ratio_without_groups_is_close_to_wilson():
    """One sequence per prompt: design effect about 1, the interval about Wilson's (bootstrap noise)."""
    rng = np.random.default_rng(2)
    y = (rng.random(400) < 0.2).astype(float)
    r = cluster_ratio(y, np.ones(400), np.arange(400), n_boot=4000, level=0.95, rng=rng, proportion=True)
    lo, hi = wilson_interval(y.sum(), 400)
    # the bootstrap variance's relative SE is sqrt(2/n_boot) = 2.2 %: the width within 4 SE / 2
    assert r["design_effect"] == pytest.approx(1.0, abs=4 * math.sqrt(2 / 4000))
    assert (r["hi"] - r["lo"]) / (hi - lo) == pytest.approx(1.0, abs=2 * math.sqrt(2 / 4000))


# --------------------------------------------------------------------------------------
# coverage of the clustered GSPO clip interval
# --------------------------------------------------------------------------------------
def _coverage_fast(truth, n_sets: int, seed: int):
    hits = wil = total = 0
    for i, ss in enumerate(np.random.SeedSequence(seed).spawn(n_sets)):
        rng = np.random.default_rng(ss)
        lengths, prompt, ybar = _mean_log_r(rng, 150, [0.0, 0.3, 0.6, 0.9][i % 4])
        clip = _clipped(ybar)
        b = np.searchsorted(EDGES, lengths, side="right") - 1
        for k in range(EDGES.size - 1):
            s = b == k
            r = cluster_ratio(
                clip[s], np.ones(s.sum()), prompt[s], n_boot=300, level=0.95, rng=rng, proportion=True
            )
            lo, hi = wilson_interval(clip[s].sum(), s.sum())
            hits += r["lo"] <= truth[k] <= r["hi"]
            wil += lo <= truth[k] <= hi
            total += 1
    return hits, wil, total


def test_clustered_clip_interval_covers(truth):
    """40 data sets x 5 buckets: the clustered 95 % interval covers (binomial test, 1 %); Wilson's not."""
    hits, wil, total = _coverage_fast(truth, 40, seed=11)
    assert binomtest(hits, total, 0.95).pvalue > 0.01, hits / total
    assert binomtest(wil, total, 0.95, alternative="less").pvalue < 0.01, wil / total


@pytest.mark.slow
def test_clustered_clip_interval_covers_through_bucket_variances(truth):
    """400 data sets of tokens through bucket_variances: 95 % coverage within a 1 % binomial test.

    Measured (seed 5): clustered 0.944, Wilson on the same buckets 0.792, over 2,000 bucket intervals
    (docs/guide/groups.md).
    """
    hits = wil = total = 0
    for i, ss in enumerate(np.random.SeedSequence(5).spawn(400)):
        rng = np.random.default_rng(ss)
        batch = grouped_batch(rng, 150, [0.0, 0.3, 0.6, 0.9][i % 4])
        obs = bucket_variances(batch, EDGES, n_boot=200, seed=ss)
        iid = bucket_variances(dataclasses.replace(batch, prompt_id=None), EDGES, n_boot=0)
        for r, q in zip(obs.itertuples(), iid.itertuples(), strict=True):
            k = int(r.bucket)
            hits += r.gspo_clip_frac_lo <= truth[k] <= r.gspo_clip_frac_hi
            wil += q.gspo_clip_frac_lo <= truth[k] <= q.gspo_clip_frac_hi
            total += 1
    print(f"coverage: clustered {hits / total:.3f}, Wilson {wil / total:.3f} over {total}")
    assert binomtest(hits, total, 0.95).pvalue > 0.01, hits / total
    assert wil / total < 0.9


# --------------------------------------------------------------------------------------
# the analysis with groups
# --------------------------------------------------------------------------------------
def test_bucket_variances_report_design_effect_and_prompts():
    """Each bucket counts its prompts (a prompt split over buckets counts in each); a design effect."""
    batch = grouped_batch(np.random.default_rng(3), 60, 0.9)
    obs = bucket_variances(batch, EDGES, n_boot=100, seed=0)
    assert {"design_effect", "n_prompts", "gspo_clip_frac_lo", "gspo_clip_frac_hi"} <= set(obs.columns)
    g = batch.group_index()
    b = np.searchsorted(EDGES, batch.lengths, side="right") - 1
    for r in obs.itertuples():
        assert r.n_prompts == np.unique(g[b == r.bucket]).size  # a prompt split over buckets counts in each
        assert r.gspo_clip_frac_lo <= r.gspo_clip_frac <= r.gspo_clip_frac_hi
    plain = bucket_variances(dataclasses.replace(batch, prompt_id=None), EDGES, n_boot=100, seed=0)
    assert plain["design_effect"].isna().all()
    assert plain["n_prompts"].isna().all()


def test_analyze_names_the_method_and_keeps_keys():
    """The summary names the interval method; the table keeps the interval keys and adds the new ones."""
    batch = grouped_batch(np.random.default_rng(4), 40, 0.5)
    res = analyze(batch, EDGES, n_boot=50, fit_models=False)
    s = res.summary()
    assert "bootstrap over prompts (40 prompts" in s["groups"]["interval_method"]
    keys = set(json.loads(json.dumps(res.table.iloc[0].to_dict(), default=str)))
    assert {"gspo_clip_frac_lo", "gspo_clip_frac_hi", "design_effect", "n_prompts", "var_G_lo"} <= keys


def test_heldout_keeps_prompts_together_and_sums_folds():
    """No prompt sits on both sides of a fold; the fits are summed over folds."""
    batch = grouped_batch(np.random.default_rng(6), 100, 0.5)
    fold = prompt_folds(batch, 2, seed=0)
    for g in np.unique(batch.group_index()):
        assert np.unique(fold[batch.group_index() == g]).size == 1
    seen = []

    def judge(eval_batch, fit_batch, f):  # a fake judgment: 'hier' fits every bucket of 20+ sequences
        seen.append((set(eval_batch.prompt_id.tolist()), set(fit_batch.prompt_id.tolist())))
        import pandas as pd

        n = np.bincount(np.searchsorted(EDGES, eval_batch.lengths, side="right") - 1, minlength=5)
        return pd.DataFrame(
            {
                "bucket": np.arange(5),
                "fits": ["hier" if k >= 20 else "" for k in n],
                "best_model": ["hier" if k >= 20 else "too few sequences" for k in n],
            }
        )

    out = heldout_judgment(batch, judge, k=2, seed=0)
    assert all(not (a & b) for a, b in seen)  # no prompt on both sides
    assert out["best_model"] == "hier"
    assert out["fits"]["hier"] == out["n_judged"] > 0
    assert out["unit"] == "prompts"
    assert out["k"] == 2


# --------------------------------------------------------------------------------------
# corrections on grouped data
# --------------------------------------------------------------------------------------
def test_corrections_mean_weight_interval_stays_non_negative():
    """A heavy-tailed mean of non-negative weights gets an interval inside [0, max w], never below 0."""
    from variance_lab import corrections as co

    rng = np.random.default_rng(8)
    lengths = np.full(200, 50)
    log_r = rng.normal(-2.0, 2.0, size=lengths.sum())  # P_T spans hundreds of decades
    off = np.concatenate([[0], np.cumsum(lengths)])
    row = co.evaluate(log_r, off, "seq-tis:1e300").iloc[0]
    assert 0.0 <= row.mean_w_lo <= row.mean_w <= row.mean_w_hi


def test_corrections_fractions_cluster_by_prompt():
    """With groups, the sequence-level modified fraction's interval widens by about sqrt(design effect)."""
    from variance_lab import corrections as co

    rng = np.random.default_rng(9)
    n_prompts, lengths = 200, np.full(800, 20)
    y = np.repeat(rng.normal(0.0, 0.05, size=(n_prompts, 20)), M, axis=0).ravel()  # 4 identical copies
    off = np.concatenate([[0], np.cumsum(lengths)])
    plain = co.evaluate(y, off, "seq-mask:1.1").iloc[0]
    grouped = co.evaluate(y, off, "seq-mask:1.1", groups=np.repeat(np.arange(n_prompts), M)).iloc[0]
    ratio = (grouped.frac_modified_hi - grouped.frac_modified_lo) / (
        plain.frac_modified_hi - plain.frac_modified_lo
    )
    # copies of 4: design effect 4 (its bootstrap estimate has relative SE sqrt(2 / 2000) = 3.2 %), so the
    # width ratio is about 2 with relative SE 1.6 %: 4 SE
    assert ratio == pytest.approx(2.0, rel=4 * 0.016)
    assert grouped.frac_modified == plain.frac_modified


# --------------------------------------------------------------------------------------
# output: progress bar, failed intervals
# --------------------------------------------------------------------------------------
def test_progress_bar_only_when_asked_or_on_a_terminal(capsys):
    """progress=True draws the tqdm bar on stderr; the default draws none when stderr is not a terminal."""
    batch = grouped_batch(np.random.default_rng(10), 30, 0.5)
    analyze(batch, EDGES, n_boot=20, fit_models=False, progress=True)
    assert "analyze: fitting models" in capsys.readouterr().err
    analyze(batch, EDGES, n_boot=20, fit_models=False)  # pytest's stderr is no terminal
    assert capsys.readouterr().err == ""


def test_a_failed_interval_is_named_not_printed():
    """A bucket whose bootstrap-t failed shows its point and says so instead of the interval."""
    from variance_lab.report.analysis_table import render_analysis

    res = analyze(grouped_batch(np.random.default_rng(12), 40, 0.5), EDGES, n_boot=50, fit_models=False)
    table = res.table.copy()
    table.loc[0, ["log10_var_P_lo", "log10_var_P_hi", "interval_failed"]] = [math.nan, math.nan, "var_P"]
    text = render_analysis(table, res.summary(), "markdown")
    assert f"{table.loc[0, 'log10_var_P']:.3f} (interval failed: bootstrap-t unstable)" in text


def test_no_event_in_grouped_data_counts_prompts_not_responses():
    """0 of 400 responses in 100 prompts: no spread to measure clustering by, so Wilson's for 0 of 100."""
    y = np.zeros(400)
    r = cluster_ratio(
        y,
        np.ones(400),
        np.repeat(np.arange(100), 4),
        n_boot=200,
        level=0.95,
        rng=np.random.default_rng(0),
        proportion=True,
    )
    _, hi = wilson_interval(0, 100)
    assert (r["lo"], r["hi"]) == (0.0, pytest.approx(float(hi), rel=1e-12))
    assert float(hi) > float(wilson_interval(0, 400)[1]) * 3.5  # about 4 times the i.i.d. upper end


# --------------------------------------------------------------------------------------
# a bucket of one prompt (issue #34: was a ZeroDivisionError)
# --------------------------------------------------------------------------------------
def _one_prompt_per_bucket(tmp_path):
    """Four lines, two prompts: prompt a's two responses of 3 tokens, prompt b's two of 9 (two buckets)."""
    rng = np.random.default_rng(34)
    recs = []
    for prompt, length in (("a", 3), ("b", 9)):
        for k in range(2):
            old = -rng.exponential(1.0, length)
            logp = np.minimum(old + 0.05 * rng.standard_normal(length), 0.0)
            recs.append(
                {"id": f"{prompt}{k}", "prompt_id": prompt, "logp": logp.tolist(), "old_logp": old.tolist()}
            )
    return write_records(recs, tmp_path / "four.jsonl")


def test_one_prompt_bucket_has_undefined_intervals_not_a_traceback(tmp_path, capsys):
    """Each bucket holds one prompt: NaN variance intervals, nothing to resample between (API and CLI)."""
    path = _one_prompt_per_bucket(tmp_path)
    batch = load_batch(path)
    result = analyze(batch, n_boot=200, seed=0)
    t = result.table
    assert list(t["n_seq"]) == [2, 2]
    assert list(t["n_prompts"]) == [1, 1]
    assert np.isfinite(t["var_G"]).all()
    assert t[["var_G_lo", "var_G_hi", "log10_var_P_lo", "log10_var_P_hi"]].isna().all().all()
    assert list(t["interval_failed"]) == ["", ""]
    # the table itself says why (CSV and JSON too), where a judgment was asked for (n_boot > 0)
    assert list(t["verdict"]) == ["too few sequences"] * 2
    assert result.summary()["verdict"] == "too few sequences"
    assert list(analyze(batch, n_boot=0, seed=0).table["verdict"]) == ["n/a"] * 2
    assert main(["analyze", str(path), "--n-boot", "200"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert "Error" not in err
    assert "(2 prompts;" in out
    assert out.count("| too few sequences |") == 2


def test_one_prompt_bucket_verdict_names_its_reason():
    """A bucket of enough sequences, all of one prompt: verdict n/a with its reason; one threshold."""
    from types import SimpleNamespace

    from variance_lab.report.analysis_table import MIN_JUDGED, bucket_verdict
    from variance_lab.rollouts.predictions import MIN_BUCKET_SEQUENCES

    assert MIN_JUDGED == MIN_BUCKET_SEQUENCES
    row = SimpleNamespace(verdict="n/a", n_seq=24, n_prompts=1)
    assert bucket_verdict(row, 1000) == "n/a (one prompt)"
    assert bucket_verdict(row, 0) == "n/a"  # no bootstrap asked for: no interval is the reason
    too_few = SimpleNamespace(verdict="too few sequences", n_seq=1, n_prompts=math.nan)
    assert bucket_verdict(too_few, 1000) == "too few sequences"  # the table's own verdict, shown as it is
    assert bucket_verdict(SimpleNamespace(verdict="corrected", n_seq=24, n_prompts=1), 1000) == "corrected"
    lengths = np.full(24, 12)
    d = 0.02 * np.random.default_rng(5).standard_normal(lengths.sum())
    batch = TokenBatch.from_flat(d - 3.0, np.full(d.size, -3.0), lengths, prompt_id=np.zeros(24, dtype=int))
    row = bucket_variances(batch, n_boot=100, seed=0).iloc[0]
    assert row["n_prompts"] == 1
    assert math.isnan(row["var_G_lo"])
    assert math.isnan(row["log10_var_P_hi"])
