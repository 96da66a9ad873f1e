"""The language-model task: prompts, answers and the exact-match reward (no PyTorch)."""

import numpy as np
import pytest

from variance_lab.lm.task import (
    DEFAULT_KINDS,
    EXAMPLES,
    KINDS,
    MAX_SHOTS,
    SYSTEM,
    WORDS,
    Prompt,
    make_prompts,
    messages,
    normalize,
    reward,
    rewards,
)


def test_prompts_are_deterministic_and_cycle_through_the_kinds():
    """Prompts are deterministic and cycle through the kinds."""
    a = make_prompts(np.random.default_rng(3), 9)
    b = make_prompts(np.random.default_rng(3), 9)
    assert a == b
    assert [p.kind for p in a] == list(DEFAULT_KINDS) * 3
    assert set(KINDS) - set(DEFAULT_KINDS) == {"count"}


def test_answers_are_right():
    """Answers are right."""
    for p in make_prompts(np.random.default_rng(0), 300, max_term=30, max_words=40, max_times=7):
        if p.kind == "add":
            x, y = (int(v) for v in p.text.split("What is ")[1].split("?")[0].split(" + "))
            assert p.answer == str(x + y)
            assert 1 <= x <= 30
            assert 1 <= y <= 30
        elif p.kind == "copy":
            assert p.text.endswith(p.answer)
            assert 1 <= len(p.answer.split()) <= 40
        else:
            word = p.text.split('"')[1]
            count = int(p.text.split('" ')[1].split(" times")[0])
            assert p.answer.split() == [word] * count
            assert 1 <= count <= 7
        assert set(p.answer.split()) <= set(WORDS) or p.kind == "add"


def test_answer_lengths_spread():
    """Copy lists reach both ends of their range; repeat counts too."""
    prompts = make_prompts(np.random.default_rng(1), 1200, max_words=24, max_times=4)
    copy = [len(p.answer.split()) for p in prompts if p.kind == "copy"]
    repeat = [len(p.answer.split()) for p in prompts if p.kind == "repeat"]
    assert min(copy) == 1
    assert max(copy) == 24
    assert sorted(set(repeat)) == [1, 2, 3, 4]


def test_copy_word_counts_are_log_uniform():
    """P(n) = log((n+1)/n) / log(N+1): a chi-square test at the 0.1 % level over 30,000 draws."""
    from scipy import stats

    rng = np.random.default_rng(11)
    n_max = 24
    counts = [len(p.answer.split()) for p in make_prompts(rng, 90_000, max_words=n_max) if p.kind == "copy"]
    observed = np.bincount(counts, minlength=n_max + 1)[1:]
    k = np.arange(1, n_max + 1)
    expected = np.log((k + 1) / k) / np.log(n_max + 1) * len(counts)
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    # and the test can fail: uniform counts are rejected
    uniform = np.full(n_max, len(counts) / n_max)
    assert stats.chisquare(observed, uniform).pvalue < 1e-10


@pytest.mark.parametrize(
    ("response", "expected"),
    [("22", 1.0), (" 22. ", 1.0), ("22\n", 1.0), ("The answer is 22", 0.0), ("23", 0.0), ("", 0.0)],
)
def test_reward_is_exact_match_after_normalising(response, expected):
    """Reward is exact match after normalising."""
    assert reward(Prompt("add", "What is 17 + 5?", "22"), response) == expected


def test_copy_reward_ignores_case_and_spacing_only():
    """Copy reward ignores case and spacing only."""
    p = Prompt("copy", "Copy: apple river", "apple river")
    assert reward(p, "Apple  river.") == 1.0
    assert reward(p, "apple, river") == 0.0
    np.testing.assert_array_equal(rewards([p, p], ["apple river", "river apple"]), [1.0, 0.0])


def test_normalize():
    """Normalize."""
    assert normalize("  A\tb \n C. ") == "a b c"
    assert normalize("x..") == "x."


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": -1}, "n must"),
        ({"n": 2, "max_term": 0}, "max_term"),
        ({"n": 2, "max_words": 1.5}, "max_words"),
        ({"n": 2, "max_times": 0}, "max_times"),
    ],
)
def test_bad_sizes_are_named(kwargs, match):
    """Bad sizes are named."""
    n = kwargs.pop("n")
    with pytest.raises(ValueError, match=match):
        make_prompts(np.random.default_rng(0), n, **kwargs)


def test_bad_prompt_and_lengths_are_named():
    """Bad prompt and lengths are named."""
    with pytest.raises(ValueError, match="kind"):
        Prompt("sum", "x", "1")
    with pytest.raises(ValueError, match="not normalised"):
        Prompt("add", "x", "A")
    with pytest.raises(ValueError, match="2 prompts but 1"):
        rewards([Prompt("add", "x", "1")] * 2, ["1"])


@pytest.mark.parametrize(
    ("response", "expected"),
    [("5 + 5 = 10", 1.0), ("It is 10.", 1.0), ("100", 0.0), ("10x", 0.0), ("1 0", 0.0)],
)
def test_contains_finds_the_answer_as_whole_words(response, expected):
    """``contains``: the answer occurs in the response, not inside a longer number or word."""
    assert reward(Prompt("add", "What is 5 + 5?", "10"), response, "contains") == expected


def test_contains_for_word_lists():
    """A word list counts when it occurs whole and in order."""
    p = Prompt("copy", "Copy: apple river", "apple river")
    assert reward(p, "Sure! Apple river", "contains") == 1.0
    assert reward(p, "apple rivers", "contains") == 0.0
    assert reward(p, "river apple", "contains") == 0.0
    with pytest.raises(ValueError, match="match must"):
        reward(p, "x", "fuzzy")


def test_messages_put_the_system_turn_and_examples_of_the_kind_first():
    """System turn, then up to three worked examples of the kind (each answered right), then the request."""
    for p in make_prompts(np.random.default_rng(4), 3):
        for shots in range(MAX_SHOTS + 1):
            msgs = messages(p, shots)
            assert msgs[0] == {"role": "system", "content": SYSTEM}
            assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * shots + ["user"]
            assert msgs[-1] == {"role": "user", "content": p.text}
            for question, answer in zip(msgs[1:-1:2], msgs[2:-1:2], strict=True):
                example = Prompt(p.kind, question["content"], normalize(answer["content"]))
                assert reward(example, answer["content"]) == 1.0
        assert len({m["content"] for m in messages(p, 3)[2:-1:2]}) == 3
        assert messages(p, 0, system=False) == [{"role": "user", "content": p.text}]
    for bad in (-1, 4, 1.0):
        with pytest.raises(ValueError, match="shots"):
            messages(p, bad)


def test_the_examples_answer_their_questions():
    """Every worked example's answer is the answer a prompt of its kind would have."""
    for kind, examples in EXAMPLES.items():
        assert len(examples) == MAX_SHOTS
        for question, answer in examples:
            if kind == "add":
                x, y = (int(v) for v in question.split("What is ")[1].split("?")[0].split(" + "))
                assert answer == str(x + y)
            elif kind == "copy":
                assert question.endswith(": " + answer)
            elif kind == "count":
                a, b = (int(v) for v in question.split("Count from ")[1].split(".")[0].split(" to "))
                assert answer == ", ".join(str(i) for i in range(a, b + 1))
            else:
                word, count = question.split('"')[1], int(question.split('" ')[1].split(" times")[0])
                assert answer == " ".join([word] * count)


def test_count_prompts_carry_examples_of_their_own_length():
    """``count``: the answer counts n numbers, n in [2, max_count]; the examples are 0.7n-1.3n long."""
    from variance_lab.lm.task import COUNT_REQUEST, make_prompts, messages

    rng = np.random.default_rng(5)
    prompts = make_prompts(rng, 300, kinds=("count",), max_count=80)
    sizes = []
    for p in prompts:
        numbers = [int(x) for x in p.answer.split(", ")]
        n = len(numbers)
        sizes.append(n)
        assert numbers == list(range(numbers[0], numbers[0] + n))
        assert p.text == COUNT_REQUEST.format(a=numbers[0], b=numbers[-1])
        for question, answer in p.examples:
            k = len(answer.split(", "))
            assert max(2, round(0.7 * n)) <= k <= max(2, round(1.3 * n))
            assert question.startswith("Count from ")
        turns = messages(p, 2, system=False)
        assert [t["content"] for t in turns[:4:2]] == [q for q, _ in p.examples[:2]]
        assert turns[-1]["content"] == p.text
    assert min(sizes) >= 2
    assert max(sizes) <= 80
    assert np.mean(np.array(sizes) >= 30) > 0.2  # log-uniform: long counts are common


def test_the_default_mix_draws_the_shipped_prompts():
    """Without ``kinds`` the prompts are those of the shipped runs (the same draws, the same order)."""
    from variance_lab.lm.task import DEFAULT_KINDS, make_prompts

    a = make_prompts(np.random.default_rng(3), 30)
    b = make_prompts(np.random.default_rng(3), 30, kinds=DEFAULT_KINDS, max_count=5)
    assert a == b
    assert [p.kind for p in a[:4]] == ["add", "copy", "repeat", "add"]
    assert all(p.examples == () for p in a)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"kinds": ("sum",)}, "kinds must name some of"), ({"max_count": 1}, "max_count must be")],
)
def test_bad_kinds_and_counts_are_named(kwargs, message):
    """An unknown kind, a max_count below 2."""
    from variance_lab.lm.task import make_prompts

    with pytest.raises(ValueError, match=message):
        make_prompts(np.random.default_rng(0), 3, **kwargs)
