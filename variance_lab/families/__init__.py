r"""Distributions of the per-token importance ratio :math:`r > 0`.

Every family is parametrised by the mean :math:`\mu = E[r] > 0` and the variance
:math:`\sigma^2 = \operatorname{Var}(r) \ge 0` of the ratio (the derivation's parameters),
and exposes the log-moment function

.. math::

    K(s) = \log E[r^s] = \log E[e^{sY}], \qquad Y = \log r,

which is the cumulant generating function of :math:`Y`. Everything in
:mod:`variance_lab.theory` follows from :math:`K`. Each family gives :math:`K` twice:
vectorised in float64 (:meth:`Family.K`) and at arbitrary precision with mpmath
(:meth:`Family.K_mp`), which the theory uses so that differences such as
:math:`T K(2/T) - 2 T K(1/T)` keep their digits at :math:`T = 10^6`.

:math:`\sigma^2 = 0` is the degenerate ratio :math:`r = \mu` in every family.

One home per family: each module holds a family's parameters and their validation, its
:math:`K(s)` in float64 and mpmath, :math:`E[\log r]` and :math:`\operatorname{Var}[\log r]`,
its sampler code and parameters (drawn by :mod:`variance_lab.simulate.draws`) and its float64
theory parts (read by :mod:`variance_lab.theory.fast`):

- :mod:`~variance_lab.families.base`: :class:`Family`, the sampler codes ``CODE_*``;
- :mod:`~variance_lab.families.lognormal`: :class:`LogNormal`, :class:`AR1`;
- :mod:`~variance_lab.families.gamma`: :class:`Gamma`;
- :mod:`~variance_lab.families.two_point`: :class:`TwoPoint`;
- :mod:`~variance_lab.families.random_scale`: :class:`RandomScale`;
- :mod:`~variance_lab.families.mixture`: :class:`LognormalMixture` and its components;
- :mod:`~variance_lab.families.series`: the float series and differences they share.

This package gathers them: :data:`FAMILIES` (by name) and :func:`get_family`.
"""

from __future__ import annotations

from variance_lab.families.base import Family
from variance_lab.families.gamma import Gamma
from variance_lab.families.lognormal import AR1, LogNormal
from variance_lab.families.mixture import LognormalMixture, format_components, parse_components
from variance_lab.families.random_scale import RandomScale
from variance_lab.families.two_point import TwoPoint

__all__ = [
    "AR1",
    "FAMILIES",
    "Family",
    "Gamma",
    "LogNormal",
    "LognormalMixture",
    "RandomScale",
    "TwoPoint",
    "format_components",
    "get_family",
    "parse_components",
]

FAMILIES: dict[str, type[Family]] = {
    cls.name: cls for cls in (LogNormal, Gamma, TwoPoint, AR1, RandomScale, LognormalMixture)
}


def get_family(name: str, mu: float | None = None, sigma2: float | None = None, **params) -> Family:
    """Build a family by name.

    Parameters
    ----------
    name : str
        One of :data:`FAMILIES` (``"lognormal"``, ``"gamma"``, ``"two-point"``, ``"ar1"``).
    mu, sigma2 : float
        Mean and variance of the ratio. ``lognormal-mixture`` derives both from its
        components: leave them ``None`` (or give the derived values).
    **params
        Extra family parameters (``q`` for ``two-point``, ``rho`` for ``ar1``, ``alpha``
        for ``random-scale``, ``components`` for ``lognormal-mixture``).

    Raises
    ------
    ValueError
        For an unknown family, a bad parameter, or one the family cannot reach.
    """
    try:
        cls = FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown family {name!r}; choose one of {', '.join(FAMILIES)}") from None
    allowed = set(cls.extra_parameters())
    unknown = sorted(set(params) - allowed)
    if unknown:
        takes = f"takes only {', '.join(sorted(allowed))}" if allowed else "takes no extra parameters"
        raise ValueError(f"family {name!r} has no parameter {unknown[0]!r}; it {takes}")
    return cls(mu, sigma2, **params)
