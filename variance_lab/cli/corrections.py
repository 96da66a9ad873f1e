"""``variance-lab corrections``: what TIS, masks, Geo-RS and the clips do to the weights, by length.

Closed forms for lognormal ratios (quadrature or exact sums for random-scale and
lognormal-mixture), Monte Carlo for every family (``--n``), or the corrections applied to the token
log-ratios of a rollout file (``--data``: per bucket, the modified fraction's 95 % interval beside
the fitted lognormal's prediction; ``--by p`` or ``--by entropy``: per bin of the token's sampler
probability or entropy instead). ``--find-T`` answers the one
question: from which length does a cap modify most (``--threshold``) of the sequences? The
probability-aware masks (``dppo-tv``, ``dppo-kl``, ``kpop``, ``cppo``) take the law of the token's
probability from ``--token-prob``; ``cppo`` (CPPO's position-weighted, cumulative-prefix mask) has no
closed form and needs ``--n`` (Monte Carlo) or ``--data``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from variance_lab import __version__
from variance_lab.cli._common import (
    CLIError,
    add_family_args,
    add_int_arg,
    add_output_args,
    add_ratio_arg,
    add_seed_arg,
    add_subcommand,
    family_from_args,
    float_arg,
    grid_arg,
    int_grid,
    load_rollouts,
    output_table,
)
from variance_lab.report import corrections_table as report

__all__ = ["add_command", "run"]

DEFAULT_CORRECTIONS = "seq-tis:3,seq-mask:3,icepop:5"


def _threshold(text: str) -> float:
    value = float_arg(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def _token_prob(text: str):
    """Parse ``--token-prob``: ``A:B`` (a Beta law of the token's probability) or ``Q`` (every token at Q)."""
    from variance_lab.corrections import TokenProbability

    parts = text.split(":")
    try:
        values = [float(v) for v in parts]
        if len(values) == 1:
            return TokenProbability.fixed(values[0])
        if len(values) == 2:
            return TokenProbability(*values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            str(exc) if "must" in str(exc) else f"not a number: {text!r}"
        ) from None
    raise argparse.ArgumentTypeError(f"expected A:B (a Beta law) or Q (a fixed probability), got {text!r}")


def _buckets(text: str | None, lengths):
    """Length ranges from edges ``a,b,c``: [a, b-1], [b, c-1], [c, max]; None: one bucket."""
    if text is None:
        return None
    edges = int_grid(text, name="--buckets", minimum=1)
    if edges != sorted(set(edges)) or edges[0] < 1:
        raise CLIError(f"--buckets {text!r}: expected increasing integers >= 1")
    top = max(int(lengths.max()), edges[-1])
    return [(a, b - 1) for a, b in itertools.pairwise(edges)] + [(edges[-1], top)]


def _family_text(family) -> str:
    extra = "".join(
        f", {k} = {v:g}" if isinstance(v, int | float) else f", {k} = {v}"  # a mixture's components are text
        for k, v in family.describe().items()
        if k not in ("family", "mu", "sigma2")
    )
    return f"{family.name}, mu = {family.mu:g}, sigma^2 = {family.sigma2:g}{extra}"


def _model(args, cs) -> tuple:
    from variance_lab import corrections

    family = family_from_args(args)
    T = int_grid(args.T, name="--T", minimum=1)
    lognormal = family.name == "lognormal"
    has_theory = family.name in ("lognormal", "random-scale", "lognormal-mixture")
    if not has_theory and args.n == 0:
        raise CLIError(
            f"--family {family.name}: closed forms exist for lognormal ratios only (quadrature for "
            "random-scale and lognormal-mixture); pass --n N (Monte Carlo)"
        )
    if args.n == 1 or args.n < 0:
        raise CLIError(f"--n must be 0 (theory only) or >= 2, got {args.n}")
    with_theory = [c for c in cs if corrections.has_theory(family, c)]
    if has_theory and args.n == 0 and len(with_theory) < len(cs):
        missing = ", ".join(c.spec for c in cs if c not in with_theory)
        raise CLIError(f"--family {family.name}: no theory for {missing}; pass --n N (Monte Carlo)")
    law = args.token_prob if args.token_prob is not None else corrections.TOKEN_PROB_DEFAULT
    try:
        frame = corrections.theory(family, T, with_theory, token_prob=law) if with_theory else None
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    source = {"lognormal": "closed form", "random-scale": "quadrature over the scale"}.get(family.name, "")
    if family.name == "lognormal-mixture":
        source = "closed form (token level) and multinomial sums (sequence level)"
    if not with_theory:  # every spec is Monte Carlo only
        source = ""
    notes = []
    if args.n:
        try:
            mc = corrections.simulate_corrections(family, T, cs, args.n, seed=args.seed, token_prob=law)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        if frame is None and has_theory:  # no spec has theory here (cppo): its columns stay, empty
            frame = _empty_theory()
        if frame is not None:  # specs without theory keep their Monte Carlo rows
            frame = frame.merge(mc, on=["T", "correction", "level"], how="right", validate="1:1")
            frame["method"] = frame["method"].fillna("Monte Carlo only")
        else:
            frame = mc
        notes.append(report.corrections_mc_notes(mc, args.n, args.seed))
        source = " and ".join(s for s in (source, f"Monte Carlo (n = {args.n:,}, seed {args.seed})") if s)
    if args.find_T:
        if not lognormal:
            raise CLIError("--find-T needs the closed form: --family lognormal")
        found = {c.spec: corrections.find_T(family, c, args.threshold, token_prob=law) for c in cs}
        # a sign-dependent spec's answer is its overall row's (the signs mixed); its sign rows get none
        frame["find_T"] = [found.get(s) for s in frame["correction"]]
        frame["find_T_threshold"] = float(args.threshold)
        lines = [
            report.find_T_line(
                c.spec,
                c.level,
                found[c.spec],
                args.threshold,
                _family_text(family),
                what="of the tokens at position T clipped" if c.kind == "ctpo" else None,
            )
            for c in cs
        ]
        notes.insert(
            0, "\n".join(["At what length does each correction start to modify most of the data?", *lines])
        )
    title = (
        f"Corrections of importance weights: {_family_text(family)}; {source} (variance_lab {__version__})"
    )
    if any(c.prob for c in cs):
        notes.append(
            f"dppo-tv, dppo-kl, kpop, cppo: the sampler's probability of each token: {law.label()}; the "
            "family is the law of the shift Y = logit pi - logit q of the token's log-odds, independent of "
            "q (variance_lab.corrections.tokenprob); the weight r = pi/q where kept, its theory by "
            "quadrature over q. DPPO's rows: A > 0 masks pi - q (or the binary KL) above the threshold, "
            "A <= 0 below; P(A > 0) is the spec's P."
            + (
                " cppo: Monte Carlo only (its budget couples the tokens of a sequence); its exact parts "
                "(position 1, the threshold delta / w_t alone, long sequences) are "
                "variance_lab.corrections.cppo_positions and cppo_limit."
                if any(c.kind == "cppo" for c in cs)
                else ""
            )
        )
    return frame, title, notes


def _empty_theory():
    """Return a theory frame with no rows: :data:`variance_lab.corrections.COLUMNS` in their dtypes."""
    import pandas as pd

    from variance_lab.corrections import COLUMNS

    text = ("correction", "level", "method")
    return pd.DataFrame(
        {c: pd.Series(dtype="int64" if c == "T" else object if c in text else float) for c in COLUMNS}
    )


def _data(args, cs) -> tuple:
    from variance_lab import corrections
    from variance_lab.rollouts.split import RATIO_LABELS, choose_ratio, ratio_batch

    batch = load_rollouts(args.data, on_bad=args.on_bad, preset=args.preset)
    ratio, ratio_note = choose_ratio(batch, args.ratio, name=Path(args.data).name)
    rb = ratio_batch(batch, ratio)
    log_r, label = rb.log_ratio, RATIO_LABELS[ratio]
    log_mu = rb.old_logp  # the ratio's denominator: the policy whose probabilities the masks compare with
    groups = batch.group_index() if batch.has_groups else None
    advantages, sign_note = _advantages(args, cs, batch)
    shift_model, shift_described = _shift_model(args, cs, log_r, log_mu)
    vcpo_row, vcpo_note = _vcpo(args, batch, log_r, ratio) if args.vcpo else (None, "")
    if args.by:
        return *_data_bins(
            args,
            cs,
            batch,
            log_r,
            log_mu,
            label,
            groups,
            advantages,
            (shift_model, shift_described),
            [ratio_note, sign_note, vcpo_note],
        ), vcpo_row
    model, described = _fitted_model(args.predict, log_r)
    frame = corrections.evaluate(
        log_r,
        batch.offsets,
        cs,
        buckets=_buckets(args.buckets, batch.lengths),
        predict=model,
        groups=groups,
        advantages=advantages,
        log_mu=log_mu if any(c.prob for c in cs) else None,
        shift_model=shift_model,
    )
    title = (
        f"Corrections on {args.data}: {len(batch):,} sequences, token ratio {label} "
        f"(variance_lab {__version__})"
    )
    if groups is None:
        how = (
            "Wilson's score interval for sequence-level corrections, a bootstrap over sequences "
            f"({corrections.N_BOOT:,} replicates, seed 0) for token-level ones and GMPO (where no token "
            "is modified, Wilson's [0, z^2 / (n + z^2)] with n the bucket's sequences); the file has no "
            "prompt_id, so sequences are taken as independent"
        )
        n_identical = batch.n_identical()
        if n_identical:
            how += (
                f" (but {n_identical:,} sequences repeat another's token log-probs: identical responses to "
                "one prompt? add a prompt_id field, or these intervals are too narrow)"
            )
    else:
        how = (
            f"a bootstrap over prompts ({int(groups.max()) + 1:,} prompts, "
            f"{corrections.N_BOOT:,} replicates, seed 0; a prompt's responses resampled together): "
            "Wilson's score interval at the effective size n / design effect for sequence-level "
            "corrections, percentiles for token-level ones and GMPO; where no token is modified, "
            "Wilson's [0, z^2 / (n + z^2)] with n the bucket's prompts"
        )
    notes = [
        "T: the bucket's median sequence length (the bucket's range of lengths is in the next column). "
        "E[w] [95% CI]: percentile bootstrap of the mean weight (never below 0). "
        f"frac. modified [95% CI]: {how}."
    ]
    if model is not None:
        inside = int(frame["pred_inside"].sum())
        predicted = int(frame["pred_frac_modified"].notna().sum())
        if any(c.prob for c in cs):
            described += _PROB_PREDICTION_NOTE + f" ({shift_described})"
        notes.append(
            f"predicted: {described}; sequence level: averaged over the bucket's lengths. The prediction "
            f"lies inside the interval in {inside} of {len(frame)} rows."
            + (
                f" Rows without a prediction (n/a: no theory in the model): {len(frame) - predicted}."
                if predicted < len(frame)
                else ""
            )
        )
    notes += batch.notes  # what the reader said about the file (a NeMo-RL dump's left-out samples)
    notes += [ratio_note] if ratio_note else []
    notes += [sign_note] if sign_note else []
    return frame, title, ["\n".join(notes), *([vcpo_note] if vcpo_note else [])], vcpo_row


def _vcpo(args, batch, log_r, ratio: str) -> tuple[dict, str]:
    r"""VCPO's numbers for the whole file as one minibatch: a JSON row and a note.

    The sequence weights are :math:`\log P_T` of the chosen ratio; the ESS ratio and both learning-rate
    factors are :func:`variance_lab.corrections.vcpo.ess_ratio` and ``lr_scale``; the baseline gain
    (:func:`~variance_lab.corrections.vcpo.baseline_gain`, :math:`\lVert g\rVert^2 = 1`) needs each
    record's ``reward`` and the prompts (``prompt_id``), else it is None and the note says why.
    """
    from variance_lab._jsonl import iter_jsonl
    from variance_lab.corrections import vcpo
    from variance_lab.ratios import segment_sums
    from variance_lab.rollouts.io import detect_format
    from variance_lab.rollouts.records import sequence_values

    log_w = segment_sums(log_r, batch.offsets)
    ess = vcpo.ess_ratio(log_w)
    row = {
        "correction": "vcpo",
        "ratio": ratio,
        "n_seq": len(batch),
        "ess_ratio": ess,
        "lr_scale_sqrt": vcpo.lr_scale(ess, rule="sqrt"),
        "lr_scale_linear": vcpo.lr_scale(ess, rule="linear"),
        "baseline_gain": None,
        "baseline_gain_note": "",
    }
    why = ""
    if args.preset is not None or detect_format(args.data) != "jsonl":
        why = "the rewards are read from the 'reward' field of JSONL records, and this is not a JSONL file"
    elif not batch.has_groups:
        why = "the file has no prompt_id (the baseline is per prompt group)"
    else:
        try:
            rewards = sequence_values((rec for _, rec in iter_jsonl(args.data)), "reward", batch)
        except ValueError as exc:
            why = f"no reward per record ({exc})"
        else:
            row["baseline_gain"] = vcpo.baseline_gain(rewards, log_w, batch.group_index())
            if row["baseline_gain"] != row["baseline_gain"]:
                why = "every prompt's rewards are equal, so no baseline matters"
    row["baseline_gain_note"] = why
    gain = f"{row['baseline_gain']:.4g}" if not why else f"none: {why}"
    note = (
        f"VCPO on the whole file as one minibatch of {len(batch):,} sequences (sequence weights P_T of "
        f"the {ratio} ratio; variance_lab.corrections.vcpo): ESS ratio (sum w)^2 / (N sum w^2) = {ess:.4g}; "
        f"learning-rate factor min(1, ESS)^(1/2) = {row['lr_scale_sqrt']:.4g} (scaling_rule sqrt, VCPO's "
        f"default), min(1, ESS) = {row['lr_scale_linear']:.4g} (linear); baseline gain of the min-variance "
        f"baseline over the group mean (||g||^2 = 1) = {gain}."
    )
    return row, note


#: What the prediction of the probability-aware masks is, on data.
_PROB_PREDICTION_NOTE = (
    "; for dppo-tv, dppo-kl and kpop, the mean over the tokens of each one's masked probability under the "
    "log-odds model (variance_lab.corrections.tokenprob) with the --predict model fitted to these tokens' "
    "shifts logit pi - logit mu, at the token's own mu and sign (none for cppo, whose budget couples a "
    "sequence's tokens)"
)


def _shift_model(args, cs, log_r, log_mu):
    """Fit the --predict model to the tokens' log-odds shifts (None with no probability-aware spec)."""
    import numpy as np

    from variance_lab import corrections

    if not any(c.prob for c in cs) or args.predict == "none":
        return None, ""
    y = corrections.logit_shift(log_mu + log_r, log_mu)
    finite = y[~np.isnan(y)]
    if finite.size < 2:
        return None, "fewer than two finite shifts: no prediction"
    model, described = _fitted_model(args.predict, finite)
    left = y.size - finite.size
    return model, described.replace("log-ratios", "log-odds shifts") + (
        f"; {left:,} tokens with a probability of exactly 1 left out, predicted never masked" if left else ""
    )


def _data_bins(args, cs, batch, log_r, log_mu, label, groups, advantages, shift, extra_notes) -> tuple:
    """Tabulate ``--data --by p|entropy``: the token-level masks per bin of the probability or entropy."""
    import numpy as np

    from variance_lab import corrections

    if args.by == "entropy":
        values = _token_field(args, batch, "entropy")
        what = "the entropy (nats) of the next-token distribution, the file's 'entropy' field"
    else:
        values = np.exp(log_mu)
        what = "p, the probability of the sampled token under the ratio's denominator (the sampler)"
    try:
        frame = corrections.mask_by_bins(
            log_r,
            batch.offsets,
            cs,
            values,
            args.bins,
            by=args.by,
            log_mu=log_mu if any(c.prob for c in cs) else None,
            advantages=advantages,
            groups=groups,
            ratio_model=_fitted_model(args.predict, log_r)[0],
            shift_model=shift[0],
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    title = (
        f"Masked fractions by {args.by} on {args.data}: {len(batch):,} sequences, {batch.n_tokens:,} tokens, "
        f"token ratio {label} (variance_lab {__version__})"
    )
    how = "prompts" if groups is not None else "sequences"
    notes = [
        f"Bins of {what}: [lo, hi), the last [lo, hi]. frac. modified [95% CI]: the fraction of the bin's "
        f"tokens masked, clipped or truncated; a bootstrap over {how} ({corrections.N_BOOT:,} replicates, "
        "seed 0, the bin's tokens of one sequence kept together). predicted: for a ratio mask the "
        "--predict model (lognormal with none) fitted to the log-ratios (the same in every bin)"
        + (_PROB_PREDICTION_NOTE + f" ({shift[1]})" if shift[1] else "")
        + "."
    ]
    notes += batch.notes
    notes += [n for n in extra_notes if n]
    return frame, title, ["\n".join(notes)]


def _token_field(args, batch, name: str):
    """One number per counted token from the JSONL records' per-token field ``name``."""
    from variance_lab._jsonl import iter_jsonl
    from variance_lab.rollouts.io import detect_format
    from variance_lab.rollouts.records import token_values

    if args.preset is not None or detect_format(args.data) != "jsonl":
        raise CLIError(
            f"--by {name}: read from the {name!r} field of JSONL records; {args.data} is not a JSONL file"
        )
    try:
        return token_values((rec for _, rec in iter_jsonl(args.data)), name, batch)
    except ValueError as exc:
        raise CLIError(f"{args.data}: {exc}") from None


def _advantages(args, cs, batch):
    """Each sequence's advantage from the file's ``advantage`` field, when a spec depends on its sign."""
    from variance_lab._jsonl import iter_jsonl
    from variance_lab.rollouts.io import detect_format
    from variance_lab.rollouts.records import sequence_values

    signed = [c.spec for c in cs if c.signed]
    if not signed:
        return None, ""
    if args.preset is not None or detect_format(args.data) != "jsonl":
        raise CLIError(
            f"--correction {signed[0]}: the advantages are read from the 'advantage' field of JSONL records; "
            f"{args.data} is not a JSONL rollout file"
        )
    try:
        adv = sequence_values((rec for _, rec in iter_jsonl(args.data)), "advantage", batch)
    except ValueError as exc:
        raise CLIError(f"{args.data}: {exc}") from None
    pos, zero = int((adv >= 0).sum()), int((adv == 0).sum())
    dppo = any(c.prob for c in cs if c.signed)
    cppo = any(c.kind == "cppo" for c in cs)
    return adv, (
        f"Signs: each sequence's 'advantage' field; {pos:,} of {adv.size:,} sequences have A >= 0 "
        f"(p = {pos / adv.size:.4g}; {zero:,} with A = 0 exactly, counted positive as TOPR and TRL do"
        + (", negative as DPPO's sources do (A > 0 masks the upper side)" if dppo else "")
        + ("; cppo never masks them, A (r - 1) = 0" if cppo else "")
        + f"), {adv.size - pos:,} A < 0. The P of a signed spec is the theory's and is not used on data; "
        "the predicted fractions are the fitted model's by sign."
    )


def _fitted_model(which: str, log_r):
    """Fit the model whose modified fractions are printed beside the data's; return it and its description."""
    from variance_lab import corrections
    from variance_lab.families import get_family
    from variance_lab.rollouts.models import fit_mixture

    if which == "lognormal":
        m = corrections.fit_lognormal(log_r)
        return m, (
            f"the lognormal fitted to these log-ratios (mean {m.mean_log:.4g}, variance {m.var_log:.4g}; "
            f"mu = {m.mu:.4g}, sigma^2 = {m.sigma2:.4g})"
        )
    if which == "mixture":
        fit = fit_mixture(log_r)
        comps = ", ".join(
            f"{w:.3g}:{m:.3g}:{v:.3g}" for w, m, v in zip(fit.weights, fit.means, fit.variances, strict=True)
        )
        return get_family("lognormal-mixture", components=fit.components), (
            f"the {fit.n_components}-component lognormal mixture fitted to these log-ratios by EM "
            f"(weight:mean:variance {comps})"
        )
    return None, ""


def run(args: argparse.Namespace) -> int:
    """Run ``variance-lab corrections``: tabulate the corrections for a model or a data file."""
    from variance_lab import corrections

    try:
        cs = corrections.parse_list(args.correction)
    except ValueError as exc:
        raise CLIError(f"--correction: {exc}") from None
    if args.by and not args.data:
        raise CLIError("--by needs --data FILE (the tokens to bin)")
    if args.vcpo and not args.data:
        raise CLIError("--vcpo needs --data FILE (the sequence weights of a minibatch)")
    if args.vcpo and args.format not in ("markdown", "json"):
        raise CLIError(f"--vcpo prints in --format markdown or json, not {args.format}")
    frame, title, notes, vcpo_row = _data(args, cs) if args.data else (*_model(args, cs), None)
    render = report.render_bins if args.data and args.by else report.render_corrections
    text = render(frame, args.format, title=title, notes="\n\n".join(notes))
    if vcpo_row is not None and args.format == "json":  # its own row after the others, their columns kept
        from variance_lab.report.table import json_text

        text = json_text([*json.loads(text), vcpo_row])
    return output_table(text, args.out)


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    from variance_lab.report.table import TABLE_FORMATS
    from variance_lab.rollouts.io import PRESET_NAMES

    p = add_subcommand(
        sub,
        "corrections",
        run,
        help="what TIS, masks, Geo-RS and the clips do to the weights, by length",
        description="Per (T, correction): the mean corrected weight, its bias against the uncorrected "
        "mean, its variance, Kong's ESS fraction and the fraction of sequences (sequence level) or tokens "
        "(token level) truncated, clipped or masked. Closed forms for lognormal ratios, quadrature or exact "
        "sums for random-scale and lognormal-mixture; Monte Carlo "
        "columns with intervals and a verdict with --n; measured token log-ratios with --data. "
        "Corrections: seq-tis:C, seq-mask:C, seq-mask:LO:HI, geo-rs:LO:HI, gspo[:EL:EH], tis:C, "
        "icepop[:B] (or icepop:LO:HI; alone [0.5, 5]), cispo:EPS (or cispo:EL:EH), ppo:EPS "
        "(or ppo:EL:EH), gmpo[:EPS], ctpo:EL:EH (CTPO: token t weighted by the prefix product, masked when "
        "its cumulative log-ratio leaves [-EL sqrt t, EH sqrt t]), m2po[:TAU[:B]] (M2PO: the largest "
        "(log r)^2 of each batch of B sequences masked until the mean of the rest is below TAU; "
        "default 0.04, B = 256; theory: the large-batch limit), topr[:P] (TOPR: weight 1 when the sequence's "
        "advantage A >= 0, min(P_T, 1) when A < 0), opsm:DELTA[:P] (DeepSeek-V3.2's off-policy mask: P_T, "
        "0 when A < 0 and the mean of -log r exceeds DELTA), aspo[:E|:EL:EH[:C[:P]]] (ASPO, per token: 1/r "
        "on [1/C, 1 + EH] when A >= 0, r on [1 - EL, C] when A < 0, C past 1/C or C, 0 past the clip; "
        "default 0.2, 0.2, 3); these three give rows by sign, in theory with "
        "P = P(A >= 0) (default 0.5) independent of the ratios, on --data with each record's 'advantage'. "
        "Probability-aware masks: dppo-tv[:D[:P]] (DPPO-Binary-TV: masked when A > 0 and pi - mu > D, or "
        "A <= 0 and pi - mu < -D; default 0.15), dppo-kl[:D[:P]] (the same sides with the binary KL "
        "D(mu||pi) > D; default 0.05), kpop[:D] (KPop: masked when either binary KL exceeds D; default "
        "0.1), cppo[:D[:WMIN[:DB[:P]]]] (CPPO: masked when A(r - 1) > 0 and w_t |pi - mu| > "
        "min(D, D + beta W_{t-1} - S_{t-1}), w_t falling from 1 to WMIN over the sequence, S_{t-1} the "
        "prefix's summed w_j |pi_j - mu_j|, W_{t-1} its summed w_j, beta = clamp(P90 of the sequence's "
        "|pi - mu|, DB, 2 DB); default 0.2, 0.8, 0.02; Monte Carlo or --data only); pi, mu are the "
        "token's probabilities under the ratio's numerator and denominator, P = P(A > 0); their theory "
        "needs --token-prob.",
    )
    add_family_args(p)
    p.add_argument(
        "--T",
        default="1,10,100,1000",
        help="sequence lengths, integers >= 1: a comma list or ranges as in sweep (1:1000:log4); 1e6 is "
        "accepted, 1.5 refused",
    )
    p.add_argument("--correction", default=DEFAULT_CORRECTIONS, help="comma list of correction specs")
    add_int_arg(p, "--n", minimum=0, default=0, help="Monte Carlo sequences; 0 = closed form only")
    add_seed_arg(p, "root seed of the Monte Carlo draws")
    p.add_argument(
        "--find-T",
        action="store_true",
        help="add the smallest T at which a correction modifies at least --threshold of the sequences "
        "(sequence level: truncated or masked; token level: with at least one modified token; ctpo: the "
        "first position whose token is clipped with probability >= --threshold), found by "
        "root-finding on the closed form",
    )
    p.add_argument("--threshold", type=_threshold, default=0.5, help="'most of the data' for --find-T")
    p.add_argument(
        "--data", default=None, metavar="FILE", help="evaluate on the token log-ratios of this file"
    )
    add_ratio_arg(p, "--data: the token ratio the corrections act on")
    p.add_argument("--buckets", default=None, help="--data: length bucket edges, e.g. 1,64,256")
    p.add_argument(
        "--predict",
        default="lognormal",
        choices=("lognormal", "mixture", "none"),
        help="--data: beside each observed modified fraction, the prediction of this model fitted to the "
        "same log-ratios (mixture: 1 to 3 lognormal components by EM and BIC), and whether it lies inside "
        "the 95%% interval",
    )
    p.add_argument(
        "--token-prob",
        type=_token_prob,
        default=None,
        metavar="A:B|Q",
        help="theory and Monte Carlo of dppo-tv, dppo-kl, kpop, cppo: the law of the sampler's probability "
        "of each token, Beta(A, B) or a fixed Q (default: variance_lab.corrections.TOKEN_PROB_DEFAULT, "
        "Beta(0.2, 0.6), fitted to the SmolLM2 sampler's tokens)",
    )
    p.add_argument(
        "--by",
        default=None,
        choices=("p", "entropy"),
        help="--data: the token-level masks per bin of p (the sampled token's probability under the "
        "ratio's denominator) or of the 'entropy' field, instead of per length bucket",
    )
    p.add_argument(
        "--bins",
        type=grid_arg("--bins"),
        default=None,
        help="--by: increasing bin edges (default: variance_lab.corrections.P_EDGES for p, "
        "ENTROPY_EDGES for entropy)",
    )
    p.add_argument(
        "--vcpo",
        action="store_true",
        help="--data: add VCPO's numbers for the whole file as one minibatch: the ESS ratio of the "
        "sequence weights of --ratio, its learning-rate factors (sqrt and linear) and the baseline gain of "
        "its min-variance baseline over the group mean (needs each record's reward and prompt_id); a note "
        "in markdown, its own row in json",
    )
    p.add_argument("--on-bad", default="raise", choices=("raise", "drop"), help="--data: bad sequences")
    p.add_argument(
        "--preset",
        default=None,
        choices=PRESET_NAMES,
        help="--data: a framework's dump (nemo-rl: train_data_step*.jsonl; prime-rl: "
        "token_exports/step_N/rank_R.jsonl; slime: the .pt of --save-debug-train-data)",
    )
    add_output_args(p, TABLE_FORMATS)
