"""The correction specs' practitioners' defaults: IcePop's band [0.5, 5] and its asymmetric form."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from variance_lab import corrections as co
from variance_lab.families import get_family


@pytest.mark.parametrize(
    ("spec", "params"),
    [
        ("icepop", (0.5, 5.0)),
        ("icepop:5", (5.0,)),
        ("icepop:0.5:5", (0.5, 5.0)),
        ("icepop:0.8:1.1", (0.8, 1.1)),
    ],
)
def test_icepop_forms(spec, params):
    """``icepop`` alone is Ring-1T's [0.5, 5]; ``icepop:B`` keeps [1/B, B]; ``icepop:LO:HI`` any band."""
    assert co.parse(spec).params == params


@pytest.mark.parametrize("spec", ["icepop:5:0.5", "icepop:0:2", "icepop:1", "icepop:1:2:3"])
def test_bad_icepop_names_the_spec(spec):
    """A band with LO >= HI, LO <= 0, B <= 1 or three numbers: ValueError naming the spec."""
    with pytest.raises(ValueError, match=spec):
        co.parse(spec)


def test_asymmetric_icepop_against_quadrature():
    """E[w], E[w^2] and the masked fraction of icepop:0.5:5 equal scipy quadrature of the lognormal."""
    fam = get_family("lognormal", 1.05, 0.4)
    m, s = fam.mean_log, math.sqrt(fam.var_log)
    row = co.theory(fam, [1], "icepop").iloc[0]
    lo, hi = math.log(0.5), math.log(5.0)
    dens = stats.norm(m, s).pdf
    e1 = integrate.quad(lambda y: math.exp(y) * dens(y), lo, hi, epsabs=0, epsrel=1e-12)[0]
    e2 = integrate.quad(lambda y: math.exp(2 * y) * dens(y), lo, hi, epsabs=0, epsrel=1e-12)[0]
    out = stats.norm.cdf(lo, m, s) + stats.norm.sf(hi, m, s)
    assert row.mean_w == pytest.approx(e1, rel=1e-10)
    assert row.var_w == pytest.approx(e2 - e1 * e1, rel=1e-9)
    assert row.frac_modified == pytest.approx(out, rel=1e-9)


def test_icepop_band_applied_to_tokens():
    """apply_tokens keeps the ratios inside [LO, HI] and zeroes the others."""
    r = np.array([0.4, 0.5001, 1.0, 4.99, 5.2])
    w, mod = co.apply_tokens(co.parse("icepop:0.5:5"), np.log(r))
    np.testing.assert_allclose(w, [0.0, 0.5001, 1.0, 4.99, 0.0], rtol=1e-14)
    np.testing.assert_array_equal(mod, [True, False, False, False, True])
