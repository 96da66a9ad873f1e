"""Prompt ids: what may name the prompt a response answers, and their array form.

GRPO-style rollouts come in groups of responses per prompt; a batch's ``prompt_id``
(:attr:`~variance_lab.rollouts.batch.TokenBatch.prompt_id`) names each sequence's prompt, a string
or an integer. The readers check each entry with :func:`prompt_id_problem` (naming the record),
the batch keeps them as :func:`as_prompt_ids` makes them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["as_prompt_ids", "prompt_id_problem"]

_INT64 = np.iinfo(np.int64)


def prompt_id_problem(value) -> str | None:
    """Return why ``value`` cannot be a prompt id, as ``"is null"`` or ``"must be ..."``; None when it can.

    A prompt id is a string or an integer (not a bool): null, a float, a bool or a container is not.

    Parameters
    ----------
    value : object

    Returns
    -------
    str or None
    """
    if isinstance(value, str):
        return None
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return None
    if value is None:
        return "is null"
    return f"must be a string or an integer, got {type(value).__name__} {value!r}"


def as_prompt_ids(prompt_id, n: int) -> np.ndarray:
    """Return ``prompt_id`` as a 1-D array of ``n`` strings or integers (int64, str or object).

    Integers beyond the int64 range are kept exactly, in an object array.

    Raises
    ------
    ValueError
        Wrong length, or an entry that is None, a float, a bool or a container (naming its index).
    """
    if isinstance(prompt_id, np.ndarray):
        if prompt_id.ndim != 1:
            raise ValueError(f"prompt_id must be a 1-D sequence of {n} ids, got shape {prompt_id.shape}")
        values = prompt_id.tolist()
    elif isinstance(prompt_id, list | tuple):
        values = list(prompt_id)
    else:
        raise ValueError(f"prompt_id must be a 1-D sequence of {n} ids, got {type(prompt_id).__name__}")
    if len(values) != n:
        raise ValueError(f"prompt_id must be a 1-D sequence of {n} ids, got {len(values)}")
    for i, v in enumerate(values):
        problem = prompt_id_problem(v)
        if problem:
            raise ValueError(f"prompt_id of sequence {i} {problem}")
    if all(isinstance(v, int) and _INT64.min <= v <= _INT64.max for v in values):
        out = np.array(values, dtype=np.int64)
    elif all(isinstance(v, str) for v in values):
        out = np.array(values, dtype=str)
    else:
        out = np.empty(n, dtype=object)
        out[:] = values
    return out
