"""The settings of an experiment's run, checked and stored the same way by both experiments.

A run's settings are a frozen dataclass (:class:`variance_lab.experiment.train.Settings` for the
arithmetic experiment, :class:`variance_lab.lm.settings.LMSettings` for the SmolLM2 experiment)
that derives from :class:`RunSettings`: it is written to the sidecar as a plain dict
(:meth:`RunSettings.to_dict`) and read back from one, an unknown key named
(:meth:`RunSettings.from_dict`). Its ``__post_init__`` checks each setting with
:func:`check_integers` and :func:`check_choices` (and numbers with
:func:`variance_lab._validate.check_positive`), so that a bad value gets the same message in
both experiments. No PyTorch here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

__all__ = ["RunSettings", "check_choices", "check_integers"]


class RunSettings:
    """Base of a frozen settings dataclass: to a plain dict and back, naming unknown keys."""

    def to_dict(self) -> dict:
        """Return the settings as a plain dict (for the JSON sidecar).

        Returns
        -------
        dict
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        """Return settings from a dict such as :meth:`to_dict` wrote; an unknown key is an error.

        Parameters
        ----------
        values : mapping
            Setting names to values; missing ones take their defaults.

        Returns
        -------
        RunSettings
            An instance of the class it is called on.

        Raises
        ------
        ValueError
            Naming the unknown keys and the known ones.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown settings: {', '.join(unknown)}; the settings are {', '.join(sorted(known))}"
            )
        return cls(**values)


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_integers(settings, minimum: Mapping[str, int | None]) -> None:
    """Check that each named setting is an integer (not a bool) and at least its minimum.

    Parameters
    ----------
    settings : object
        Read with :func:`getattr`.
    minimum : mapping
        Setting name to its smallest allowed value, or None for any integer.

    Raises
    ------
    ValueError
        ``settings a, b must be integers, got a=1.5, b=True`` for every non-integer, else
        ``settings a out of range: a must be >= 1, got 0`` for every value below its minimum.
    """
    values = {name: getattr(settings, name) for name in minimum}
    bad = [name for name, value in values.items() if not _is_integer(value)]
    if bad:
        got = ", ".join(f"{name}={values[name]!r}" for name in bad)
        raise ValueError(f"settings {', '.join(bad)} must be integers, got {got}")
    low = [name for name, least in minimum.items() if least is not None and values[name] < least]
    if low:
        why = "; ".join(f"{name} must be >= {minimum[name]}, got {values[name]!r}" for name in low)
        raise ValueError(f"settings {', '.join(low)} out of range: {why}")


def check_choices(settings, choices: Mapping[str, Sequence[str]]) -> None:
    """Check that each named setting is one of its allowed values.

    Parameters
    ----------
    settings : object
    choices : mapping
        Setting name to the allowed values.

    Raises
    ------
    ValueError
        ``name must be one of a, b, got 'c'`` for the first setting that is not.
    """
    for name, allowed in choices.items():
        value = getattr(settings, name)
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
