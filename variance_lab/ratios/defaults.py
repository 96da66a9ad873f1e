r"""Every clip, mask and band default of the toolkit, each typed once.

The corrections' specs (:mod:`variance_lab.corrections.specs`), the sequence weights
(:mod:`variance_lab.rollouts.weights`), the frameworks' mirrors (:mod:`variance_lab.frameworks`)
and both experiments' losses take their defaults from here.

- :data:`GSPO_EPS` :math:`(3\cdot10^{-4}, 4\cdot10^{-4})`: GSPO's clip widths of :math:`s`
  (Zheng et al. 2025); :data:`GSPO_RANGE` the same band as ratios.
- :data:`PPO_EPS` :math:`(0.2, 0.2)`: PPO/GRPO's clip widths of a token ratio; :data:`PPO_RANGE`
  ``(0.8, 1.2)``.
- :data:`DAPO_EPS` :math:`(0.2, 0.28)`: DAPO's clip-higher widths (the token-mean loss).
- :data:`GMPO_EPS` :math:`0.4`: GMPO's log-space clip (Zhao et al. 2025, sec. 4);
  :data:`GMPO_RANGE` :math:`(e^{-0.4}, e^{0.4})`.
- :data:`ICEPOP_BAND` :math:`(0.5, 5)`: IcePop's band of a token ratio (Ring-1T; OpenRLHF's
  ``vllm_is_truncated_threshold``).
- :data:`M2PO_TAU` :math:`0.04`: M2PO's threshold of the batch's second moment
  :math:`\overline{(\log r)^2}` (Zheng et al. 2025, arXiv 2510.01161; AReaL's
  ``actor.m2_threshold``).
- :data:`ASPO_EPS` :math:`(0.2, 0.2)` and :data:`ASPO_DUAL_CLIP` :math:`3`: ASPO's clip widths and
  soft dual clip (Wang et al. 2025, arXiv 2510.06062; ``compute_policy_loss_archer`` of
  ``wizard-III/Archer2.0`` at ``b08d963``, called from ``verl/workers/actor/dp_actor.py:404-424``
  with widths 0.2 for a response's 80 % lowest-entropy tokens, 0.4 for the rest, and 3.0).
- :data:`DPPO_TV_DELTA` :math:`0.15`, :data:`DPPO_KL_DELTA` :math:`0.05`: DPPO's thresholds of the
  token's probability difference and of its binary KL (Qi et al. 2026, arXiv 2602.04879; the values
  of verl's ``examples/dppo_trainer/run_qwen30b_dppo.sh``, verl-project/verl ``8f11888``);
  :data:`KPOP_DELTA` :math:`0.1`: KPop's binary-KL threshold (prime-rl PR #3283,
  ``kpop_threshold``).
- :data:`CPPO_DELTA` :math:`0.2`, :data:`CPPO_W_MIN` :math:`0.8`, :data:`CPPO_DELTA_B` :math:`0.02`:
  CPPO's token-level Binary-TV threshold, position-weight floor and prefix-budget floor (Mao et al.
  2026, arXiv 2606.10968; the defaults of ``CPPOConfig`` in ``unirl/algorithms/cppo.py`` of the
  authors' Tencent-Hunyuan/UniRL at ``30899fc``, and of its recipe ``CPPO/config.yaml``; the
  repository's README quotes the paper's Table 3 as 0.15 for dense models, 0.20 for 30B-A3B).

The package :mod:`variance_lab.ratios` re-exports every name of this module; its ``__all__`` is
the one list of them.
"""

from __future__ import annotations

import math


def eps_range(eps_low: float, eps_high: float) -> tuple[float, float]:
    r"""Return the ratio band :math:`(1 - \varepsilon_l, 1 + \varepsilon_h)` of a clip's widths (float64)."""
    return 1.0 - eps_low, 1.0 + eps_high


#: GSPO's clip widths :math:`(\varepsilon_l, \varepsilon_h)` of :math:`s` (Zheng et al. 2025).
GSPO_EPS = (3e-4, 4e-4)
#: GSPO's band of :math:`s` as ratios, :math:`(1 - \varepsilon_l, 1 + \varepsilon_h)`.
GSPO_RANGE = eps_range(*GSPO_EPS)

#: PPO/GRPO's token-level clip widths, :math:`\varepsilon = 0.2` on both sides.
PPO_EPS = (0.2, 0.2)
#: PPO's band of a token ratio, ``(0.8, 1.2)``.
PPO_RANGE = eps_range(*PPO_EPS)

#: DAPO's clip-higher widths of a token ratio (the token-mean loss).
DAPO_EPS = (0.2, 0.28)

#: GMPO's clip of a token log-ratio, :math:`|\log r| \le 0.4` (Zhao et al. 2025, sec. 4).
GMPO_EPS = 0.4
#: GMPO's band of a token ratio, :math:`(e^{-0.4}, e^{0.4})`.
GMPO_RANGE = (math.exp(-GMPO_EPS), math.exp(GMPO_EPS))

#: IcePop's band of a token ratio, [0.5, 5] (Ring-1T; OpenRLHF's ``vllm_is_truncated_threshold``).
ICEPOP_BAND = (0.5, 5.0)

#: M2PO's threshold of the mean squared token log-ratio of a batch (Zheng et al. 2025, arXiv 2510.01161).
M2PO_TAU = 0.04

#: DPPO-Binary-TV's threshold of :math:`\pi(y) - \mu(y)` (verl's DPPO example, ``clip_ratio`` 0.15 for
#: ``dppo_tv``; prime-rl's ``default_loss_fn`` uses 0.2 on both sides).
DPPO_TV_DELTA = 0.15
#: DPPO-Binary-KL's threshold of the binary KL :math:`D(\mu \| \pi)` (verl's DPPO example, 0.05).
DPPO_KL_DELTA = 0.05
#: KPop's threshold of either binary KL (prime-rl PR #3283, ``kpop_threshold`` 0.1, "as in the paper").
KPOP_DELTA = 0.1
#: CPPO's token-level threshold :math:`\delta` of the weighted Binary-TV divergence :math:`w_t|\pi - \mu|`
#: (UniRL's ``cppo_delta``; its README quotes 0.15 for dense models, 0.20 for 30B-A3B from the paper's
#: Table 3).
CPPO_DELTA = 0.2
#: CPPO's position-weight floor :math:`w_{\min}`: :math:`w_t` falls linearly from 1 (first token) to it.
CPPO_W_MIN = 0.8
#: CPPO's prefix-budget floor :math:`\delta_b`: each sequence's budget is
#: :math:`\operatorname{clamp}(P_{90}(D_{1:T}), \delta_b, 2\delta_b)` (the paper's Eq. 22, as UniRL codes it).
CPPO_DELTA_B = 0.02
#: ASPO's clip widths :math:`(\varepsilon_l, \varepsilon_h)` of a token ratio: Archer2.0's widths of
#: the 80 % lowest-entropy tokens of a response (its other tokens get 0.4; arXiv 2510.06062).
ASPO_EPS = (0.2, 0.2)
#: ASPO's soft dual clip :math:`C`: a weight above it (a negative token's :math:`r`, a positive
#: token's :math:`1/r`) is set to :math:`C` and the token keeps its gradient (Archer2.0's 3.0).
ASPO_DUAL_CLIP = 3.0

#: The truncations of the token ratio that inference-engine corrections offer, in the names NeMo-RL
#: (``truncated_importance_sampling_type``) and OpenRLHF (``vllm_is_correction_type``) both use:
#: ``tis`` caps the ratio, ``icepop`` masks a token outside the band, ``seq-mask-tis`` masks a
#: sequence whose mean log-ratio is outside it.
TRUNCATION_TYPES = ("tis", "icepop", "seq-mask-tis")
