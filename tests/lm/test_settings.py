"""What a run depends on: every bad setting is named before anything runs."""

import pytest

pytest.importorskip("torch", reason="pip install 'variance_lab[lm]'")

from variance_lab.lm.settings import LMSettings

#: Small settings every case changes one or two of.
TINY = LMSettings(
    n_prompts=4, group_size=2, max_new_tokens=12, train_prompts=2, max_words=4, threads=1, lr=1e-2
)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"run": "online"}, "run must"),
        ({"sampler": "bf16"}, "samples in fp32"),
        ({"run": "stale", "n_prompts": 6}, "multiple of lags"),
        ({"group_size": 1}, "group_size"),
        ({"top_p": 1.5}, "top_p"),
        ({"lr": 0.0}, "lr must"),
        ({"length_strata": "2-3:4"}, "length_strata: only with run 'paired'"),
        ({"run": "paired", "length_strata": "4-2:1"}, "strata must read LO-HI:K"),
        ({"run": "paired", "update_lr": -1.0}, "update_lr"),
    ],
)
def test_bad_settings_are_named(changes, match):
    """Each bad setting is named in a ValueError; so is an unknown key."""
    with pytest.raises(ValueError, match=match):
        LMSettings(**{**TINY.to_dict(), **changes})
    with pytest.raises(ValueError, match="unknown settings"):
        LMSettings.from_dict({"steps": 3})


def test_a_paired_run_takes_strata_and_keeps_them_as_written():
    """``length_strata`` is kept as the text given; the empty default means no length batch."""
    assert LMSettings().length_strata == ""
    s = LMSettings(run="paired", length_strata="2-3:11,20-31:36")
    assert s.to_dict()["length_strata"] == "2-3:11,20-31:36"
