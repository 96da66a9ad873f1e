"""The shared core for ratios: defaults, the one bound rule, group advantages, the variance split.

The boundary test feeds values exactly at each path's LO and HI, and one ulp inside and outside
(float64 values, and the float32 values nearest each bound), through every clip and mask path of
the package, and checks each answer against the convention the path states (a bound kept or not,
log, linear or value space), written out here by hand.
"""

import itertools
import math

import numpy as np
import pytest

from variance_lab import corrections, ratios
from variance_lab.corrections import CORRECTION_KINDS, PROB_KINDS, apply_sequence, apply_tokens, parse
from variance_lab.corrections.sign import apply_signed
from variance_lab.frameworks import batch, nemo_rl, openrlhf, prime_rl, slime, trl, verl
from variance_lab.ratios import CLOSED, LEFT_OPEN, OPEN, RIGHT_OPEN, BoundRule, outside
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.weights import sequence_weights

F32, F64 = np.float32, np.float64


# --------------------------------------------------------------------------------------
# probes and the hand-written convention
# --------------------------------------------------------------------------------------
def _next(x, direction, dtype=F64):
    return float(np.nextafter(dtype(x), dtype(direction * np.inf)))


def _probes(bounds, dtype, linear=False):
    """Values at each finite bound (x space) and one ulp on either side; float32: the nearest float32s."""
    out = []
    for b in bounds:
        if b is None or not math.isfinite(b):
            continue
        if dtype is F64:
            if linear:  # one ulp of the compared value e^x, not of x
                assert np.exp(b) == np.exp(b)
                out += [b, _step(b, -1), _step(b, 1)]
            else:
                out += [b, _next(b, -1), _next(b, 1)]
        else:
            f = F32(b)
            out += [float(f), _next(f, -1, F32), _next(f, 1, F32)]
    return np.array(out)


def _step(x, direction):
    """Return the nearest float64 beyond ``x`` whose exponential differs from e^x."""
    y = _next(x, direction)
    while np.exp(y) == np.exp(x):
        y = _next(y, direction)
    return y


def _expected(values, lo, hi, inclusive):
    """Return modified or not by the convention, written out here (not taken from the core)."""
    out = []
    for v in values:
        ok_lo = lo is None or (lo <= v if inclusive[0] else lo < v)
        ok_hi = hi is None or (v <= hi if inclusive[1] else v < hi)
        out.append(not (ok_lo and ok_hi))
    return np.array(out)


def _check(modified, x, lo, hi, inclusive, *, compared=None, at=()):
    """Check ``modified`` against the convention on the compared values (default ``x``)."""
    v = x if compared is None else compared
    np.testing.assert_array_equal(np.asarray(modified, dtype=bool), _expected(v, lo, hi, inclusive))
    for i in at:  # teeth independent of the oracle: a closed bound keeps the value exactly at it
        assert not modified[i]


def _one_token(x):
    """(B, 1) arrays for B one-token sequences with log-ratio x: (mask, new or old, zeros)."""
    x = np.asarray(x, dtype=F64)[:, None]
    return np.ones_like(x), x, np.zeros_like(x)


# --------------------------------------------------------------------------------------
# the core
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("inclusive", [CLOSED, OPEN, LEFT_OPEN, RIGHT_OPEN])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_outside_at_and_next_to_the_bounds(inclusive, dtype):
    """The rule in log, value and linear space, at each bound and one ulp of the dtype on either side."""
    lo, hi = math.log(0.9997), math.log(1.0004)
    blo, bhi = dtype(lo), dtype(hi)  # the bounds as the dtype holds them
    x = np.array([blo, np.nextafter(blo, dtype(-1)), np.nextafter(blo, dtype(1))] + [bhi] * 1, dtype=dtype)
    x = np.append(x, [np.nextafter(bhi, dtype(-1)), np.nextafter(bhi, dtype(1))]).astype(dtype)
    for space in ("log", "value"):
        got = outside(x, lo, hi, inclusive=inclusive, space=space, dtype=dtype)
        want = _expected([float(v) for v in x], float(blo), float(bhi), inclusive)
        np.testing.assert_array_equal(got, want)
        assert got[[0, 3]].tolist() == [not inclusive[0], not inclusive[1]]
        assert got[[1, 2, 4, 5]].tolist() == [True, False, False, True]
    # linear: e^x in the dtype against the bounds in the dtype
    b_lo, b_hi = 0.5, 2.0
    y = np.log(np.array([b_lo, b_hi], dtype=dtype))
    assert np.exp(y).tolist() == [b_lo, b_hi]
    got = outside(y, b_lo, b_hi, inclusive=inclusive, space="linear", dtype=dtype)
    assert got.tolist() == [not inclusive[0], not inclusive[1]]


def test_outside_edges_and_rule():
    """No bound modifies nothing; NaN is outside; float32 rounds the bound; bad space or dtype raise."""
    x = np.array([-np.inf, -1.0, 0.0, 1.0, np.inf, np.nan])
    assert outside(x).tolist() == [False] * 5 + [True]
    assert outside(x, None, 0.0).tolist() == [False, False, False, True, True, True]
    assert outside(x, -math.inf, math.inf).tolist() == [False] * 5 + [True]
    assert outside([5.0], 0.0, None, space="linear").tolist() == [False]  # a lower bound 0 keeps all
    # float32: the value just above the float64 bound is equal to it in float32, so kept
    b = 0.1
    x = np.nextafter(b, 1.0)
    assert outside([x], None, b, dtype=F64).tolist() == [True]
    assert outside([x], None, b, dtype=F32).tolist() == [False]
    rule = BoundRule(OPEN, "value", "float32")
    assert rule.outside([1.0, 2.0], 1.0, 3.0).tolist() == [True, False]
    assert rule.inside([1.0, 2.0], 1.0, 3.0).tolist() == [False, True]
    with pytest.raises(ValueError, match="space"):
        outside([1.0], space="exp")
    with pytest.raises(ValueError, match="space"):
        BoundRule(space="exp")
    with pytest.raises(ValueError, match="dtype"):
        BoundRule(dtype="float16")
    assert ratios.log_bounds(0, None) == (-math.inf, math.inf)


def test_each_default_is_typed_once():
    """The GSPO, PPO/DAPO and IcePop bands and GSPO's widths are literals of one module (the syntax tree)."""
    import ast
    from pathlib import Path

    import variance_lab

    wanted = {(3e-4, 4e-4), (0.2, 0.28), (0.2, 0.2), (0.5, 5.0), (1 - 3e-4, 1 + 4e-4)}
    hits = {}
    for path in Path(variance_lab.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                values = tuple(e.value for e in node.elts)
                if values in wanted:
                    hits.setdefault(values, set()).add(path.relative_to(path.parents[1]).as_posix())
            if isinstance(node, ast.Constant) and node.value in (3e-4, 4e-4):
                hits.setdefault(node.value, set()).add(path.relative_to(path.parents[1]).as_posix())
    home = "ratios/defaults.py"
    assert hits == {
        (3e-4, 4e-4): {home},
        (0.2, 0.28): {home},
        (0.2, 0.2): {home},
        (0.5, 5.0): {home},
        3e-4: {
            home,
            "rollouts/combined.py",  # SPARSE_SD, a model's scale that happens to equal the width
        },
        4e-4: {home},
    }
    assert (ratios.GSPO_RANGE, ratios.PPO_RANGE) == ((1 - 3e-4, 1 + 4e-4), (0.8, 1.2))
    assert (corrections.GSPO_DEFAULT, corrections.ICEPOP_DEFAULT) == (ratios.GSPO_EPS, ratios.ICEPOP_BAND)


# --------------------------------------------------------------------------------------
# rollouts and corrections (log space, a bound kept, float64)
# --------------------------------------------------------------------------------------
def _batch(d):
    """One-token sequences with log-ratio d, exactly (logp - old_logp with one side 0)."""
    d = np.asarray(d, dtype=F64)[:, None]
    return TokenBatch.from_padded(np.minimum(d, 0.0), np.minimum(-d, 0.0))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_rollouts_clip_indicators_at_the_bounds(dtype):
    """GSPO's clipped_gspo and PPO's token clip: log of the float64 ratio band, a bound not clipped."""
    for band, field in ((ratios.GSPO_RANGE, "gspo"), (ratios.PPO_RANGE, "ppo")):
        lo, hi = math.log(band[0]), math.log(band[1])
        x = _probes((lo, hi), dtype)
        w = sequence_weights(_batch(x))
        got = w.clipped_gspo if field == "gspo" else w.n_token_clipped > 0
        np.testing.assert_array_equal(w.log_G, x)
        _check(got, x, lo, hi, CLOSED, at=(0, 3) if dtype is F64 else ())


SPECS = [
    "seq-tis:3",
    "seq-mask:3",
    "seq-mask:0.5:2",
    "geo-rs:0.9:1.1",
    "gspo",
    "gspo:0.2",
    "tis:2",
    "icepop",
    "icepop:5",
    "icepop:0.5:5",
    "cispo:0.2",
    "cispo:0.2:0.28",
    "ppo:0.2",
    "gmpo",
    "ctpo:0.5:0.5",
]


def test_every_kind_is_probed():
    """Every correction kind with a fixed band has a spec in the boundary test.

    ``m2po``'s band is its batch's (the cut of the batch rule, tests/corrections/test_m2po.py); the
    probability-aware kinds have no band of the ratio (their thresholds are probed in
    tests/corrections/test_probmask.py).
    """
    probed = {s.split(":")[0] for s in [*SPECS, *SIGNED_SPECS]}
    assert probed == set(CORRECTION_KINDS) - {"m2po", *PROB_KINDS}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("spec", SPECS)
def test_corrections_at_the_bounds(spec, dtype):
    """Each kind's modified flag (and a mask's weight) at its log bounds: a value at a bound is kept."""
    c = parse(spec)
    lo, hi = c.log_bounds(1)
    x = _probes((lo, hi), dtype)
    if c.level == "sequence":
        w, mod = apply_sequence(c, x, 1)
    elif c.kind == "ctpo":  # each probe a sequence of one token: L_1 = log r_1 against [-EL, EH]
        w, mod = (a.ravel() for a in apply_tokens(c, x[:, None]))
    else:
        w, mod = apply_tokens(c, x)
    at = (0, 3) if dtype is F64 and math.isfinite(lo) else (0,) if dtype is F64 else ()
    _check(mod, x, None if lo == -math.inf else lo, hi, CLOSED, at=at)
    if c.kind != "gmpo":
        kept = ~mod
        np.testing.assert_allclose(w[kept], np.exp(x[kept]), rtol=1e-15)  # kept: the weight is X
    if c.kind in ("seq-mask", "geo-rs", "icepop", "ctpo"):
        np.testing.assert_array_equal(w[mod], 0.0)


SIGNED_SPECS = ["topr", "opsm:0.05", "aspo:0.2:0.28:3"]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("spec", SIGNED_SPECS)
def test_sign_dependent_corrections_at_the_bounds(spec, dtype):
    """TOPR truncates a negative sequence's P_T above 1, OPSM masks one whose mean log(mu/pi) > delta.

    One-token sequences (T = 1, so OPSM's mean is -log P_T): the bound is log P_T = 0 for TOPR and
    log P_T = -delta for OPSM, and a value at it is kept; a positive advantage modifies nothing.
    """
    c = parse(spec)
    if c.kind == "aspo":
        _aspo_at_the_bounds(c, dtype)
        return
    bound = 0.0 if c.kind == "topr" else -c.params[0]
    x = _probes((bound,), dtype) if bound else np.array([0.0, -5e-324, 5e-324])
    lo, hi = (None, 0.0) if c.kind == "topr" else (-c.params[0], None)
    w, mod = apply_signed(c, x, 1, np.zeros(x.size, dtype=bool))
    _check(mod, x, lo, hi, CLOSED, at=(0,) if dtype is F64 or not bound else ())
    _, mod_pos = apply_signed(c, x, 1, np.ones(x.size, dtype=bool))
    assert not mod_pos.any()
    if c.kind == "opsm":
        np.testing.assert_array_equal(w[mod], 0.0)


def _aspo_at_the_bounds(c, dtype):
    """ASPO: 1/r kept on [1/C, 1 + EH] (A >= 0), r on [1 - EL, C] (A < 0), each bound kept."""
    el, eh, C = c.params[:3]
    for positive, (lo, hi) in (
        (True, (-math.log(C), math.log1p(eh))),
        (False, (math.log1p(-el), math.log(C))),
    ):
        x = _probes((lo, hi), dtype)
        w, mod = apply_signed(c, x, None, np.full(x.size, positive))
        _check(mod, x, lo, hi, CLOSED, at=(0, 3) if dtype is F64 else ())
        kept = ~mod
        np.testing.assert_allclose(w[kept], np.exp(-x[kept] if positive else x[kept]), rtol=1e-15)


# --------------------------------------------------------------------------------------
# the frameworks' mirrors
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F64])
def test_verl_at_the_bounds(dtype):
    """verl: weights as e^x (linear), k1 masks -x against log LO and log HI, k2 on its scale; bounds kept.

    rollout_corr_helper.py:599-600 (``raw >= lower``, ``raw <= upper``), 316 and 330
    (``token_k1 >= lower_log``), 319 (``token_k2 <= upper``); float64 inputs, float64 comparisons.
    """
    lo_r, hi_r = 0.5, 2.0
    x = _probes((math.log(lo_r), math.log(hi_r)), dtype, linear=True)
    mask, y, _ = _one_token(x)
    at = (0, 3) if dtype is F64 else ()
    for level in ("token", "sequence"):
        w, _ = verl.compute_rollout_correction_weights(y, mask, level, f"{lo_r}_{hi_r}")
        _check(w[:, 0] == 0, x, lo_r, hi_r, CLOSED, compared=np.exp(x), at=at)
    # the k1 options compare -x with [log LO, log HI]: they keep r in [1/HI, 1/LO]
    k_lo, k_hi = math.log(lo_r), math.log(hi_r)
    x = -_probes((k_lo, k_hi), dtype)
    mask, y, _ = _one_token(x)
    for opt in ("token_k1", "seq_sum_k1"):
        keep, _ = verl.compute_rollout_rejection_mask(y, mask, opt, f"{lo_r}_{hi_r}")
        _check(keep[:, 0] == 0, x, k_lo, k_hi, CLOSED, compared=-x, at=(0, 3) if dtype is F64 else ())
    # token_k2: 0.5 y^2 <= U, on the statistic's scale; y = 2 gives k2 = 2 exactly
    x = _probes((2.0,), dtype)
    mask, y, _ = _one_token(x)
    keep, _ = verl.compute_rollout_rejection_mask(y, mask, "token_k2", 2.0)
    _check(keep[:, 0] == 0, x, None, 2.0, CLOSED, compared=0.5 * x**2, at=(0,) if dtype is F64 else ())


@pytest.mark.parametrize("dtype", [F32, F64])
def test_trl_at_the_bounds(dtype):
    """TRL: the masks compare e^x with [clip_min, clip_max] (linear), the off-policy mean as it is."""
    lo_r, hi_r = 0.5, 2.0
    x = _probes((math.log(lo_r), math.log(hi_r)), dtype, linear=True)
    mask, old, zero = _one_token(x)
    at = (0, 3) if dtype is F64 else ()
    for mode in ("token_mask", "sequence_mask"):
        ratio, _ = trl.vllm_importance_sampling_correction(old, zero, mask, mode, lo_r, hi_r)
        _check(ratio[:, 0] == 0, x, lo_r, hi_r, CLOSED, compared=np.exp(x), at=at)
    ratio, _ = trl.vllm_importance_sampling_correction(old, zero, mask, "sequence_mask", None, hi_r)
    _check(ratio[:, 0] == 0, x, None, hi_r, CLOSED, compared=np.exp(x), at=(3,) if dtype is F64 else ())
    delta = 0.25
    x = _probes((delta,), dtype)
    mask, sampling, zero = _one_token(x)
    keep = trl.get_off_policy_mask(-np.ones((x.size, 1)), zero, sampling, mask, delta)
    _check(keep[:, 0] == 0, x, None, delta, CLOSED, at=(0,) if dtype is F64 else ())


@pytest.mark.parametrize("dtype", [F32, F64])
def test_nemo_rl_at_the_bounds(dtype):
    """NeMo-RL: tis/icepop compare the float32 weight; seq-mask-tis the float32 geometric mean.

    NeMo-RL's log-probs are float32, so the weight :math:`e^x` is a float32 (torch's, correctly
    rounded) compared with the bound in float32; both ends kept.
    """
    lo_r, hi_r = 0.5, 2.0
    x = _probes((math.log(lo_r), math.log(hi_r)), dtype, linear=True)
    mask, prev, zero = _one_token(x)
    ratio32 = np.exp(x.astype(F32).astype(F64)).astype(F32)
    at = [i for i in range(x.size) if ratio32[i] in (F32(lo_r), F32(hi_r))]
    assert at  # teeth: some probes land exactly on a bound in float32
    kw = {"truncated_importance_sampling_ratio": hi_r, "truncated_importance_sampling_ratio_min": lo_r}
    w, _ = nemo_rl.clipped_pg_importance_weights(
        prev, zero, mask, truncated_importance_sampling_type="icepop", **kw
    )
    _check(w[:, 0] == 0, x, lo_r, hi_r, CLOSED, compared=ratio32, at=at)
    oob = [
        nemo_rl.clipped_pg_importance_weights(
            prev[i : i + 1], zero[i : i + 1], mask[i : i + 1], truncated_importance_sampling_type="tis", **kw
        )[1]["is_oob_ratio"]
        > 0
        for i in range(x.size)
    ]
    _check(np.array(oob), x, lo_r, hi_r, CLOSED, compared=ratio32, at=at)
    # seq-mask-tis: one-token rows, so the float32 mean is the float32 log-ratio itself
    w, _ = nemo_rl.clipped_pg_importance_weights(
        prev, zero, mask, truncated_importance_sampling_type="seq-mask-tis", **kw
    )
    _check(w[:, 0] == 0, x, lo_r, hi_r, CLOSED, compared=ratio32, at=at)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_slime_prime_rl_openrlhf_at_the_bounds(dtype):
    """IcePop of slime and OpenRLHF, OpenRLHF's seq-mask-tis (linear), slime's veto (log), prime-rl's DPPO."""
    lo_r, hi_r = 0.5, 2.0
    x = _probes((math.log(lo_r), math.log(hi_r)), dtype, linear=True)
    mask, old, zero = _one_token(x)
    at = (0, 3) if dtype is F64 else ()
    w, _ = slime.tis_metrics(old, zero, mask, tis_clip=hi_r, tis_clip_low=lo_r, icepop=True)
    ratio32 = np.exp(x.astype(F32).astype(F64)).astype(
        F32
    )  # slime's float32 ratio (torch: correctly rounded)
    _check(w[:, 0] == 0, x, lo_r, hi_r, CLOSED, compared=ratio32, at=at)
    for kind in ("icepop", "seq-mask-tis"):
        w, _ = openrlhf.vllm_is_correction(old, zero, mask, (lo_r, hi_r), kind)
        _check(w[:, 0] == 0, x, lo_r, hi_r, CLOSED, compared=np.exp(x), at=at)
    w, _ = openrlhf.vllm_is_correction(old, zero, mask, (0.0, hi_r), "icepop")  # a low bound 0 is allowed
    _check(w[:, 0] == 0, x, 0.0, hi_r, CLOSED, compared=np.exp(x), at=(3,) if dtype is F64 else ())
    veto = 0.25
    x = _probes((math.log(veto),), dtype)
    mask, old, zero = _one_token(x)
    keep, _ = slime.veto_mask(old, zero, mask, veto)  # float32 log-ratio against log(veto) taken in float32
    log32 = float(F32(math.log(float(F32(veto)))))
    _check(keep[:, 0] == 0, x, log32, None, CLOSED, compared=x.astype(F32), at=(0,) if dtype is F64 else ())
    # prime-rl: d = e^t - e^i in float32 (its log-probs' dtype) against the bound as float32; the
    # bound is the probe's own float32 d, so the middle probe lies exactly at it (in both dtypes)
    i0 = F32(math.log(0.5))
    ts = _probes((math.log(0.7),), F32).astype(F32)
    d = (batch.exp_float32(ts) - batch.exp_float32(i0)).astype(F32)
    high = float(d[0])
    for sign, lo, hi in ((1.0, None, high), (-1.0, -high, None)):
        t = ts if sign > 0 else np.log(np.exp(i0, dtype=F64) - d.astype(F64)).astype(F32)
        dd = batch.exp_float32(t) - batch.exp_float32(i0)  # mirrored below: about -d
        m = np.ones((t.size, 1))
        keep, _ = prime_rl.dppo_mask(
            t[:, None].astype(dtype), np.full((t.size, 1), i0, dtype), sign * m, m, high, high
        )
        _check(keep[:, 0] == 0, t, lo, hi, CLOSED, compared=dd, at=(0,) if sign > 0 else ())


# --------------------------------------------------------------------------------------
# the experiments' torch paths
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F64])
def test_arithmetic_gspo_clip_indicator_at_the_bounds(dtype):
    """gspo_loss's clipped flags: log of GSPO's float64 band, a bound not clipped, in the tensor's dtype."""
    torch = pytest.importorskip("torch")
    from variance_lab.experiment.train import gspo_loss

    lo, hi = math.log(ratios.GSPO_RANGE[0]), math.log(ratios.GSPO_RANGE[1])
    x = _probes((lo, hi), dtype)
    tdt = torch.float32 if dtype is F32 else torch.float64
    logp = torch.tensor(x[:, None], dtype=tdt)
    _, info = gspo_loss(logp, torch.zeros_like(logp), torch.ones_like(logp), torch.ones(x.size, dtype=tdt))
    np.testing.assert_array_equal(info["log_s"].double().numpy(), x)
    # torch compares a float32 tensor with the bound rounded to float32
    b_lo, b_hi = (float(F32(lo)), float(F32(hi))) if dtype is F32 else (lo, hi)
    _check(info["clipped"].numpy(), x, b_lo, b_hi, CLOSED, at=(0, 3))


@pytest.mark.parametrize("aggregation", ["gspo", "token-mean", "seq-mean-token-mean"])
def test_lm_clipped_surrogate_at_the_bounds(aggregation):
    """The lm losses' clip (CLIP's widths): the gradient passes at a bound and stops one ulp out."""
    torch = pytest.importorskip("torch")
    from variance_lab.experiment.train import clipped_surrogate
    from variance_lab.lm.losses import CLIP

    eps = CLIP[aggregation]
    lo, hi = ratios.eps_range(*eps)
    # the clip binds below for A < 0 and above for A > 0
    for bound, adv in ((lo, -1.0), (hi, 1.0)):
        out = _next(bound, adv)
        w = torch.tensor([bound, out, _next(bound, -adv)], dtype=torch.float64, requires_grad=True)
        clipped_surrogate(w, torch.tensor(adv, dtype=torch.float64), eps).sum().backward()
        assert w.grad.tolist() == [adv, 0.0, adv]


def test_gspo_objective_is_shared():
    """The lm GSPO branch and the arithmetic experiment's loss are one objective with the core's band."""
    torch = pytest.importorskip("torch")
    from variance_lab.experiment.train import gspo_loss, gspo_surrogate
    from variance_lab.lm.losses import CLIP, aggregated_loss

    assert CLIP["gspo"] is ratios.GSPO_EPS
    d = [torch.tensor([1e-3, -2e-4, 5e-4], dtype=torch.float64), torch.tensor([-1e-2], dtype=torch.float64)]
    zeros = [torch.zeros_like(t) for t in d]
    adv = [0.7, -1.3]
    lm = aggregated_loss("gspo", d, zeros, adv, n_sequences=2, n_tokens=4)
    pad = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.zeros(2, 3, dtype=torch.float64)
    for i, t in enumerate(d):
        pad[i, : t.numel()], mask[i, : t.numel()] = t, 1.0
    arith, _ = gspo_loss(pad, torch.zeros_like(pad), mask, torch.tensor(adv, dtype=torch.float64))
    assert float(lm) == pytest.approx(float(arith), rel=1e-14)
    log_s = torch.tensor([float(t.mean()) for t in d], dtype=torch.float64)
    want = -gspo_surrogate(log_s, torch.tensor(adv, dtype=torch.float64)).mean()
    assert float(lm) == pytest.approx(float(want), rel=1e-14)


# --------------------------------------------------------------------------------------
# group advantages and the variance split
# --------------------------------------------------------------------------------------
def test_group_advantages_keep_each_experiments_numbers():
    """Each experiment's eps and ddof (arithmetic 1e-4, 0; SmolLM2 1e-6, 1) keep its numbers bit for bit."""
    rng = np.random.default_rng(7)
    r = rng.choice([0.0, 0.5, 1.0], size=64)
    g = rng.integers(0, 9, size=64)
    rr = r.reshape(-1, 8)
    old_arith = ((rr - rr.mean(axis=1, keepdims=True)) / (rr.std(axis=1, keepdims=True) + 1e-4)).ravel()
    np.testing.assert_array_equal(ratios.group_advantages(r, np.arange(64) // 8, eps=1e-4, ddof=0), old_arith)
    old_lm = np.zeros(64)
    for k in np.unique(g):
        s = g == k
        if s.sum() > 1 and np.ptp(r[s]) > 0:
            old_lm[s] = (r[s] - r[s].mean()) / (r[s].std(ddof=1) + 1e-6)
    np.testing.assert_array_equal(ratios.group_advantages(r, g, eps=1e-6, ddof=1), old_lm)
    assert not np.array_equal(old_lm, ratios.group_advantages(r, g, eps=1e-6, ddof=0))
    with pytest.raises(ValueError, match="1-D"):
        ratios.group_advantages([1.0, 2.0], [0], eps=1e-6, ddof=1)


def test_variance_split():
    """Shares add to 1 and do not depend on ddof; ddof 0 is rollouts.split's arithmetic bit for bit."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 2, 500), rng.normal(0, 1, 500)
    b = b + 0.3 * a
    v0, v1 = ratios.variance_split(a, b, ddof=0), ratios.variance_split(a, b, ddof=1)
    assert v0.share_a + v0.share_b + v0.share_cross == pytest.approx(1.0, abs=1e-14)
    assert v0.share_a == pytest.approx(v1.share_a, rel=1e-12)
    assert v1.total == pytest.approx(v0.total * 500 / 499, rel=1e-12)
    assert (v0.var_a, v0.cov) == (float(np.var(a)), float(np.mean((a - a.mean()) * (b - b.mean()))))
    assert v1.cov == pytest.approx(float(np.cov(a, b)[0, 1]), rel=1e-12)
    flat = ratios.variance_split(np.ones(4), np.zeros(4), ddof=0)
    assert math.isnan(flat.share_a)
    assert flat.total == 0.0
    with pytest.raises(ValueError, match="ddof"):
        ratios.variance_split([1.0], [2.0], ddof=1)


def test_segment_cumsums_are_each_segments_own_cumsum():
    """Prefix sums restart at each segment and equal np.cumsum of the segment bit for bit, across blocks."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 3000, size=3000)  # about 4.5 million tokens: more than one padded block
    off = np.concatenate([[0], np.cumsum(lengths)])
    x = rng.normal(0.0, 1.0, size=off[-1]) * 10.0 ** rng.integers(-8, 3, size=off[-1])
    prefix, position = ratios.segment_cumsums(x, off)
    for i in (0, 1, 1500, 2999):
        a, b = off[i], off[i + 1]
        np.testing.assert_array_equal(prefix[a:b], np.cumsum(x[a:b]))
        np.testing.assert_array_equal(position[a:b], np.arange(1, b - a + 1))
    np.testing.assert_array_equal(
        prefix[off[1:] - 1], [np.cumsum(x[a:b])[-1] for a, b in itertools.pairwise(off)]
    )
    with pytest.raises(ValueError, match="non-empty segments"):
        ratios.segment_cumsums(x[:5], [0, 2, 2, 5])
