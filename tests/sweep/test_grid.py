"""The command-line grid syntax (variance_lab.sweep.grid)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from variance_lab.sweep.grid import parse_grid, parse_int_grid, parse_name_list


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", [1.0]),
        ("0.1,1,10", [0.1, 1.0, 10.0]),
        ("10, 1 ,0.1", [0.1, 1.0, 10.0]),  # sorted, spaces allowed
        ("1,1,1.0", [1.0]),  # deduplicated
        ("0.9:1.1:5", [0.9, 0.95, 1.0, 1.05, 1.1]),  # rounded to 12 digits: no 0.9500000000000001
        ("0.01:1:log3", [0.01, 0.1, 1.0]),
        ("2:1:2", [1.0, 2.0]),  # descending ranges are fine
        ("3:3:1", [3.0]),
        ("0.5,0.9:1.1:3", [0.5, 0.9, 1.0, 1.1]),
        ("-1:1:3", [-1.0, 0.0, 1.0]),
        ("1e-3:1e-1:log3", [0.001, 0.01, 0.1]),
    ],
)
def test_real_grids(text, expected):
    """Lists and ranges parse into sorted, deduplicated float grids rounded to 12 digits."""
    out = parse_grid(text)
    assert out.dtype == np.float64
    assert out.tolist() == expected


_value = st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: float(f"{v:.6g}"))


@settings(max_examples=60, deadline=None)
@given(st.lists(_value, min_size=1, max_size=12))
def test_comma_lists_are_sorted_and_deduplicated(values):
    """Any comma list parses to its sorted distinct values."""
    out = parse_grid(",".join(repr(v) for v in values))
    assert out.tolist() == sorted(set(values))


@settings(max_examples=60, deadline=None)
@given(_value, _value, st.integers(2, 50))
def test_linear_ranges_keep_their_ends_and_spacing(a, b, count):
    """A linear range a:b:N keeps both ends and equal spacing."""
    out = parse_grid(f"{a!r}:{b!r}:{count}")
    expected = np.unique([float(f"{v:.12g}") for v in np.linspace(a, b, count)]) if a != b else [a]
    assert out[0] == min(a, b)
    assert out[-1] == max(a, b)
    np.testing.assert_allclose(out, expected, rtol=1e-11, atol=1e-11 * max(abs(a), abs(b)))


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1e6), st.floats(1e-6, 1e6), st.integers(2, 40))
def test_log_ranges_are_geometric(a, b, count):
    """A log range a:b:logN has N points with a constant ratio between both ends."""
    a, b = float(f"{a:.6g}"), float(f"{b:.6g}")
    out = parse_grid(f"{a!r}:{b!r}:log{count}")
    if a == b:
        assert out.tolist() == [a]
        return
    assert len(out) == count
    np.testing.assert_allclose(out[[0, -1]], [min(a, b), max(a, b)], rtol=1e-11)
    ratios = out[1:] / out[:-1]
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-10)


def test_log_range_is_geometric():
    """``1:1000:log4`` is 1, 10, 100, 1000."""
    out = parse_grid("1:1000:log4")
    np.testing.assert_allclose(out, [1, 10, 100, 1000], rtol=1e-12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,10,100,1000", [1, 10, 100, 1000]),
        ("1:1000:log4", [1, 10, 100, 1000]),
        ("1:10:log20", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),  # rounded, then deduplicated
        ("1:5:5,3", [1, 2, 3, 4, 5]),
        ("1e6", [1_000_000]),  # an exact integer in any notation
        ("10,10", [10]),  # a length typed twice is one length
        ("1:10.0:log2", [1, 10]),
    ],
)
def test_integer_grids(text, expected):
    """Integer grids round, then deduplicate."""
    out = parse_grid(text, integer=True)
    assert out.dtype == np.int64
    assert out.tolist() == expected


def test_int_grid_minimum():
    """Integer grids below their minimum raise ValueError naming the option and value."""
    assert parse_int_grid("0,5", name="--n", minimum=0).tolist() == [0, 5]
    with pytest.raises(ValueError, match=r"--T: values must be integers >= 1, got 0"):
        parse_int_grid("0,1", name="--T", minimum=1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty grid"),
        ("   ", "empty grid"),
        ("1,,2", "empty item"),
        ("x", "not a number: 'x'"),
        ("1:2", "a range is a:b:N or a:b:logN"),
        ("1:2:3:4", "a range is a:b:N or a:b:logN"),
        ("1:2:0", "point count N >= 1"),
        ("1:2:x", "point count N >= 1"),
        ("1:2:log", "point count N >= 1"),
        ("1:2:-3", "point count N >= 1"),
        ("1:2:1", "one point but two different ends"),
        ("0:1:log3", "needs ends > 0"),
        ("-1:1:log3", "needs ends > 0"),
        ("inf", "must be finite"),
        ("nan", "must be finite"),
        ("1:nan:3", "must be finite"),
    ],
)
def test_bad_grids(text, message):
    """Each malformed grid raises a one-line ValueError that starts with the option name."""
    with pytest.raises(ValueError, match=r"^--mu: ") as info:
        parse_grid(text, name="--mu")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_non_string_is_an_error():
    """A grid that is not a string raises ValueError."""
    with pytest.raises(ValueError, match="empty grid"):
        parse_grid(None)  # type: ignore[arg-type]


def test_name_list():
    """Name lists are deduplicated in order; an unknown name raises ValueError listing the choices."""
    choices = ["lognormal", "gamma", "two-point"]
    assert parse_name_list("gamma, lognormal,gamma", name="--family", choices=choices) == [
        "gamma",
        "lognormal",
    ]
    with pytest.raises(ValueError, match=r"--family: unknown value 'normal'; choose from lognormal"):
        parse_name_list("normal", name="--family", choices=choices)


@pytest.mark.parametrize("text", ["2.6", "1.5", "1,2.5", "1.5:10:3", "1:10.5:log3"])
def test_integer_grids_refuse_fractions(text):
    """Integer grids refuse fractional values, naming the option."""
    with pytest.raises(ValueError, match=r"--T: .* (is not an integer|not a number)"):
        parse_grid(text, name="--T", integer=True)
