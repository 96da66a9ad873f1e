r"""Corrections practitioners apply to importance weights, and what they do as functions of T.

Every correction is a transformation of a weight. Sequence-level corrections act on the
sequence ratio :math:`P_T = \prod_{t \le T} r_t` (or GSPO's :math:`s = G_T = P_T^{1/T}`),
token-level ones on each token's ratio :math:`r_t`. In a training framework :math:`r_t` is
whichever ratio the correction is applied to: the rollout mismatch
:math:`\pi_{old}/\mu_{rollout}` (TIS, IcePop, sequence masks, Geo-RS) or the update
:math:`\pi_\theta/\pi_{old}` (PPO, CISPO, GSPO, GMPO). The spec strings:

====================  ========  ===========================================================
spec                  level     weight :math:`w` (modified: what counts as truncated/masked)
====================  ========  ===========================================================
``seq-tis:C``         sequence  :math:`\min(P_T, C)`; modified when :math:`P_T > C`
                                (sequence-level truncated IS: verl ``rollout_is=sequence``,
                                TRL ``vllm_importance_sampling_mode=sequence_truncate``)
``seq-mask:C``        sequence  :math:`P_T 1\{P_T \le C\}`; modified when :math:`P_T > C`
                                (TRL's ``sequence_mask``, cap 3 by default)
``seq-mask:LO:HI``    sequence  :math:`P_T 1\{LO \le P_T \le HI\}` (verl
                                ``rollout_rs=seq_sum_k1`` with threshold ``"1/HI_1/LO"``: its
                                k1 options bound :math:`-\log P_T`, so the bounds swap)
``geo-rs:LO:HI``      sequence  :math:`P_T 1\{LO \le G_T \le HI\}`: the sequence is rejected when
                                its geometric mean is outside :math:`[LO, HI]` (Geo-RS /
                                Geo-Mask; verl ``rollout_rs=seq_mean_k1`` with threshold
                                ``"1/HI_1/LO"``)
``gspo[:E|:EL:EH]``   sequence  :math:`\operatorname{clip}(G_T, 1 - EL, 1 + EH)`, GSPO's clip of
                                :math:`s`; default :math:`3\cdot10^{-4}, 4\cdot10^{-4}`
``tis:C``             token     :math:`\min(r_t, C)` (token-level TIS: verl ``rollout_is=token``,
                                NeMo-RL/OpenRLHF truncated importance sampling)
``icepop[:B]``        token     :math:`r_t 1\{1/B \le r_t \le B\}`: tokens outside
                                :math:`[1/B, B]` masked; ``icepop:LO:HI`` masks outside
                                :math:`[LO, HI]`, and ``icepop`` alone uses Ring-1T's
                                :math:`[0.5, 5]` (IcePop; OpenRLHF's default; verl
                                ``rollout_is=token`` with threshold ``"LO_HI"``)
``cispo:EPS``         token     :math:`\min(r_t, 1 + EPS)`, or ``cispo:EL:EH``:
                                :math:`\operatorname{clip}(r_t, 1-EL, 1+EH)`; the weight is
                                clipped and stop-gradiented, the token keeps its gradient
                                (CISPO, MiniMax-M1)
``ppo:EPS``           token     :math:`\operatorname{clip}(r_t, 1-EPS, 1+EPS)` (or
                                ``ppo:EL:EH``): PPO's clipped ratio
``gmpo[:EPS]``        token     :math:`\exp(\frac1T\sum_t \operatorname{clip}(\log r_t, -EPS, EPS))`:
                                GMPO's sequence weight, log-ratios clipped at 0.4 by default
``ctpo:EL:EH``        token     :math:`P_t 1\{-EL\sqrt t \le L_t \le EH\sqrt t\}`, :math:`P_t = \prod_{s
                                \le t} r_s`, :math:`L_t = \log P_t`: CTPO's cumulative prefix ratio,
                                masked where its log leaves bounds growing like :math:`\sqrt t`
                                (``ctpo:E`` is ``ctpo:E:E``; :mod:`~variance_lab.corrections.prefix`)
``m2po[:TAU[:B]]``    token     :math:`r_t`, or 0 where M2PO masks it: in each batch of ``B``
                                sequences (default 256) the largest :math:`(\log r)^2` are masked
                                until the mean of the rest is below ``TAU`` (default 0.04); in
                                theory the large-batch limit :math:`r 1\{(\log r)^2 \le q\}`,
                                :math:`E[(\log r)^2 \mid (\log r)^2 \le q] = TAU`
                                (:mod:`~variance_lab.corrections.m2po`)
``topr[:P]``          sequence  1 when the sequence's advantage :math:`A \ge 0`, :math:`\min(P_T, 1)`
                                when :math:`A < 0` (TOPR); modified: a negative :math:`P_T > 1`
``opsm:DELTA[:P]``    sequence  :math:`P_T`, or 0 when :math:`A < 0` and :math:`-\log G_T > DELTA`
                                (DeepSeek-V3.2's off-policy sequence mask, TRL's
                                ``off_policy_mask_threshold``); ``P`` is the theory's
                                :math:`P(A \ge 0)`, default 0.5; three rows, by sign
                                (:mod:`~variance_lab.corrections.sign`)
``dppo-tv[:D[:P]]``   token     :math:`r_t`, or 0 when :math:`A > 0` and :math:`\pi - \mu > D`, or
                                :math:`A \le 0` and :math:`\pi - \mu < -D` (DPPO-Binary-TV, default
                                0.15; :math:`\pi, \mu` the token's probabilities under the ratio's
                                numerator and the sampler; :mod:`~variance_lab.corrections.probmask`);
                                ``P`` is the theory's :math:`P(A > 0)`; rows ``A>0``, ``A<=0``
``dppo-kl[:D[:P]]``   token     the same sides with the binary KL :math:`D(\mu \| \pi) > D`
                                (DPPO-Binary-KL, default 0.05)
``kpop[:D]``          token     :math:`r_t`, or 0 when :math:`D(\pi \| \mu) > D` or :math:`D(\mu \| \pi) > D`
                                (KPop's binary-KL trust region, default 0.1); its theory and
                                DPPO's need a law of the token's probability
                                (:mod:`~variance_lab.corrections.tokenprob`)
``aspo[:EL:EH:C:P]``  token     ASPO: :math:`1/r` on :math:`[1/C, 1 + EH]` when :math:`A \ge 0`
                                (:math:`C` below, 0 above), :math:`r` on :math:`[1 - EL, C]` when
                                :math:`A < 0` (0 below, :math:`C` above): the weight of each token's
                                gradient in ASPO's loss; modified: zeroed or dual-clipped; default
                                0.2, 0.2, 3; ``aspo``, ``aspo:E`` (both widths), ``aspo:EL:EH``,
                                ``aspo:EL:EH:C`` (:mod:`~variance_lab.corrections.sign`)
``cppo[:D:...]``      token     :math:`r_t`, or 0 when :math:`A(r_t - 1) > 0` and :math:`w_t|\pi_t - \mu_t| >
                                \min(\delta, \delta + \beta W_{t-1} - S_{t-1})`: CPPO's position-weighted,
                                cumulative-prefix Binary-TV mask, ``cppo[:D[:WMIN[:DB[:P]]]]``
                                (:math:`w_t` falls from 1 to ``WMIN``, :math:`S_{t-1}` the prefix's
                                weighted divergences, :math:`\beta` the sequence's budget from ``DB``;
                                defaults 0.2, 0.8, 0.02;
                                :func:`~variance_lab.corrections.probmask.cppo_mask`); ``P`` is the
                                theory's :math:`P(A > 0)`; rows ``A>0``, ``A<=0``; Monte Carlo, and exact
                                parts in :mod:`~variance_lab.corrections.cppo`
====================  ========  ===========================================================

On data a value exactly at a bound is kept (:data:`BOUND_RULE`, the rule of
:mod:`variance_lab.ratios.bounds`: closed ends, log space, float64), as the table's
:math:`1\{LO \le X \le HI\}` says; the defaults (GSPO's widths, GMPO's clip, IcePop's band)
are :mod:`variance_lab.ratios.defaults`'.

PPO and CISPO have the same weight value; they differ in the gradient: PPO's clipped
tokens lose their gradient (for the sign of advantage that makes the clip bind), CISPO's
keep it. ``frac_modified`` counts tokens outside the clip range on both sides, an upper
bound of the ``clipfrac`` PPO implementations log (which count only the binding side).

Quantities, for each correction and T (:func:`theory`):

- ``mean_w`` :math:`= E[w]`; ``bias`` :math:`= E[w] - E[b]`, with :math:`b` the
  uncorrected weight the correction acts on (:math:`P_T`, :math:`G_T` for ``gspo`` and
  ``gmpo``, :math:`r` for the token corrections, the prefix product :math:`P_t` for
  ``ctpo``); ``mean_base`` :math:`= E[b]`.
- ``var_w`` :math:`= \operatorname{Var}(w)`; ``ess_frac`` :math:`= E[w]^2 / E[w^2]`
  (Kong's effective sample size over the number of weights).
- ``frac_modified``: the probability that a weight is truncated, clipped or masked (per
  sequence for the sequence level, per token for the token level);
  ``frac_seq_any``: the fraction of sequences with at least one modified token
  (:math:`1 - (1 - p)^T` for i.i.d. tokens; equal to ``frac_modified`` at sequence level;
  NaN for ``ctpo`` in theory, where it is a boundary-crossing probability of the walk
  :math:`L_t`: its Monte Carlo column gives it).
  For the token level ``mean_w``, ``var_w`` and ``ess_frac`` are per token (GMPO: per
  sequence, its weight is one per sequence).

**Closed forms** (lognormal family). :math:`\log X \sim N(M, S^2)` for each base
variable: :math:`\log P_T \sim N(Tm, Tv)`, :math:`\log G_T \sim N(m, v/T)`,
:math:`\log r \sim N(m, v)`. Each weight is piecewise :math:`c_i X^{p_i}` on intervals
:math:`(a_i, b_i]` of :math:`\log X` (:math:`p_i \in \{0, 1\}`), so the truncated-lognormal
moments

.. math::

    E[X^k 1\{a < \log X \le b\}] = e^{kM + k^2 S^2/2}
        \Bigl[\Phi\Bigl(\frac{b - M - kS^2}{S}\Bigr) - \Phi\Bigl(\frac{a - M - kS^2}{S}\Bigr)\Bigr]

give :math:`E[w^j] = \sum_i c_i^j E[X^{p_i j} 1\{a_i < \log X \le b_i\}]`. For example
:math:`E[\min(P_T, C)] = e^{M + S^2/2}\Phi((\ln C - M - S^2)/S) + C(1 - \Phi((\ln C - M)/S))`;
the mask drops the second term. Everything is computed in log space: :math:`\log\Phi`
(``scipy.special.log_ndtr``) for tails, Gauss-Legendre quadrature of :math:`\varphi` for
intervals narrower than one standard deviation (where a difference of :math:`\Phi` values
would cancel), and ``logsumexp`` over the pieces, so nothing overflows at
:math:`T = 10^6`. GMPO: :math:`E[w^k] = (E[e^{(k/T) \operatorname{clip}(\log r, -\epsilon,
\epsilon)}])^T`, the same pieces with a fractional power.

**Random-scale and lognormal-mixture ratios** (:func:`theory`, no Monte Carlo): given a
sequence's variance :math:`v` (random scale) or its component counts (mixture) the log-ratios
are Gaussian, so the closed forms above hold conditionally; they are integrated over
:math:`v \sim \mathrm{Gamma}(\alpha, \theta)` by adaptive quadrature or summed over the
multinomial law of the counts (cut where less than :data:`MIXTURE_TAIL_MASS` is left). Each
row's ``method`` says which.

**Monte Carlo** (:func:`simulate_corrections`, every family) draws token log-ratios with the
engine's kernels (:func:`variance_lab.simulate.kernels.draw_log_r`), one
``np.random.Generator`` per chunk from ``SeedSequence(seed)``, and gives intervals and a
verdict. **Data** (:func:`evaluate`) applies the same transformations to measured token
log-ratios, with intervals of the modified fractions and, optionally, a fitted model's
predictions beside them; :func:`bucket_bootstrap` gives the relative bias and ESS fraction per
length bucket with bootstrap intervals.

The package, one module per concept: :mod:`~variance_lab.corrections.specs` (the kinds and their
spec strings), :mod:`~variance_lab.corrections.gauss` (normal interval masses and
truncated-lognormal moments in log space), :mod:`~variance_lab.corrections.prefix` (CTPO: the
clipped fraction by position, :func:`ctpo_positions`, and the variances of prefix weights,
:func:`prefix_variances`), :mod:`~variance_lab.corrections.m2po` (M2PO: the batch rule and its
large-batch cut, :func:`m2po_cut`), :mod:`~variance_lab.corrections.closed_forms` (closed forms,
quadrature and exact sums: :func:`theory`, :func:`find_T`), :mod:`~variance_lab.corrections.weights`
(the weights from log-ratios), :mod:`~variance_lab.corrections.monte_carlo`
(:func:`simulate_corrections`, :func:`simulate_positions`),
:mod:`~variance_lab.corrections.data` (observed fractions on data: :func:`evaluate`,
:func:`bucket_bootstrap`), :mod:`~variance_lab.corrections.probmask` (the probability-aware masks'
rules: :func:`apply_prob`), :mod:`~variance_lab.corrections.tokenprob` (their theory under a stated
law of the token's probability: :class:`TokenProbability`, :func:`prob_log_moments`),
:mod:`~variance_lab.corrections.cppo` (CPPO's exact parts and long-sequence limit: :func:`cppo_positions`,
:func:`cppo_limit`) and
:mod:`~variance_lab.corrections.bins` (fractions on data by the token's probability or entropy:
:func:`mask_by_bins`). Every public name is re-exported here.
"""

from variance_lab.corrections.bins import BIN_COLUMNS, BINNED_BY, ENTROPY_EDGES, P_EDGES, mask_by_bins
from variance_lab.corrections.closed_forms import (
    COLUMNS,
    MAX_COUNT_TERMS,
    MIXTURE_TAIL_MASS,
    TAIL_MASS,
    WEIGHT_COLUMNS,
    find_T,
    has_theory,
    theory,
)
from variance_lab.corrections.cppo import CPPO_POSITION_COLUMNS, cppo_limit, cppo_positions, tv_tails
from variance_lab.corrections.data import (
    BOOTSTRAP_COLUMNS,
    CORRECTIONS_PREDICTION_COLUMNS,
    DATA_COLUMNS,
    N_BOOT,
    bucket_bootstrap,
    check_advantages,
    check_log_mu,
    check_rollout_arrays,
    evaluate,
    expected_masked,
    fit_lognormal,
    fraction_interval,
)
from variance_lab.corrections.gauss import log_phi_diff
from variance_lab.corrections.m2po import M2PO_RULE, batch_mask, batch_masks, m2po_cut, resolve_cut
from variance_lab.corrections.monte_carlo import (
    CORRECTIONS_MC_COLUMNS,
    MIN_ESS,
    POSITION_MC_COLUMNS,
    simulate_corrections,
    simulate_positions,
)
from variance_lab.corrections.prefix import (
    POSITION_COLUMNS,
    PREFIX_VARIANCE_COLUMNS,
    clip_probability,
    ctpo_log_moments,
    ctpo_positions,
    prefix_variances,
)
from variance_lab.corrections.probmask import (
    DPPO_KL_EPS,
    KPOP_CLAMP,
    PROB_RULE,
    apply_prob,
    binary_kl,
    cppo_mask,
    logit_shift,
    position_weights,
    prob_difference,
    prob_sides,
)
from variance_lab.corrections.sign import (
    ASPO_RULE,
    DPPO_SIGNS,
    OPSM_RULE,
    SIGNS,
    apply_signed,
    is_positive,
    opsm_keep,
    sign_label,
    sign_log_moments,
    signs,
)
from variance_lab.corrections.specs import (
    ASPO_DEFAULT,
    CORRECTION_KINDS,
    CPPO_DEFAULT,
    DPPO_KL_DEFAULT,
    DPPO_TV_DEFAULT,
    GMPO_DEFAULT,
    GSPO_DEFAULT,
    ICEPOP_DEFAULT,
    KPOP_DEFAULT,
    M2PO_BATCH,
    M2PO_DEFAULT,
    PROB_KINDS,
    SIGN_P_DEFAULT,
    SIGNED_KINDS,
    Correction,
    parse,
    parse_list,
)
from variance_lab.corrections.tokenprob import (
    TOKEN_PROB_DEFAULT,
    TOKEN_PROB_TAIL,
    TokenProbability,
    band_kinks,
    components_of,
    integrate_logit,
    mask_bands,
    mask_given_q,
    prob_log_moments,
)
from variance_lab.corrections.weights import BOUND_RULE, apply_sequence, apply_tokens, log_base_tokens

__all__ = [
    "ASPO_DEFAULT",
    "ASPO_RULE",
    "BINNED_BY",
    "BIN_COLUMNS",
    "BOOTSTRAP_COLUMNS",
    "BOUND_RULE",
    "COLUMNS",
    "CORRECTIONS_MC_COLUMNS",
    "CORRECTIONS_PREDICTION_COLUMNS",
    "CORRECTION_KINDS",
    "CPPO_DEFAULT",
    "CPPO_POSITION_COLUMNS",
    "DATA_COLUMNS",
    "DPPO_KL_DEFAULT",
    "DPPO_KL_EPS",
    "DPPO_SIGNS",
    "DPPO_TV_DEFAULT",
    "ENTROPY_EDGES",
    "GMPO_DEFAULT",
    "GSPO_DEFAULT",
    "ICEPOP_DEFAULT",
    "KPOP_CLAMP",
    "KPOP_DEFAULT",
    "M2PO_BATCH",
    "M2PO_DEFAULT",
    "M2PO_RULE",
    "MAX_COUNT_TERMS",
    "MIN_ESS",
    "MIXTURE_TAIL_MASS",
    "N_BOOT",
    "OPSM_RULE",
    "POSITION_COLUMNS",
    "POSITION_MC_COLUMNS",
    "PREFIX_VARIANCE_COLUMNS",
    "PROB_KINDS",
    "PROB_RULE",
    "P_EDGES",
    "SIGNED_KINDS",
    "SIGNS",
    "SIGN_P_DEFAULT",
    "TAIL_MASS",
    "TOKEN_PROB_DEFAULT",
    "TOKEN_PROB_TAIL",
    "WEIGHT_COLUMNS",
    "Correction",
    "TokenProbability",
    "apply_prob",
    "apply_sequence",
    "apply_signed",
    "apply_tokens",
    "band_kinks",
    "batch_mask",
    "batch_masks",
    "binary_kl",
    "bucket_bootstrap",
    "check_advantages",
    "check_log_mu",
    "check_rollout_arrays",
    "clip_probability",
    "components_of",
    "cppo_limit",
    "cppo_mask",
    "cppo_positions",
    "ctpo_log_moments",
    "ctpo_positions",
    "evaluate",
    "expected_masked",
    "find_T",
    "fit_lognormal",
    "fraction_interval",
    "has_theory",
    "integrate_logit",
    "is_positive",
    "log_base_tokens",
    "log_phi_diff",
    "logit_shift",
    "m2po_cut",
    "mask_bands",
    "mask_by_bins",
    "mask_given_q",
    "opsm_keep",
    "parse",
    "parse_list",
    "position_weights",
    "prefix_variances",
    "prob_difference",
    "prob_log_moments",
    "prob_sides",
    "resolve_cut",
    "sign_label",
    "sign_log_moments",
    "signs",
    "simulate_corrections",
    "simulate_positions",
    "theory",
    "tv_tails",
]
