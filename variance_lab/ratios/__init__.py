r"""The shared core for token log-ratios (NumPy only): defaults, the bound rule, weights, advantages.

Every path that clips, masks or weighs ratios (the corrections, the rollouts' sequence weights,
each framework's mirror, both experiments' losses) takes its defaults and its test "modified at
a bound" from here, and states its convention as arguments.

=================  =====================================================================
module             holds
=================  =====================================================================
``defaults``       every clip and band default, typed once (GSPO, PPO, DAPO, GMPO, IcePop, M2PO,
                   DPPO, KPop, CPPO, ASPO)
``bounds``         the bound rule :func:`outside` with its convention (inclusive ends, log or
                   linear space, float32 or float64), :class:`BoundRule`, :func:`log_bounds`
``weights``        exact per-sequence sums of token log-ratios (:func:`segment_sums`), prefix sums
                   within sequences (:func:`segment_cumsums`), clip bands
``advantages``     GRPO's group advantages (``eps``, ``ddof`` named), the variance shares
=================  =====================================================================
"""

from variance_lab.ratios.advantages import VarianceSplit, group_advantages, variance_split
from variance_lab.ratios.bounds import (
    CLOSED,
    LEFT_OPEN,
    OPEN,
    RIGHT_OPEN,
    SPACES,
    BoundRule,
    compare,
    log_bounds,
    outside,
)
from variance_lab.ratios.defaults import (
    ASPO_DUAL_CLIP,
    ASPO_EPS,
    CPPO_DELTA,
    CPPO_DELTA_B,
    CPPO_W_MIN,
    DAPO_EPS,
    DPPO_KL_DELTA,
    DPPO_TV_DELTA,
    GMPO_EPS,
    GMPO_RANGE,
    GSPO_EPS,
    GSPO_RANGE,
    ICEPOP_BAND,
    KPOP_DELTA,
    M2PO_TAU,
    PPO_EPS,
    PPO_RANGE,
    TRUNCATION_TYPES,
    eps_range,
)
from variance_lab.ratios.weights import log_clip_range, segment_cumsums, segment_split_scale, segment_sums

__all__ = [
    "ASPO_DUAL_CLIP",
    "ASPO_EPS",
    "CLOSED",
    "CPPO_DELTA",
    "CPPO_DELTA_B",
    "CPPO_W_MIN",
    "DAPO_EPS",
    "DPPO_KL_DELTA",
    "DPPO_TV_DELTA",
    "GMPO_EPS",
    "GMPO_RANGE",
    "GSPO_EPS",
    "GSPO_RANGE",
    "ICEPOP_BAND",
    "KPOP_DELTA",
    "LEFT_OPEN",
    "M2PO_TAU",
    "OPEN",
    "PPO_EPS",
    "PPO_RANGE",
    "RIGHT_OPEN",
    "SPACES",
    "TRUNCATION_TYPES",
    "BoundRule",
    "VarianceSplit",
    "compare",
    "eps_range",
    "group_advantages",
    "log_bounds",
    "log_clip_range",
    "outside",
    "segment_cumsums",
    "segment_split_scale",
    "segment_sums",
    "variance_split",
]
