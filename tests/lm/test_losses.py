"""Loss aggregations: gradients against the hand-derived formulas; group advantages."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="pip install 'variance_lab[experiment]'")

from variance_lab.lm.losses import (  # noqa: E402
    ADVANTAGE_DDOF,
    ADVANTAGE_EPS,
    AGGREGATIONS,
    aggregated_loss,
)
from variance_lab.ratios import group_advantages  # noqa: E402

OLD = [np.array([-0.5, -1.0, -2.0]), np.array([-0.1, -0.3]), np.array([-1.5])]
#: New log-probs off the old ones by small amounts (no clip active for the token losses).
SHIFT = [np.array([0.01, -0.02, 0.03]), np.array([-0.01, 0.02]), np.array([0.015])]
ADV = np.array([1.0, -0.5, 2.0])


def _grads(aggregation, shift=SHIFT, clip=None, split=None):
    """Gradient of the batch loss w.r.t. each new log-prob, accumulated over minibatches ``split``."""
    pairs = zip(OLD, shift, strict=True)
    new = [torch.tensor(o + s, dtype=torch.float64, requires_grad=True) for o, s in pairs]
    old = [torch.tensor(o, dtype=torch.float64) for o in OLD]
    n_tok = sum(len(o) for o in OLD)
    for sl in split or [slice(0, 3)]:
        loss = aggregated_loss(
            aggregation, new[sl], old[sl], ADV[sl], n_sequences=3, n_tokens=n_tok, clip=clip
        )
        loss.backward()
    return [t.grad.numpy() for t in new]


def _expected(aggregation, shift=SHIFT):
    n_tok = sum(len(o) for o in OLD)
    out = []
    for s, a in zip(shift, ADV, strict=True):
        t = len(s)
        if aggregation == "gspo":
            out.append(np.full(t, -a * np.exp(s.mean()) / (3 * t)))
        elif aggregation == "token-mean":
            out.append(-a * np.exp(s) / n_tok)
        else:
            out.append(-a * np.exp(s) / (3 * t))
    return out


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gradients_match_the_formulas(aggregation):
    """Gradients match the formulas."""
    wide = (1.0, 1.0)  # nothing clipped
    for got, want in zip(_grads(aggregation, clip=wide), _expected(aggregation), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_minibatches_accumulate_the_batch_gradient(aggregation):
    """Minibatches accumulate the batch gradient."""
    whole = _grads(aggregation, clip=(1.0, 1.0))
    parts = _grads(aggregation, clip=(1.0, 1.0), split=[slice(0, 1), slice(1, 3)])
    for a, b in zip(whole, parts, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_at_the_old_policy_gspo_and_seq_mean_token_mean_agree():
    """At the old policy gspo and seq mean token mean agree."""
    zero = [np.zeros_like(o) for o in OLD]
    g = _grads("gspo", shift=zero)
    s = _grads("seq-mean-token-mean", shift=zero)
    for a, b in zip(g, s, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_an_active_clip_zeroes_the_gradient():
    """An active clip zeroes the gradient."""
    # sequence 0 has A > 0 and GSPO ratio exp(mean shift) = exp(0.00667) > 1 + 4e-4: clipped
    g = _grads("gspo")
    assert np.all(g[0] == 0)
    # sequence 1 has A < 0 and ratio exp(0.005) > 1: min picks the unclipped w A, gradient flows
    np.testing.assert_allclose(g[1], _expected("gspo")[1], rtol=1e-12)
    # token-level: token 2 of sequence 0 has r = exp(0.03) < 1.28, not clipped by DAPO's clip-higher
    t = _grads("token-mean", clip=(0.2, 0.02))
    assert t[0][2] == 0  # with eps_high 0.02 it is
    assert t[0][0] != 0  # r = exp(0.01) < 1.02


def test_group_advantages():
    """Group advantages (the core's, with the SmolLM2 experiment's eps 1e-6 and ddof 1)."""
    r = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    pid = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    a = group_advantages(r, pid, eps=ADVANTAGE_EPS, ddof=ADVANTAGE_DDOF)
    g0 = r[:4]
    np.testing.assert_allclose(a[:4], (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-6))
    np.testing.assert_array_equal(a[4:], 0.0)  # equal rewards: no signal


def test_bad_input_is_named():
    """Bad input is named."""
    t = [torch.zeros(2)]
    with pytest.raises(ValueError, match="aggregation"):
        aggregated_loss("sum", t, t, [1.0], n_sequences=1, n_tokens=2)
    with pytest.raises(ValueError, match="one entry per sequence"):
        aggregated_loss("gspo", t, t, [1.0, 2.0], n_sequences=1, n_tokens=2)
    with pytest.raises(ValueError, match="n_sequences"):
        aggregated_loss("gspo", t, t, [1.0], n_sequences=0, n_tokens=2)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages([1.0, 2.0], [0], eps=ADVANTAGE_EPS, ddof=ADVANTAGE_DDOF)
