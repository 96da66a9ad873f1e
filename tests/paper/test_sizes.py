"""Notebook sizes: one switch (VARIANCE_LAB_QUICK) between CI sizes and full sizes."""

import dataclasses

import pytest

from variance_lab.paper import sizes as sizes_mod
from variance_lab.paper.sizes import FULL, QUICK, Sizes, is_quick, output_dir, sizes


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_quick_values(value):
    """Each spelling of "on" in VARIANCE_LAB_QUICK means quick."""
    assert is_quick({"VARIANCE_LAB_QUICK": value}) is True


@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_full_values(value):
    """Empty and each spelling of "off" in VARIANCE_LAB_QUICK mean full size."""
    assert is_quick({"VARIANCE_LAB_QUICK": value}) is False


def test_unset_is_full():
    """Without VARIANCE_LAB_QUICK the sizes are the full ones."""
    assert is_quick({}) is False


def test_bad_value_names_it():
    """Any other value raises ValueError naming the variable and the value."""
    with pytest.raises(ValueError, match=r"VARIANCE_LAB_QUICK.*'maybe'"):
        is_quick({"VARIANCE_LAB_QUICK": "maybe"})


def test_sizes_reads_the_environment(monkeypatch):
    """``sizes()`` follows the environment unless ``quick`` is given."""
    monkeypatch.setenv("VARIANCE_LAB_QUICK", "1")
    assert sizes() is QUICK
    assert sizes().quick
    monkeypatch.setenv("VARIANCE_LAB_QUICK", "0")
    assert sizes() is FULL
    assert not sizes().quick
    monkeypatch.delenv("VARIANCE_LAB_QUICK")
    assert sizes() is FULL
    assert sizes(quick=True) is QUICK
    assert sizes(quick=False) is FULL


def test_sizes_are_frozen():
    """Sizes cannot be changed after creation."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        QUICK.n_table = 10  # type: ignore[misc]


def test_quick_is_smaller_than_full():
    """Quick sizes are no larger than the full ones, draws fewer; the full table uses 1e6 draws."""
    assert QUICK.quick
    assert not FULL.quick
    for field in ("n_table", "n_per_seed"):
        assert 2 <= getattr(QUICK, field) < getattr(FULL, field)
    for field in ("seeds", "T_mc", "T_line", "mu", "sigma2", "panels_sigma2"):
        assert 0 < len(getattr(QUICK, field)) <= len(getattr(FULL, field)), field
    assert FULL.n_table == 1_000_000  # the command's default table draws


@pytest.mark.parametrize("s", [QUICK, FULL], ids=["quick", "full"])
def test_grids_are_valid(s: Sizes):
    """Every grid is sorted, distinct and valid, and holds the values the notebooks read."""
    for field in ("T_mc", "T_line", "T_sweep"):
        T = getattr(s, field)
        assert list(T) == sorted(set(T)), field
        assert T[0] >= 1, field
        assert all(isinstance(t, int) for t in T), field
    assert list(s.seeds) == sorted(set(s.seeds))
    assert min(s.seeds) >= 0
    assert min(s.mu) < 1.0 < max(s.mu)
    assert 1.0 in s.mu  # the three regimes of the derivation
    assert all(v > 0 for v in s.sigma2 + s.panels_sigma2)
    for T in (100, 1000):  # lengths the notebooks read off their grids
        assert T in s.T_mc
        assert T in s.T_line
        assert T in s.T_sweep
    assert 10 in s.T_sweep
    assert 0.1 in s.sigma2 + s.panels_sigma2


def test_output_dir(tmp_path):
    """VARIANCE_LAB_NOTEBOOK_OUT, when set and non-empty, is created and returned."""
    assert output_dir({}) is None
    assert output_dir({"VARIANCE_LAB_NOTEBOOK_OUT": ""}) is None
    target = tmp_path / "a" / "b"
    assert output_dir({"VARIANCE_LAB_NOTEBOOK_OUT": str(target)}) == target
    assert target.is_dir()


def test_public_names():
    """Every name in ``__all__`` exists in the module."""
    assert set(sizes_mod.__all__) <= set(dir(sizes_mod))
