r"""The arithmetic task: add a list of digits, writing every running sum out.

A problem is a list of :math:`n` digits, each tagged with a letter (``a`` to ``z``, then
``A`` to ``Z``, so :math:`n \le 52`). The prompt lists them and ends with ``:``; the correct
response adds them one at a time, writing each partial sum, and ends with ``.``::

    prompt     a3b5c2d7:
    response   a3+b5=8,8+c2=10,10+d7=17.

The tags make the lookup of the next term a content match (an induction-head pattern)
rather than a count, so a tiny transformer can learn it; the running sums make the correct
response grow linearly with :math:`n` (7 characters at :math:`n = 2`, about 330 at
:math:`n = 32`). :func:`arith_reward` checks only the final answer, the number after the last ``=``
of a response that was terminated by ``.``.

Everything is deterministic given a :class:`numpy.random.Generator`; no global state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EOS",
    "N_MAX",
    "PAD",
    "SEP",
    "TAGS",
    "VOCAB",
    "Problem",
    "arith_reward",
    "arith_rewards",
    "decode",
    "encode",
    "make_problems",
    "max_response_length",
]

#: Term tags, in order; a problem has at most ``len(TAGS)`` terms.
TAGS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: Padding token id (never produced by the model's sampler).
PAD = 0
#: End of the response.
EOS = "."
#: End of the prompt.
SEP = ":"
#: The characters, in token-id order (id 0 is padding).
VOCAB = "\0" + "0123456789+=," + SEP + EOS + TAGS
#: Largest number of terms.
N_MAX = len(TAGS)

_ID = {ch: i for i, ch in enumerate(VOCAB)}


@dataclass(frozen=True)
class Problem:
    """One problem: the digits to add, in order.

    Attributes
    ----------
    terms : tuple of int
        Digits 0..9, at least two, at most :data:`N_MAX`.
    """

    terms: tuple[int, ...]

    def __post_init__(self):
        """Check that the problem has 2..N_MAX terms, each a digit 0..9."""
        if not 2 <= len(self.terms) <= N_MAX or any(not 0 <= t <= 9 for t in self.terms):
            raise ValueError(f"a problem needs 2..{N_MAX} digits 0..9, got {self.terms!r}")

    @property
    def n(self) -> int:
        """Number of terms."""
        return len(self.terms)

    @property
    def total(self) -> int:
        """The correct final answer."""
        return sum(self.terms)

    @property
    def prompt(self) -> str:
        """The prompt, such as ``a3b5c2d7:`` for the terms (3, 5, 2, 7)."""
        return "".join(f"{TAGS[i]}{t}" for i, t in enumerate(self.terms)) + SEP

    @property
    def response(self) -> str:
        """The correct response, such as ``a3+b5=8,8+c2=10,10+d7=17.`` for (3, 5, 2, 7)."""
        a, b = self.terms[0], self.terms[1]
        steps = [f"{TAGS[0]}{a}+{TAGS[1]}{b}={a + b}"]
        total = a + b
        for i in range(2, self.n):
            new = total + self.terms[i]
            steps.append(f"{total}+{TAGS[i]}{self.terms[i]}={new}")
            total = new
        return ",".join(steps) + EOS


def _check_range(n_min: int, n_max: int) -> None:
    if not 2 <= n_min <= n_max <= N_MAX:
        raise ValueError(f"need 2 <= n_min <= n_max <= {N_MAX}, got n_min={n_min}, n_max={n_max}")


def make_problems(rng: np.random.Generator, count: int, n_min: int = 2, n_max: int = 32) -> list[Problem]:
    r"""Draw ``count`` problems; the number of terms is log-uniform on ``[n_min, n_max]``.

    :math:`n = \lfloor e^{U} \rfloor` with :math:`U` uniform on
    :math:`[\log n_{min}, \log(n_{max} + 1))`, so response lengths spread evenly over
    powers of two (from a handful of tokens to a few hundred). Digits are uniform on 0..9.

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness.
    count : int
        Number of problems, >= 0.
    n_min, n_max : int
        Range of the number of terms, ``2 <= n_min <= n_max <= 52``.

    Returns
    -------
    list of Problem
    """
    _check_range(n_min, n_max)
    u = rng.uniform(math.log(n_min), math.log(n_max + 1), size=count)
    ns = np.clip(np.floor(np.exp(u)).astype(np.int64), n_min, n_max)
    return [Problem(tuple(int(d) for d in rng.integers(0, 10, size=int(n)))) for n in ns]


def encode(text: str) -> list[int]:
    """Token ids of a text over :data:`VOCAB` (one token per character).

    Parameters
    ----------
    text : str

    Returns
    -------
    list of int
    """
    try:
        return [_ID[ch] for ch in text]
    except KeyError as exc:
        raise ValueError(f"character {exc.args[0]!r} is not in the task's vocabulary") from None


def decode(ids) -> str:
    """Text of token ids; padding is dropped.

    Parameters
    ----------
    ids : iterable of int

    Returns
    -------
    str
    """
    return "".join(VOCAB[i] for i in ids if i != PAD)


def max_response_length(n: int) -> int:
    """Token budget of a sampled response for ``n`` terms: 12 per term plus 8.

    A correct response needs at most ``11 n - 3`` tokens (running sums stay below 1000), so
    a budget of ``12 n + 8`` leaves room for a wrong but well-formed answer; a response
    that does not end within it is truncated and earns no reward.

    Parameters
    ----------
    n : int

    Returns
    -------
    int
    """
    return 12 * int(n) + 8


def arith_reward(problem: Problem, response: str) -> float:
    """1.0 if the response ends with ``.`` and its final answer is the sum, else 0.0.

    The final answer is the text between the last ``=`` and the first ``.``; it must be a
    plain decimal number. Anything after the first ``.`` is ignored.

    Parameters
    ----------
    problem : Problem
    response : str
        The sampled response text (without the prompt).

    Returns
    -------
    float
    """
    end = response.find(EOS)
    if end < 0:
        return 0.0
    body = response[:end]
    answer = body[body.rfind("=") + 1 :] if "=" in body else ""
    return float(answer.isdigit() and int(answer) == problem.total)


def arith_rewards(problems, responses) -> np.ndarray:
    """:func:`arith_reward` of each (problem, response) pair.

    Parameters
    ----------
    problems : sequence of Problem
    responses : sequence of str

    Returns
    -------
    ndarray of float64
    """
    return np.array([arith_reward(p, r) for p, r in zip(problems, responses, strict=True)], dtype=np.float64)
