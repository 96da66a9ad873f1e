r"""What a run on the pretrained model depends on: :class:`LMSettings`, and two standard sizes.

The settings of every ``variance-lab experiment run --model smollm2`` run (the ``--set`` keys),
checked when made (a bad one is named in a ``ValueError``); :mod:`~variance_lab.lm.runs`,
:mod:`~variance_lab.lm.paired` and :mod:`~variance_lab.lm.length` run them.
"""

from __future__ import annotations

from dataclasses import dataclass

from variance_lab._validate import check_positive
from variance_lab.experiment.settings import RunSettings, check_choices, check_integers
from variance_lab.lm.losses import AGGREGATIONS
from variance_lab.lm.task import KINDS, MATCHES, MAX_SHOTS, parse_strata

__all__ = ["LM_FULL", "LM_QUICK", "LM_SAMPLERS", "RUNS", "LMSettings"]

#: The runs (``--run``).
RUNS = ("onpolicy", "mismatch", "stale", "paired")
LM_SAMPLERS = ("fp32", "bf16", "fp16", "top-p")


@dataclass(frozen=True)
class LMSettings(RunSettings):
    """Everything a run depends on (with the model file and the versions).

    Attributes
    ----------
    run : {"onpolicy", "mismatch", "stale"}
    aggregation : {"gspo", "token-mean", "seq-mean-token-mean"}
        The loss of the update (every run takes one).
    sampler : {"fp32", "bf16", "fp16", "top-p"}
        ``onpolicy`` and ``stale`` need ``"fp32"``.
    precision_mode : {"auto", "native", "emulated"}
        How a 16-bit sampler computes (:func:`~variance_lab.lm.precision.low_precision_copy`).
    paired_base : {"bf16", "fp16", "fp32"}
        ``paired``: round theta_0's weights to it first (:func:`~variance_lab.lm.precision.round_weights`).
    seed : int
    n_prompts, group_size : int
        The data batch: ``n_prompts * group_size`` sequences.
    max_new_tokens : int
    temperature, top_p : float
    top_k : int
        ``top_p`` and ``top_k`` act only for ``sampler="top-p"``.
    lr : float
        AdamW's learning rate (no weight decay) for the one step; ``paired``: for every update.
    update_lr : float
        ``paired``: the rate of the measured update :math:`K` and the later ones (0: ``lr``), for
        a rate calibrated on another seed's run (:func:`~variance_lab.lm.paired.run_paired`).
    lags, train_prompts : int
        ``stale``: the largest lag :math:`K` and the prompts of each chain step; ``paired``: the
        largest staleness :math:`L` scored and the prompts of each update's minibatch.
    updates, samplers : int, str
        ``paired`` (:mod:`variance_lab.lm.paired`): the measured update :math:`K` of a persistent
        AdamW, and the samplers scored on the data batch's tokens (comma-separated, may be empty).
    length_strata : str
        ``paired``: when set (``LO-HI:K,...``, :func:`~variance_lab.lm.task.parse_strata`), the run
        samples a length batch of ``count`` requests by stratum from the same chain instead of its
        data batch (:func:`~variance_lab.lm.paired.run_length`); empty: the data batch.
    max_term, max_words, max_times, max_count : int
        The task's sizes (:func:`~variance_lab.lm.task.make_prompts`).
    kinds : str
        The task's kinds, comma-separated, cycled through in this order
        (:data:`~variance_lab.lm.task.KINDS`; ``count`` has long answers).
    match : {"exact", "contains"}
        The reward's mode (:func:`~variance_lab.lm.task.reward`).
    shots : {0, 1, 2, 3}
        Worked examples before each request (:func:`~variance_lab.lm.task.messages`).
    system : bool
        Start each conversation with :data:`~variance_lab.lm.task.SYSTEM`.
    sample_batch, score_batch : int
        Sequences per sampling batch and per scoring/training minibatch.
    threads : int
        PyTorch intra-op threads.
    digits : int
        Significant digits of the log-probs written (0: every digit of the float64).
    """

    run: str = "onpolicy"
    aggregation: str = "gspo"
    sampler: str = "fp32"
    precision_mode: str = "auto"
    paired_base: str = "bf16"
    seed: int = 0
    n_prompts: int = 256
    group_size: int = 4
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 0.9
    top_k: int = 50
    lr: float = 1e-6
    update_lr: float = 0.0
    lags: int = 3
    train_prompts: int = 32
    updates: int = 1
    samplers: str = "bf16,fp16,top-p"
    length_strata: str = ""
    kinds: str = "add,copy,repeat"
    max_count: int = 60
    max_term: int = 9
    max_words: int = 24
    max_times: int = 4
    match: str = "exact"
    shots: int = 3
    system: bool = True
    sample_batch: int = 64
    score_batch: int = 8
    threads: int = 2
    digits: int = 7

    def task_options(self) -> dict:
        """Return the keyword arguments of :func:`~variance_lab.lm.task.make_prompts` (sizes and kinds)."""
        names = ("max_term", "max_words", "max_times", "max_count")
        return {n: getattr(self, n) for n in names} | {"kinds": tuple(self.kinds.split(","))}

    @property
    def paired_samplers(self) -> tuple[str, ...]:
        """The ``samplers`` setting as a tuple (empty for ``""``)."""
        return (
            tuple(x.strip() for x in self.samplers.split(",") if x.strip())
            if isinstance(self.samplers, str)
            else ()
        )

    def __post_init__(self):
        """Check every setting, naming a bad one."""
        modes = ("auto", "native", "emulated")
        choices = {"run": RUNS, "aggregation": AGGREGATIONS, "sampler": LM_SAMPLERS, "precision_mode": modes}
        choices["paired_base"] = ("bf16", "fp16", "fp32")
        check_choices(self, choices | {"match": MATCHES})
        if self.run != "mismatch" and self.sampler != "fp32":
            raise ValueError(f"run {self.run!r} samples in fp32, got sampler={self.sampler!r}")
        sizes = ("n_prompts", "max_new_tokens", "train_prompts", "max_term", "max_words", "max_times")
        sizes += ("updates",)
        minimum = dict.fromkeys((*sizes, "sample_batch", "score_batch", "threads"), 1) | {"group_size": 2}
        check_integers(
            self,
            minimum
            | dict.fromkeys(("seed", "top_k", "digits", "shots"), 0)
            | {"lags": 0 if self.run == "paired" else 1, "max_count": 2},
        )
        if not isinstance(self.kinds, str) or any(k not in KINDS for k in self.kinds.split(",")):
            raise ValueError(
                f"kinds must name some of {', '.join(KINDS)} (comma-separated), got {self.kinds!r}"
            )
        unknown = [s for s in self.paired_samplers if s not in ("bf16", "fp16", "top-p")]
        if not isinstance(self.samplers, str) or unknown:
            raise ValueError(
                f"samplers must name some of bf16, fp16, top-p (comma-separated), got {self.samplers!r}"
            )
        for name in ("temperature", "lr"):
            check_positive(name, getattr(self, name))
        if self.length_strata:
            if self.run != "paired":
                raise ValueError(f"length_strata: only with run 'paired', got run {self.run!r}")
            parse_strata(self.length_strata)
        if self.update_lr != 0:  # 0: lr
            check_positive("update_lr", self.update_lr)
        if self.shots > MAX_SHOTS:
            raise ValueError(f"shots must be at most {MAX_SHOTS}, got {self.shots!r}")
        if not isinstance(self.system, bool):
            raise ValueError(f"system must be true or false, got {self.system!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.run == "stale" and self.n_prompts % (self.lags + 1):
            raise ValueError(
                f"stale: n_prompts={self.n_prompts} must be a multiple of lags + 1 = {self.lags + 1}"
            )


#: Full size: 256 prompts x 4 responses (1,024 sequences), up to 256 new tokens.
LM_FULL = LMSettings()
#: Seconds-to-minutes size: 8 prompts x 4, up to 32 new tokens, short tasks.
LM_QUICK = LMSettings(n_prompts=8, max_new_tokens=32, train_prompts=4, max_words=8)
