"""Low-precision copies and rounded weights."""

import pytest

torch = pytest.importorskip("torch")


def test_round_weights_makes_the_16_bit_copy_exact_and_breaks_no_ties():
    """After rounding, a bf16 copy holds the weights exactly, and a nudge smaller than half a step is lost.

    Unrounded weights halfway between two bf16 numbers move by half a step when nudged
    (the artifact :func:`round_weights` removes); rounded ones stay where they are.
    """
    from variance_lab.lm.precision import round_weights

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)
    with torch.no_grad():  # make a quarter of the weights bf16 ties: low 16 bits 0x8000
        bits = lin.weight.view(torch.int32)
        bits[:16] = (bits[:16] & ~0xFFFF) | 0x8000
    nudge = lin.weight.abs() * 2.0**-20 * torch.sign(torch.randn_like(lin.weight))  # 8 float32 steps
    moved = ((lin.weight + nudge).bfloat16() != lin.weight.bfloat16()).float().mean().item()
    assert moved > 0.1  # half the ties move
    assert round_weights(lin, "bf16") is lin
    assert torch.equal(lin.weight.bfloat16().float(), lin.weight)
    assert torch.equal(lin.weight.half().float(), lin.weight)
    assert torch.equal((lin.weight + nudge).bfloat16().float(), lin.weight)
    before = lin.weight.clone()
    round_weights(lin, "fp32")
    assert torch.equal(lin.weight, before)
    with pytest.raises(ValueError, match="precision must be one of"):
        round_weights(lin, "int8")
