r"""The frameworks' conventions in one table: the bound rules, the means, the clamps and the dtypes.

Each mirror states its framework's convention as module constants over the shared core: a
:class:`~variance_lab.ratios.BoundRule` per bound test (which ends are kept, the space, the dtype)
and a :class:`~variance_lab.frameworks.batch.MeanRule` for its masked means (the divisor and the
pooling). :data:`CONVENTIONS` collects those very objects, so the table the docs print from it
(:func:`conventions_table`) is the one the code runs; a test checks that each mirror uses them.

The frameworks compute in their tensors' dtype, float32 log-probabilities in most runs. The verl
mirror does too (its mean's dtypes are torch's, the mean column says so); the others compute in
float64: the last column says where that changes an answer beyond float32's rounding of each
operation, and what a mirror does not reproduce yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from variance_lab.frameworks import areal, nemo_rl, openrlhf, prime_rl, slime, slime_mis, trl, verl
from variance_lab.frameworks.batch import MeanRule
from variance_lab.ratios import BoundRule

__all__ = ["CONVENTIONS", "Conventions", "conventions_table"]


@dataclass(frozen=True)
class Conventions:
    """One framework's conventions, as its mirror applies them.

    Attributes
    ----------
    framework : str
        The name :func:`variance_lab.frameworks.logfiles.detect_framework` uses.
    source : str
        The file and release or commit the mirror follows.
    log_ratio : str
        The per-token log-ratio the framework takes.
    clamp : str
        What the framework does to a large log-ratio or weight.
    rules : mapping of str to BoundRule
        Each bound test the mirror makes, by what it tests.
    mean : MeanRule
        The framework's masked mean (its default).
    differences : str
        Where the mirror's answer can differ from the framework's own: the framework's dtype
        (the mirror computes in float64) and what the mirror does not reproduce yet.
    option_means : mapping of str to MeanRule
        The masked means an option of the framework selects instead of ``mean``, by the option
        (slime's ``calculate_per_token_loss=True``); empty for most.
    """

    framework: str
    source: str
    log_ratio: str
    clamp: str
    rules: Mapping[str, BoundRule]
    mean: MeanRule
    differences: str
    option_means: Mapping[str, MeanRule] = field(default_factory=lambda: MappingProxyType({}))


def _rules(**rules: BoundRule) -> Mapping[str, BoundRule]:
    return MappingProxyType(rules)


def _means(**means: MeanRule) -> Mapping[str, MeanRule]:
    return MappingProxyType(means)


#: The mirrors' conventions, by framework name: the six frameworks ``logged`` reads, and AReaL.
CONVENTIONS: Mapping[str, Conventions] = MappingProxyType(
    {
        "verl": Conventions(
            "verl",
            "verl/trainer/ppo/rollout_corr_helper.py, verl 0.9.1",
            "log pi_old - log pi_rollout",
            "log-ratios clamped to +-20 before exp; the sequence sum clamped to +-20",
            _rules(
                float64_tensors=verl.THRESHOLD_RULE,
                float32_tensors=verl.F32_THRESHOLD_RULE,
            ),
            verl.VERL_MEAN,
            "none beyond float32 rounding: the mirror computes in verl's dtypes (float32 log-probs, "
            "an int64/bool mask whose count + 1e-8 is float32, a float32 log C in sequence mode); "
            "a float32 sum's order, torch's exp off by one ulp on ~1% of inputs and its log(C) "
            "on ~7% of thresholds can move a weight or sequence within one ulp of a bound",
        ),
        "trl": Conventions(
            "trl",
            "trl/trainer/grpo_trainer.py, TRL 1.16.0",
            "log pi_old - log pi_vLLM (NaN -> 0)",
            "none in the vLLM correction (float32 overflows to inf above 88.72, then capped or "
            "masked); VESPO clamps log w to [log 1e-8, 20]",
            _rules(
                vllm_masks=trl.MASK_RULE,
                vllm_masks_float32=trl.MASK_F32_RULE,
                off_policy_mask=trl.OFF_POLICY_RULE,
                off_policy_mask_float32=trl.OFF_POLICY_F32_RULE,
            ),
            trl.TRL_MEAN,
            "none beyond float32 rounding: the mirror computes in TRL's dtypes (float32 log-probs, "
            "the mask's dtype, the bounds cast to float32; the gamma weights' constants float32 as "
            "TRL's); a float32 sum's order and torch's exp one ulp off can move a value, which "
            "VESPO's exponent amplifies (within float32's error bound); checked against the static "
            "methods and the inline vLLM blocks run verbatim (tools/trl_fixtures.py, 24 batches)",
        ),
        "nemo-rl": Conventions(
            "nemo-rl",
            "nemo_rl/algorithms/loss/loss_functions.py, NeMo-RL ced083a",
            "log pi_prev - log pi_gen",
            "an overflowing weight becomes 0 (nan_to_num(posinf=0))",
            _rules(
                tis_icepop_weights=nemo_rl.NEMO_WEIGHT_RULE,
                seq_mask_tis_geometric_mean=nemo_rl.SEQUENCE_RULE,
            ),
            nemo_rl.NEMO_MEAN,
            "float32 log-probs: bound decisions on the float32 weights and geometric means, values in "
            "float64 in NeMo-RL's order of operations (the JS term too), divided by the float32 count "
            "(count + 1e-8 in float32 is the count), is_oob_ratio a float32 quotient per micro-batch; "
            "float32 inf/NaN of exp (above 88.72) and of the JS mixture (both log-probs "
            "below -103.97) reproduced, an overflowed weight 0; gen_kl_error, policy_kl_error, "
            "js_divergence_error summed over micro-batches with a valid sample as grpo logs them; "
            "the sequence-level sampling_importance_ratio's (b, 1) by (b,) broadcast reproduced with "
            "micro_batch_size=; checked against ClippedPGLossFn run verbatim (216 settings, logged "
            "metrics and per-token weights, tools/nemo_rl_fixtures.py); not mirrored: dynamic "
            "batching, sequence packing, several global batches per step, float32 subnormal "
            "precision below -87.3",
        ),
        "prime-rl": Conventions(
            "prime-rl",
            "src/prime_rl/trainer/rl/loss.py, prime-rl 559b447",
            "log pi_trainer - log pi_inference; DPPO, IPO and ref-KL mask on pi_trainer - pi_inference",
            "none",
            _rules(dppo_mask=prime_rl.PRIME_RL_RULE, icepop_log_ratio=prime_rl.ICEPOP_LOSS_RULE),
            prime_rl.PRIME_RL_MEAN,
            "probability differences in float32 as prime-rl takes them (the correctly rounded float32 "
            "exp: torch's is one ulp off on about 1 % of inputs, which at a bound flips a mask: 1 of "
            "6,752 fixture decisions); values in float64 (prime-rl's float32 e^y - y - 1 of a small y "
            "is mostly rounding), fractions the float32 quotient of two int64 counts, as prime-rl's "
            "_safe_mean gives them; per-sample metrics of default (DPPO), ipo and ref_kl, rl_weights "
            "and ref_kl_weights mirrored; mismatch_kl in prime-rl's order (e^y - y - 1); IcePop (PR "
            "#3526, after 559b447, no commit recorded for it: the float32 log-ratio "
            "against the bounds' float32 logs) checked against IcePopLoss run verbatim "
            "(tools/prime_rl_icepop_fixtures.py, 4,650 decisions); not mirrored: the ce loss's "
            "nll, custom losses, the loss values themselves",
        ),
        "slime": Conventions(
            "slime",
            "slime/backends/megatron_utils/loss.py and mis.py, slime 624b824",
            "log pi_old - log pi_rollout",
            "tis/icepop none (a float32 ratio overflows to inf above a log-ratio of 88.72, as in slime); "
            "mis.py clamps log-ratios (token, sequence sum or mean) to +-20",
            _rules(tis_icepop=slime.ICEPOP_RULE, veto=slime.VETO_RULE, mis=slime_mis.MIS_RULE),
            slime.SLIME_MEAN,
            "bound tests in float32 as slime makes them (the float32 ratio's correctly rounded exp, "
            "which torch's differs from by one ulp on 1.0 % of inputs; the veto threshold's log in "
            "float32); values in float64; fractions as slime divides them (each sample's count over "
            "its rollout's float32 count, the quotients summed in float32); mis.py's sequence sum is "
            "rounded once (slime sums in float32); "
            "not mirrored: NaN metrics from an inf ratio on a token outside the loss mask, the loss "
            "itself (pg_loss, pg_clipfrac, entropy, kl_loss), OPSM, CISPO, OPD, context parallelism",
            _means(calculate_per_token_loss=slime.SLIME_TOKEN_MEAN),
        ),
        "openrlhf": Conventions(
            "openrlhf",
            "openrlhf/models/loss.py, OpenRLHF 3c3be62",
            "log pi_old - log pi_rollout (vLLM correction); gspo: the sequence mean of "
            "log pi - log pi_rollout (correction on) or log pi - log pi_old",
            "ppo: the log-ratio clamped to +-20 before exp; tis clamps the ratio to [low, high], "
            "from below too; none in the masks (a float32 ratio overflows to inf above 88.72)",
            _rules(float64_tensors=openrlhf.OPENRLHF_RULE, float32_tensors=openrlhf.OPENRLHF_F32_RULE),
            openrlhf.OPENRLHF_MEAN,
            "none beyond float32 rounding: the mirror computes in OpenRLHF's dtypes (float32 "
            "log-probs, the mask's dtype, a float32 mean); a float32 mean's order of summation, "
            "torch's exp one ulp off on ~1% of inputs; checked against PolicyLoss run verbatim "
            "(288 settings, tools/openrlhf_fixtures.py); not mirrored: the loss value, dual-clip, "
            "the averaging of metrics over micro-batches",
            _means(policy_loss_type_gspo=openrlhf.GSPO_MEAN),
        ),
        "areal": Conventions(
            "areal",
            "areal/trainer/ppo/actor.py, AReaL 4aef98d",
            "log pi_behave - log pi_prox (M2PO's y; the square y^2 is sorted)",
            "none",
            _rules(m2po_running_mean=areal.M2PO_RULE, m2po_running_mean_float32=areal.M2PO_F32_RULE),
            areal.AREAL_MEAN,
            "none on a CPU (with torch installed): the mirror computes in AReaL's dtype (float32 "
            "y^2, running sums accumulated in float64 and rounded to float32 as torch's CPU cumsum, "
            "a GPU's in float32), the strict < tau; ties at the cut in the order of torch's own sort where "
            "torch is installed (AReaL's CPU order; a GPU's differs, the count per value is the "
            "same); checked "
            "against _apply_m2po_masking run verbatim (240 settings, tools/areal_fixtures.py); "
            "the mirror covers M2PO only (no PPO loss, no decoupled loss)",
        ),
    }
)


def _rule_text(rule: BoundRule) -> str:
    ends = {(True, True): "[lo, hi]", (False, False): "(lo, hi)", (True, False): "[lo, hi)"}
    return f"{ends.get(tuple(rule.inclusive), '(lo, hi]')} {rule.space} {rule.dtype}"


def _mean_text(mean: MeanRule) -> str:
    eps = f"{mean.eps:.0e}".replace("e-0", "e-")
    divisor = {
        "eps": f"count + {eps}",
        "at_least_one": "max(count, 1)",
        "row_at_least_one": "sum of max(row count, 1)",
        "exact": "count",
    }
    dtypes = (
        ", in torch's dtypes (count + eps float32 for an int/bool/float32 mask; a fraction of "
        "flags a float32 quotient)"
        if mean.dtypes == "torch"
        else ""
    )
    return f"/ {divisor[mean.count]}, pooled over {mean.pooling}{dtypes}"


def _means_text(c: Conventions) -> str:
    options = "".join(f"; {name}: {_mean_text(m)}" for name, m in c.option_means.items())
    return _mean_text(c.mean) + options


def conventions_table() -> str:
    """Return the conventions of every mirror as a Markdown table, one row per framework.

    Returns
    -------
    str
        Columns: framework, source, log-ratio, bound rules (kept ends, space and dtype), masked
        mean (divisor and pooling, then those an option selects), clamp, and where the mirror can
        differ from the framework.
    """
    head = "| framework | source | log-ratio | bound rules | masked mean | clamp | where the mirror differs |"
    lines = [head, "|" + "---|" * 7]
    for c in CONVENTIONS.values():
        rules = "; ".join(f"{name.replace('_', ' ')}: {_rule_text(r)}" for name, r in c.rules.items())
        cells = (c.framework, c.source, c.log_ratio, rules, _means_text(c), c.clamp, c.differences)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
