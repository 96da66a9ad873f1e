"""experiment.settings: both experiments' settings are stored and checked the same way."""

from dataclasses import dataclass

import pytest

from variance_lab._validate import check_positive
from variance_lab.experiment.settings import RunSettings, check_choices, check_integers


@dataclass(frozen=True)
class _Toy(RunSettings):
    n: int = 2
    seed: int = 0
    kind: str = "a"
    rate: float = 0.5

    def __post_init__(self):
        check_choices(self, {"kind": ("a", "b")})
        check_integers(self, {"n": 1, "seed": None})
        check_positive("rate", self.rate)


def test_settings_round_trip_and_name_unknown_keys():
    """to_dict and from_dict round-trip; an unknown key is named with the known ones."""
    toy = _Toy(n=3, kind="b")
    assert _Toy.from_dict(toy.to_dict()) == toy
    assert _Toy.from_dict({}) == _Toy()
    with pytest.raises(
        ValueError, match=r"unknown settings: bogus, zz; the settings are kind, n, rate, seed"
    ):
        _Toy.from_dict({"zz": 1, "bogus": 2})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n": 1.5}, r"settings n must be integers, got n=1\.5"),
        ({"n": True}, r"settings n must be integers, got n=True"),
        ({"seed": "1"}, r"settings seed must be integers, got seed='1'"),
        ({"n": 0}, r"settings n out of range: n must be >= 1, got 0"),
        ({"kind": "c"}, r"kind must be one of a, b, got 'c'"),
        ({"rate": 0.0}, r"rate must be > 0, got 0\.0"),
        ({"rate": float("nan")}, r"rate must be finite, got nan"),
    ],
)
def test_bad_settings_get_one_message(changes, message):
    """Each check names the setting and the value; seed takes any integer, negative included."""
    with pytest.raises(ValueError, match=message):
        _Toy(**changes)
    assert _Toy(seed=-3).seed == -3


def test_both_experiments_share_the_checks():
    """The arithmetic and the SmolLM2 settings word a bad count and an unknown key alike."""
    pytest.importorskip("torch")
    from variance_lab.experiment.train import ARITH_QUICK as ARITH
    from variance_lab.experiment.train import Settings
    from variance_lab.lm.settings import LM_QUICK as LM
    from variance_lab.lm.settings import LMSettings

    with pytest.raises(ValueError, match=r"settings threads out of range: threads must be >= 1, got 0"):
        Settings(**{**ARITH.to_dict(), "threads": 0})
    with pytest.raises(ValueError, match=r"settings threads out of range: threads must be >= 1, got 0"):
        LMSettings(**{**LM.to_dict(), "threads": 0})
    for cls in (Settings, LMSettings):
        with pytest.raises(ValueError, match=r"unknown settings: steps; the settings are "):
            cls.from_dict({"steps": 3})
    assert LMSettings.from_dict(LM.to_dict()) == LM
