r"""The language-model task: short verifiable requests whose correct answers range in length.

Three kinds of request, each with one exact answer, mixed so that response lengths spread
from a few tokens to a few hundred:

==========  =====================================================  ========================
kind        request (user message)                                 answer
==========  =====================================================  ========================
``add``     ``What is 7 + 5? Reply with the number only.``          ``12``
``copy``    ``Copy these words exactly, separated by single         the words, in order
            spaces, and write nothing else: apple river ...``
``repeat``  ``Write the word "blue" 3 times, separated by single    ``blue blue blue``
            spaces, and write nothing else.``
``count``   ``Count from 17 to 21. Write the numbers separated by      ``17, 18, 19, 20, 21``
            commas and nothing else.``
==========  =====================================================  ========================

``count`` is the long-answer kind (not in the default mix, :data:`DEFAULT_KINDS`): it counts
:math:`n` numbers from a start drawn uniformly from :math:`\{1, \dots, 300\}`, :math:`n`
log-uniform on :math:`\{2, \dots, \text{max\_count}\}`, and its worked examples are drawn with
it, each of about the same length (:math:`n` times a uniform factor in [0.7, 1.3]): a small model
copies the length of its examples more than it follows the request, and with examples of the
request's own length SmolLM2-135M-Instruct answers with about five tokens a number and often
stops by itself (8 responses a length at temperature 1 on this machine: all finished at
:math:`n = 6`, 7 of 8 at 20, 3 and 4 of 8 at 45 and 80).

``add`` draws both terms from :math:`\{1, \dots, \text{max\_term}\}`, ``repeat`` its count
from :math:`\{1, \dots, \text{max\_times}\}` (uniformly), ``copy`` its word count
:math:`n \in \{1, \dots, N\}` (:math:`N` = ``max_words``) log-uniformly,
:math:`P(n) = \log\frac{n+1}{n} / \log(N+1)`, so short lists, which SmolLM2-135M-Instruct
copies often, and long ones, which it rarely does, both occur. A model that does not stop runs
to the token budget, so lengths cover the whole range up to it. :func:`reward` compares
after normalisation (:func:`normalize`: case folded, runs of white space made one space,
leading and trailing space and a final ``.`` dropped), in one of two modes (:data:`MATCHES`):

- ``"exact"``: the normalised response is the answer (for ``add``, the number alone);
- ``"contains"``: the answer occurs in the normalised response as whole words (not inside a
  longer word or number): ``5 + 5 = 10`` answers "What is 5 + 5?", ``10`` in ``100`` does not.

:func:`messages` turns a prompt into chat messages: the instruction :data:`SYSTEM` as a system
turn, then up to three worked examples of its kind (:data:`EXAMPLES`, a user turn and the
assistant's exact answer each), then the request. At temperature 1, SmolLM2-135M-Instruct
rarely answers with the answer alone without them (the pass rates by setting are in the
docs page of the experiment).

:func:`chat_prompts` turns the messages into token ids through a tokenizer's chat template, and
:func:`stop_ids` names the tokens that end a response. Everything is deterministic given a
:class:`numpy.random.Generator`; no PyTorch here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = [
    "COUNT_REQUEST",
    "DEFAULT_KINDS",
    "EXAMPLES",
    "KINDS",
    "MATCHES",
    "MAX_SHOTS",
    "SYSTEM",
    "WORDS",
    "Prompt",
    "chat_prompts",
    "count_strata",
    "make_prompts",
    "messages",
    "normalize",
    "parse_strata",
    "reward",
    "rewards",
    "stop_ids",
]

#: The kinds of request.
KINDS = ("add", "copy", "repeat", "count")
#: The mix of the shipped runs, in the order :func:`make_prompts` cycles through them.
DEFAULT_KINDS = ("add", "copy", "repeat")
#: ``count``'s request.
COUNT_REQUEST = "Count from {a} to {b}. Write the numbers separated by commas and nothing else."
#: Common English words (one or two tokens each for SmolLM2's tokenizer).
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "table",
    "music",
    "light",
    "window",
    "garden",
    "paper",
    "bread",
    "horse",
    "silver",
    "orange",
    "winter",
    "summer",
    "chair",
    "tiger",
    "ocean",
    "forest",
    "candle",
    "yellow",
    "mountain",
    "pencil",
    "sugar",
    "planet",
    "rabbit",
    "doctor",
    "market",
    "island",
    "butter",
    "letter",
    "castle",
    "rocket",
    "violin",
    "dragon",
    "lemon",
    "jacket",
    "bottle",
    "camera",
    "flower",
    "basket",
    "monkey",
    "pillow",
    "spider",
    "turtle",
    "wallet",
]
_SPACE = re.compile(r"\s+")
#: The reward's modes.
MATCHES = ("exact", "contains")
#: The system turn of every conversation (:func:`messages`).
SYSTEM = "You follow instructions exactly. Reply with the answer only, with no other words."
#: Three worked examples per kind: (user message, the assistant's answer).
EXAMPLES = {
    "add": (
        ("What is 3 + 4? Reply with the number only.", "7"),
        ("What is 8 + 6? Reply with the number only.", "14"),
        ("What is 2 + 9? Reply with the number only.", "11"),
    ),
    "copy": tuple(
        (f"Copy these words exactly, separated by single spaces, and write nothing else: {w}", w)
        for w in ("paper horse", "winter", "candle tiger ocean bread")
    ),
    "repeat": tuple(
        (
            f'Write the word "{w}" {k} times, separated by single spaces, and write nothing else.',
            " ".join([w] * k),
        )
        for w, k in (("stone", 3), ("music", 1), ("ocean", 2))
    ),
    "count": tuple(
        (COUNT_REQUEST.format(a=a, b=b), ", ".join(str(i) for i in range(a, b + 1)))
        for a, b in ((3, 7), (10, 14), (25, 28))
    ),
}
#: The most worked examples :func:`messages` puts before a request.
MAX_SHOTS = 3


@dataclass(frozen=True)
class Prompt:
    """One request and its exact answer.

    Attributes
    ----------
    kind : str
        One of :data:`KINDS`.
    text : str
        The user message (the chat template wraps it).
    answer : str
        The correct response, normalised (:func:`normalize`).
    examples : tuple of (str, str), optional
        Worked examples drawn with the request (``count``); empty: :data:`EXAMPLES` of its kind.
    """

    kind: str
    text: str
    answer: str
    examples: tuple = ()

    def __post_init__(self):
        """Check the kind and that the answer is normalised."""
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if normalize(self.answer) != self.answer or not self.answer:
            raise ValueError(f"answer {self.answer!r} is empty or not normalised")


def normalize(text: str) -> str:
    """Case-fold, collapse white space, strip, and drop one final ``.``.

    Parameters
    ----------
    text : str

    Returns
    -------
    str
    """
    out = _SPACE.sub(" ", text.casefold()).strip()
    if out.endswith("."):
        out = out[:-1].rstrip()
    return out


def _add(rng: np.random.Generator, max_term: int) -> Prompt:
    a, b = (int(v) for v in rng.integers(1, max_term + 1, size=2))
    return Prompt("add", f"What is {a} + {b}? Reply with the number only.", str(a + b))


def _copy(rng: np.random.Generator, max_words: int) -> Prompt:
    n = min(int(np.exp(rng.uniform(0.0, np.log(max_words + 1)))), max_words)
    words = " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=n))
    text = f"Copy these words exactly, separated by single spaces, and write nothing else: {words}"
    return Prompt("copy", text, words)


def _repeat(rng: np.random.Generator, max_times: int) -> Prompt:
    word = WORDS[int(rng.integers(0, len(WORDS)))]
    m = int(rng.integers(1, max_times + 1))
    text = f'Write the word "{word}" {m} times, separated by single spaces, and write nothing else.'
    return Prompt("repeat", text, " ".join([word] * m))


def _count_pair(rng: np.random.Generator, n: int) -> tuple[str, str]:
    a = int(rng.integers(1, 301))
    return COUNT_REQUEST.format(a=a, b=a + n - 1), ", ".join(str(i) for i in range(a, a + n))


def _count(rng: np.random.Generator, max_count: int) -> Prompt:
    n = min(max(int(np.exp(rng.uniform(np.log(2), np.log(max_count + 1)))), 2), max_count)
    return _count_of(rng, n)


def _count_of(rng: np.random.Generator, n: int) -> Prompt:
    text, answer = _count_pair(rng, n)
    sizes = [max(2, round(n * float(rng.uniform(0.7, 1.3)))) for _ in range(MAX_SHOTS)]
    return Prompt("count", text, answer, tuple(_count_pair(rng, k) for k in sizes))


def parse_strata(text: str) -> list[tuple[int, int, int]]:
    """Parse ``count`` strata written ``LO-HI:K,...`` (``K`` requests of ``LO`` to ``HI`` numbers each).

    Parameters
    ----------
    text : str
        For example ``"2-3:11,20-31:36"``.

    Returns
    -------
    list of (int, int, int)
        ``(lo, hi, k)`` per stratum, with ``2 <= lo <= hi`` and ``k >= 1``.
    """
    out = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(\d+)-(\d+):(\d+)\s*", part)
        if m is None or not 2 <= int(m[1]) <= int(m[2]) or int(m[3]) < 1:
            raise ValueError(
                f"strata must read LO-HI:K,... with 2 <= LO <= HI and K >= 1 (such as 2-3:11,20-31:36), "
                f"got {part!r} in {text!r}"
            )
        out.append((int(m[1]), int(m[2]), int(m[3])))
    return out


def count_strata(rng: np.random.Generator, strata) -> list[Prompt]:
    r"""Draw ``count`` requests by stratum: per ``(lo, hi, k)``, ``k`` requests of :math:`n` numbers.

    :math:`n` is uniform on :math:`\{lo, \dots, hi\}`; the worked examples are drawn as
    :func:`make_prompts` draws them. A response of :math:`n` three-digit numbers is about
    :math:`5n` tokens (digits are single tokens), so strata aim finished responses at length buckets.

    Parameters
    ----------
    rng : numpy.random.Generator
    strata : list of (int, int, int)
        :func:`parse_strata`'s result.

    Returns
    -------
    list of Prompt
        The strata's requests in order.
    """
    out = []
    for lo, hi, k in strata:
        out += [_count_of(rng, int(n)) for n in rng.integers(lo, hi + 1, size=k)]
    return out


def make_prompts(
    rng: np.random.Generator,
    n: int,
    *,
    max_term: int = 9,
    max_words: int = 24,
    max_times: int = 4,
    kinds=DEFAULT_KINDS,
    max_count: int = 60,
) -> list[Prompt]:
    r"""Draw ``n`` requests, cycling through ``kinds`` (by default ``add``, ``copy``, ``repeat``, ...).

    Parameters
    ----------
    rng : numpy.random.Generator
    n : int
        Number of prompts, >= 0.
    max_term : int, optional
        ``add`` draws both terms uniformly from :math:`\{1, \dots, \text{max\_term}\}`.
    max_words : int, optional
        ``copy`` draws its word count :math:`n` from :math:`\{1, \dots, N\}`, :math:`N` =
        ``max_words``, log-uniformly: :math:`n = \min(\lfloor e^{U \log(N + 1)} \rfloor, N)`,
        :math:`U \sim \mathrm{Uniform}(0, 1)`, so :math:`P(n) = \log\frac{n+1}{n} / \log(N+1)`.
    max_times : int, optional
        ``repeat`` draws its count uniformly from :math:`\{1, \dots, \text{max\_times}\}`.
    kinds : sequence of str, optional
        The kinds to cycle through, from :data:`KINDS`.
    max_count : int, optional
        ``count`` draws :math:`n` from :math:`\{2, \dots, \text{max\_count}\}`
        log-uniformly (see the module).

    Returns
    -------
    list of Prompt
    """
    sizes = (("n", n), ("max_term", max_term), ("max_words", max_words), ("max_times", max_times))
    for name, value in (*sizes, ("max_count", max_count)):
        least = {"n": 0, "max_count": 2}.get(name, 1)
        if not isinstance(value, int | np.integer) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    kinds = tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds must name some of {KINDS}, got {kinds!r}")
    makers = {"add": lambda: _add(rng, max_term), "copy": lambda: _copy(rng, max_words)}
    makers["repeat"] = lambda: _repeat(rng, max_times)
    makers["count"] = lambda: _count(rng, max_count)
    return [makers[kinds[i % len(kinds)]]() for i in range(n)]


def messages(prompt: Prompt, shots: int = MAX_SHOTS, *, system: bool = True) -> list[dict]:
    """Chat messages for ``prompt``: :data:`SYSTEM`, ``shots`` worked examples of its kind, the request.

    Parameters
    ----------
    prompt : Prompt
    shots : int, optional
        0 to :data:`MAX_SHOTS`: the first ``shots`` of :data:`EXAMPLES` for the prompt's kind.
    system : bool, optional
        Start with :data:`SYSTEM` as a system turn.

    Returns
    -------
    list of dict
        ``{"role": ..., "content": ...}`` entries for a chat template.
    """
    if not isinstance(shots, int | np.integer) or not 0 <= shots <= MAX_SHOTS:
        raise ValueError(f"shots must be an integer from 0 to {MAX_SHOTS}, got {shots!r}")
    out = [{"role": "system", "content": SYSTEM}] if system else []
    for question, answer in (prompt.examples or EXAMPLES[prompt.kind])[:shots]:
        out += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return [*out, {"role": "user", "content": prompt.text}]


def reward(prompt: Prompt, response: str, match: str = "exact") -> float:
    """1.0 when the normalised response matches the answer (``match``, see the module), else 0.0.

    Parameters
    ----------
    prompt : Prompt
    response : str
        The decoded response, special tokens removed.
    match : {"exact", "contains"}, optional

    Returns
    -------
    float
    """
    if match not in MATCHES:
        raise ValueError(f"match must be one of {MATCHES}, got {match!r}")
    text = normalize(response)
    if match == "exact":
        return float(text == prompt.answer)
    return float(re.search(rf"(?<!\w){re.escape(prompt.answer)}(?!\w)", text) is not None)


def rewards(prompts: list[Prompt], responses: list[str], match: str = "exact") -> np.ndarray:
    """:func:`reward` of each pair.

    Parameters
    ----------
    prompts : list of Prompt
    responses : list of str
        Same length.
    match : {"exact", "contains"}, optional

    Returns
    -------
    numpy.ndarray
        float64, shape ``(len(prompts),)``.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    return np.array([reward(p, r, match) for p, r in zip(prompts, responses, strict=True)], dtype=float)


def chat_prompts(tokenizer, conversations: list) -> list[list[int]]:
    """Token ids of each conversation through the tokenizer's chat template, ready for the answer.

    Parameters
    ----------
    tokenizer : transformers tokenizer with a chat template
    conversations : list of str or list of list of dict
        A user message, or chat messages (:func:`~variance_lab.lm.task.messages`).

    Returns
    -------
    list of list of int
    """
    out = []
    for conv in conversations:
        msgs = [{"role": "user", "content": conv}] if isinstance(conv, str) else conv
        ids = tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        out.append([int(i) for i in ids])
    return out


def stop_ids(tokenizer) -> list[int]:
    """Return the token ids that end a response: the end-of-text token and ``<|im_end|>`` where it exists.

    Parameters
    ----------
    tokenizer : transformers tokenizer

    Returns
    -------
    list of int
        Sorted.
    """
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if i is not None)
