"""The persistent optimizer: Adam's first step, moments that carry over, forks that leave the chain alone."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="pip install 'variance_lab[lm]'")

from variance_lab.lm.chain import PolicyChain  # noqa: E402
from variance_lab.lm.scoring import score  # noqa: E402
from variance_lab.lm.tiny import tiny_model  # noqa: E402

PROMPTS = [[1, 40, 41, 42], [1, 50, 51], [1, 60, 61, 62, 63], [1, 70]]
RESPONSES = [[80, 81, 82], [83, 84], [85, 86, 87, 88], [89]]
ADVANTAGES = np.array([1.0, -1.0, 0.5, -0.5])


@pytest.fixture(scope="module")
def model():
    """Return the tiny random Llama."""
    return tiny_model(seed=3)[0]


def _params(m):
    return torch.cat([p.detach().flatten().clone() for p in m.parameters()])


def _step(chain):
    old = score(chain.model, PROMPTS, RESPONSES)
    chain.step(PROMPTS, RESPONSES, old, ADVANTAGES)


def test_the_first_step_moves_the_weights_by_at_most_the_learning_rate(model):
    """Adam's first step is lr * g / (|g| + eps): the weights with a real gradient move by lr."""
    chain = PolicyChain(model, aggregation="token-mean", lr=1e-3)
    before = _params(chain.model)
    _step(chain)
    moved = (_params(chain.model) - before).abs()
    big = moved > 1e-4
    assert big.float().mean() > 0.5
    assert moved.max() <= 1e-3 * (1 + 1e-3)  # float32 weights round the step
    assert torch.allclose(moved[big].median(), torch.tensor(1e-3), rtol=1e-3)
    assert torch.equal(_params(model), before)  # the model it started from is untouched


def test_moments_persist_across_updates(model):
    """A step whose gradient reverses the first's is damped by the first's moment; a fresh one is not."""
    chain = PolicyChain(model, aggregation="gspo", lr=1e-3)
    _step(chain)
    fresh = PolicyChain(chain.model, aggregation="gspo", lr=1e-3)
    mid = _params(chain.model)
    for c in (chain, fresh):
        old = score(c.model, PROMPTS, RESPONSES)
        c.step(PROMPTS, RESPONSES, old, -ADVANTAGES)
    warm = (_params(chain.model) - mid).abs()
    cold = (_params(fresh.model) - mid).abs()
    big = cold > 1e-4
    # m_2 = 0.09 g_1 + 0.1 g_2: where g_2 = -g_1, |m_2| / (1 - 0.9^2) / sqrt(v_2) is 0.05 of a fresh step
    assert warm[big].median() < 0.5 * cold[big].median()
    assert torch.allclose(cold[big].median(), torch.tensor(1e-3), rtol=1e-3)
    state = chain.optimizer.state[next(iter(chain.model.parameters()))]
    assert int(state["step"]) == 2
    assert chain.updates == 2
    assert fresh.updates == 1
    assert chain.describe() | {"betas": None} == {
        "name": "AdamW",
        "persistent": True,
        "update": 2,
        "lr": 1e-3,
        "betas": None,
        "eps": 1e-8,
        "weight_decay": 0.0,
    }


def test_a_fork_takes_the_same_step_and_leaves_the_chain_alone(model):
    """Fork then step equals step, bit for bit; the forked-from chain keeps its weights and state."""
    chain = PolicyChain(model, aggregation="seq-mean-token-mean", lr=1e-3)
    _step(chain)
    before = _params(chain.model)
    fork = chain.fork()
    _step(fork)
    assert torch.equal(_params(chain.model), before)
    assert chain.updates == 1
    _step(chain)
    assert torch.equal(_params(chain.model), _params(fork.model))
    assert chain.fork(lr=5e-4).lr == 5e-4
    assert chain.lr == 1e-3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"aggregation": "mean", "lr": 1e-3}, "aggregation must be one of"),
        ({"aggregation": "gspo", "lr": 0.0}, "lr"),
        ({"aggregation": "gspo", "lr": 1e-3, "score_batch": 0}, "score_batch must be an integer >= 1, got 0"),
    ],
)
def test_bad_settings_are_named(model, kwargs, message):
    """Bad settings are named."""
    with pytest.raises(ValueError, match=message):
        PolicyChain(model, **kwargs)
