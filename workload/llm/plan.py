"""The parallelism plan: data (dp), tensor (tp), pipeline (pp), context (cp), expert (ep, etp) parallelism, the
pipeline schedule (virtual stages, uneven first and last stages), ZeRO stage, activation recompute and the
batch split. Ranks and communicator groups are in workload/llm/ranks.py.

Names follow Megatron-LM where it has one: ``vp`` is its virtual pipeline size (model chunks per stage, the
interleaved 1F1B schedule), ``first_stage_layers`` / ``last_stage_layers`` its
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, ``cp_comm_type`` its
``--cp-comm-type``, ``etp`` its ``--expert-tensor-parallel-size``, ``recompute`` its ``--recompute-granularity``
(none, selective: the attention core only, as Korthikanti et al.; full: the whole layer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workload.errors import InputError
from workload.llm.model import ModelConfig
from workload.llm.ranks import GROUP_DESCRIPTIONS, GROUP_KINDS, Group, RankMap

__all__ = ["DIMENSIONS", "GROUP_DESCRIPTIONS", "GROUP_KINDS", "Group", "ParallelPlan", "RankMap", "batch_split",
           "parse_pipeline_layout", "stage_layers"]

DIMENSIONS = ("tp", "dp", "pp")
RECOMPUTE = ("none", "selective", "full")
# Megatron-Core's recompute_modules the generator models (selective granularity; its default is core_attn)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe")
CP_COMM_TYPES = ("p2p", "all_gather", "a2a")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelPlan:
    """How one training iteration is split over ``dp * tp * pp * cp`` ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallelism; None = tp
    vp: int = 1
    zero_stage: int = 0
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    sequence_parallel: bool = False
    activation_recompute: bool = False  # = recompute "full" (kept for older callers)
    recompute: str = "none"
    recompute_modules: tuple[str, ...] = ()  # with selective recompute (none given: core_attn)
    cp_comm_type: str = "p2p"
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    account_for_embedding: bool = False  # the embedding takes a layer's place in the pipeline split
    account_for_loss: bool = False  # the output layer and loss take a layer's place in the pipeline split
    microbatch_group_size: int | None = None  # Megatron's microbatch_group_size_per_vp_stage; None = pp
    # transformer layers of every virtual stage in model order (stage 0 chunk 0, stage 1 chunk 0, ..., stage 0
    # chunk 1, ...): Megatron-Core's pipeline_model_parallel_layout (see parse_pipeline_layout)
    pipeline_layout: tuple[int, ...] | None = None
    pipeline_layout_mtp: int = 0  # the multi-token-prediction layers (m) the layout places
    layout: tuple[str, ...] = DIMENSIONS

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def global_batch(self) -> int:
        """Sequences per iteration."""
        return self.dp * self.micro_batch_size * self.num_micro_batches

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def recompute_mode(self) -> str:
        return "full" if self.activation_recompute else self.recompute

    @property
    def recomputed(self) -> frozenset[str]:
        """The modules selective recompute runs again in the backward (none without it)."""
        if self.recompute_mode != "selective":
            return frozenset()
        return frozenset(self.recompute_modules or ("core_attn",))

    @property
    def full_layout(self) -> tuple[str, ...]:
        """The layout with cp placed right after tp when the user's layout does not name it (Megatron's order)."""
        if "cp" in self.layout:
            return self.layout
        at = self.layout.index("tp") + 1 if "tp" in self.layout else 0
        return (*self.layout[:at], "cp", *self.layout[at:])

    @property
    def group_size(self) -> int:
        """Micro-batches per group of the interleaved schedule (Megatron's microbatch_group_size_per_vp_stage)."""
        return self.pp if self.microbatch_group_size is None else self.microbatch_group_size

    def padded_vocab(self, model: ModelConfig) -> int:
        """The vocabulary padded to a multiple of tp, as vocabulary-parallel embeddings need."""
        return -(-model.vocab_size // self.tp) * self.tp

    @property
    def accounted_layers(self) -> int:
        """Pipeline places the embedding and the loss take (Megatron-Core's account_for_embedding_in_pipeline_split
        and account_for_loss_in_pipeline_split)."""
        return int(self.account_for_embedding) + int(self.account_for_loss)

    def stage_layer_counts(self, num_layers: int) -> list[int]:
        """Transformer layers per pipeline stage: the given first and last stage counts and the rest split evenly
        (Megatron-LM); with the embedding and loss accounted, every virtual stage holds the same number of places
        and those two take one each; else stage_layers' split."""
        if self.accounted_layers or self.pipeline_layout is not None:
            return [sum(chunks) for chunks in self._virtual_layer_counts(num_layers)]
        first, last = self.first_stage_layers, self.last_stage_layers
        if first is None and last is None:
            return [len(stage_layers(num_layers, self.pp, s)) for s in range(self.pp)]
        rest, middle = num_layers - (first or 0) - (last or 0), self.pp - (first is not None) - (last is not None)
        per = rest // middle if middle else 0
        counts = [per] * self.pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return counts

    def _virtual_layer_counts(self, num_layers: int) -> list[list[int]]:
        """Transformer layers of every (stage, chunk)."""
        if self.pipeline_layout is not None:
            return [[self.pipeline_layout[c * self.pp + s] for c in range(self.vp)] for s in range(self.pp)]
        if self.accounted_layers:
            per = (num_layers + self.accounted_layers) // (self.pp * self.vp)
            counts = [[per] * self.vp for _ in range(self.pp)]
            counts[0][0] -= int(self.account_for_embedding)
            counts[-1][-1] -= int(self.account_for_loss)
            return counts
        return [[n // self.vp] * self.vp for n in self.stage_layer_counts(num_layers)]

    def chunk_layers(self, num_layers: int, stage: int, chunk: int) -> range:
        """The layers of model chunk ``chunk`` of ``stage``: with virtual stages, every stage's layers are split
        into ``vp`` chunks and the pipeline runs chunk 0 of every stage, then chunk 1, ... (Megatron-LM)."""
        counts = self._virtual_layer_counts(num_layers)
        start = sum(counts[s][c] for c in range(self.vp) for s in range(self.pp) if c * self.pp + s
                    < chunk * self.pp + stage)
        return range(start, start + counts[stage][chunk])

    def validate(self, model: ModelConfig) -> None:
        """Raise InputError (one line) if the plan cannot run ``model``."""
        for name in ("dp", "tp", "pp", "cp", "ep", "expert_tp", "vp", "micro_batch_size", "num_micro_batches",
                     "group_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                flag = {"expert_tp": "etp", "group_size": "microbatch_group_size"}.get(name, name)
                raise InputError(f"plan: {flag} must be a whole number >= 1 (got {value!r})")
        if self.zero_stage not in (0, 1, 2, 3):
            raise InputError(f"plan: the ZeRO stage must be 0, 1, 2 or 3 (got {self.zero_stage!r})")
        if sorted(self.layout) not in (sorted(DIMENSIONS), sorted((*DIMENSIONS, "cp"))):
            raise InputError(f"plan: the rank layout must order tp, dp and pp (and cp) (got {','.join(self.layout)})")
        if self.recompute not in RECOMPUTE:
            raise InputError(f"plan: recompute must be one of {', '.join(RECOMPUTE)} (got {self.recompute!r})")
        if self.activation_recompute and self.recompute not in ("none", "full"):
            raise InputError(f"plan: activation recompute (full) contradicts recompute {self.recompute}")
        unknown = sorted(set(self.recompute_modules) - set(RECOMPUTE_MODULES))
        if unknown:
            raise InputError(f"plan: recompute module(s) {', '.join(unknown)} not modelled; valid: "
                             f"{', '.join(RECOMPUTE_MODULES)}")
        if self.recompute_modules and self.recompute_mode != "selective":
            raise InputError("plan: recompute modules need selective recompute (--recompute selective; Megatron-Core "
                             "ignores them otherwise)")
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise InputError(f"plan: cp_comm_type must be one of {', '.join(CP_COMM_TYPES)} "
                             f"(got {self.cp_comm_type!r})")
        tokens_per_cp_rank = model.seq_len // self.cp
        checks = [
            (model.num_heads % self.tp == 0, f"{model.num_heads} attention heads are not divisible by tp={self.tp}"),
            (model.kv_heads % self.tp == 0,
             f"{model.kv_heads} key/value heads are not divisible by tp={self.tp}"),
            (model.ffn_hidden_size % self.tp == 0,
             f"FFN hidden size {model.ffn_hidden_size} is not divisible by tp={self.tp}"),
            (model.num_layers >= self.pp, f"{model.num_layers} layers cannot fill pp={self.pp} stages"),
            (self.etp is not None or self.cp > 1 or self.dp % self.ep == 0,
             f"ep={self.ep} does not divide dp={self.dp} (experts are sharded over data-parallel ranks)"),
            (model.num_experts % self.ep == 0,
             f"{model.num_experts} experts are not divisible by ep={self.ep}"),
            (not self.sequence_parallel or tokens_per_cp_rank % self.tp == 0,
             f"sequence length {model.seq_len} is not divisible by tp={self.tp}"
             + (f" x cp={self.cp}" if self.cp > 1 else "") + " (sequence parallelism)"),
        ]
        if "M" in model.layer_pattern:  # Megatron-Core splits the Mamba heads and their groups over tp
            checks += [(model.mamba_heads % self.tp == 0 and model.mamba_groups % self.tp == 0,
                        f"{model.mamba_heads} Mamba heads in {model.mamba_groups} groups are not divisible by "
                        f"tp={self.tp}"),
                       (self.cp == 1, "context parallelism in Mamba layers (Megatron-Core's all-to-all over cp) is "
                                      "not modelled; use cp=1")]
        if self.ep > 1 and not model.is_moe:
            raise InputError(f"plan for {model.name}: ep={self.ep} needs a mixture-of-experts model (--experts)")
        for ok, problem in checks:
            if not ok:
                raise InputError(f"plan for {model.name}: {problem}")
        self._validate_experts(model)
        self._validate_context(model)
        self._validate_pipeline(model)

    def _validate_experts(self, model: ModelConfig) -> None:
        etp, where = self.expert_tp, f"plan for {model.name}"
        if (self.tp * self.cp * self.dp) % (etp * self.ep):
            raise InputError(f"{where}: etp={etp} x ep={self.ep} does not divide tp={self.tp} x cp={self.cp} x "
                             f"dp={self.dp} (the expert layout shares the ranks of a stage)")
        if model.shared_expert_ffn % self.tp:
            raise InputError(f"{where}: shared expert FFN size {model.shared_expert_ffn} is not divisible by "
                             f"tp={self.tp}")
        if model.is_moe and model.ffn_hidden_size % etp:
            raise InputError(f"{where}: FFN hidden size {model.ffn_hidden_size} is not divisible by etp={etp}")
        if model.is_moe and etp != self.tp and self.tp > 1 and not self.sequence_parallel:
            raise InputError(f"{where}: etp={etp} differs from tp={self.tp}: the experts need the tokens split "
                             "over tensor-parallel ranks (--sequence-parallel, as Megatron-Core requires for MoE)")

    def _validate_context(self, model: ModelConfig) -> None:
        if self.cp == 1:
            return
        where = f"plan for {model.name}: cp={self.cp}"
        if model.window_size and model.window_size < model.seq_len:
            raise InputError(f"{where}: sliding-window attention (window {model.window_size}) with context "
                             "parallelism is not modelled (use cp=1)")
        if self.cp_comm_type == "a2a":
            heads, kv = model.num_heads // self.tp, model.kv_heads // self.tp
            if model.seq_len % self.cp or heads % self.cp or kv % self.cp:
                raise InputError(f"{where} with all-to-all (a2a) needs the sequence length {model.seq_len} and the "
                                 f"{heads} query and {kv} key/value heads per tensor-parallel rank divisible by cp")
        elif model.seq_len % (2 * self.cp):
            raise InputError(f"{where}: sequence length {model.seq_len} is not divisible by 2 x cp = {2 * self.cp} "
                             "(each rank holds two load-balanced chunks of every sequence)")

    def _validate_pipeline(self, model: ModelConfig) -> None:
        where = f"plan for {model.name}"
        first, last = self.first_stage_layers, self.last_stage_layers
        if self.pipeline_layout is not None:
            layout = self.pipeline_layout
            if first is not None or last is not None or self.accounted_layers:
                raise InputError(f"{where}: a pipeline layout contradicts first/last stage layer counts and "
                                 "accounting the embedding or loss in the split (it places them itself)")
            if self.pipeline_layout_mtp != model.mtp_layers:
                raise InputError(f"{where}: the pipeline layout places {self.pipeline_layout_mtp} multi-token-"
                                 f"prediction layer(s) (m); the model has {model.mtp_layers} (mtp_layers)")
            if len(layout) != self.pp * self.vp or sum(layout) != model.num_layers:
                raise InputError(f"{where}: the pipeline layout places {sum(layout)} layers in {len(layout)} virtual "
                                 f"stages; the plan has pp={self.pp} x vp={self.vp} and the model {model.num_layers} "
                                 "layers")
            if self.vp > 1:
                self._validate_interleaving(where)
            return
        if self.accounted_layers:
            places = model.num_layers + self.accounted_layers
            if first is not None or last is not None:
                raise InputError(f"{where}: first/last stage layer counts contradict accounting the embedding or "
                                 "loss in the pipeline split (Megatron-LM refuses both)")
            if places % (self.pp * self.vp):
                raise InputError(f"{where}: {model.num_layers} layers + {self.accounted_layers} (embedding/loss) do "
                                 f"not split evenly over pp={self.pp}" + (f" x vp={self.vp}" if self.vp > 1 else "")
                                 + " virtual stages")
            if self.vp > 1:
                self._validate_interleaving(where)
            return
        if first is not None or last is not None:
            given = [v for v in (first, last) if v is not None]
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in given):
                raise InputError(f"{where}: first/last stage layers must be whole numbers >= 0 (got {given})")
            if self.pp < 2:
                raise InputError(f"{where}: first/last stage layer counts need pp >= 2 (got pp={self.pp})")
            rest = model.num_layers - sum(given)
            middle = self.pp - len(given)
            if rest < 0 or (middle and rest % middle) or (not middle and rest):
                raise InputError(f"{where}: {model.num_layers} layers minus {sum(given)} on the first/last stage "
                                 f"do not split evenly over the other {middle} stages")
            if any(n < 1 for n in self.stage_layer_counts(model.num_layers)):
                raise InputError(f"{where}: every pipeline stage needs at least one layer "
                                 f"(got {self.stage_layer_counts(model.num_layers)})")
        if self.vp == 1:
            return
        counts = self.stage_layer_counts(model.num_layers)
        if self.pp > 1 and any(n % self.vp for n in counts):
            raise InputError(f"{where}: the layers per stage {counts} are not divisible by vp={self.vp} (every "
                             "model chunk holds the same number of layers; Megatron-Core's "
                             "--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split "
                             "count those as layers)")
        self._validate_interleaving(where)

    def _validate_interleaving(self, where: str) -> None:
        if self.pp < 2:
            raise InputError(f"{where}: virtual pipeline stages (vp={self.vp}) need pp >= 2")
        m, g = self.num_micro_batches, self.group_size
        if not self.pp <= g <= m:
            raise InputError(f"{where}: the interleaved schedule runs groups of {g} micro-batches, which must be "
                             f"between pp={self.pp} and the {m} micro-batches (raise --micro-batches)")
        if 0 < m % g < self.pp:
            raise InputError(f"{where}: {m} micro-batches leave a last group of {m % g} < pp={self.pp} (Megatron-LM "
                             "refuses it: it stalls the pipeline)")


def batch_split(dp: int, global_batch: int | None, micro_batch_size: int | None,
                micro_batches: int | None) -> tuple[int, int]:
    """(micro-batch size, micro-batches per iteration) from any two of global batch, micro-batch size and
    micro-batch count (micro-batch size defaults to 1); the three must agree: global = dp x size x count."""
    for name, value in (("--global-batch", global_batch), ("--micro-batch-size", micro_batch_size),
                        ("--micro-batches", micro_batches)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1 (got {value})")
    if global_batch is None:
        return micro_batch_size or 1, micro_batches or 1
    if micro_batch_size is None and micro_batches is not None:
        if global_batch % (dp * micro_batches):
            raise InputError(f"global batch {global_batch} is not divisible by dp={dp} x {micro_batches} "
                             "micro-batches")
        return global_batch // (dp * micro_batches), micro_batches
    size = micro_batch_size or 1
    if global_batch % (dp * size):
        raise InputError(f"global batch {global_batch} is not divisible by dp={dp} x micro-batch size {size}")
    count = global_batch // (dp * size)
    if micro_batches is not None and micro_batches != count:
        raise InputError(f"global batch {global_batch} = dp={dp} x micro-batch size {size} x {count} micro-batches, "
                         f"not {micro_batches}")
    return size, count


def parse_pipeline_layout(text: str) -> tuple[tuple[int, ...], int]:
    """Megatron-Core's pipeline_model_parallel_layout string, e.g. DeepSeek-V3's "Et*4|(t*4|)*14tmL": virtual
    stages in model order split by "|", each a run of E (the embedding; first stage only), t (a transformer layer),
    m (a multi-token-prediction layer; last stage only) and L (the loss; last stage only), with "x*N" and "(...)*N"
    repetitions. Returns the transformer layers per virtual stage and the multi-token-prediction layers."""
    expanded = text.replace(" ", "")
    while True:
        grown = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), expanded)
        grown = re.sub(r"([EtmL])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), grown)
        if grown == expanded:
            break
        expanded = grown
    stages = expanded.split("|")
    if not expanded or set(expanded) - set("EtmL|"):
        raise InputError(f"pipeline layout {text!r}: write virtual stages of E, t, m and L split by '|' (with x*N and "
                         "(...)*N repetitions)")
    if expanded.count("E") != 1 or not stages[0].startswith("E") or expanded.count("L") != 1 \
            or not stages[-1].endswith("L") or "m" in "".join(stages[:-1]) or "t" in stages[-1].partition("m")[2]:
        raise InputError(f"pipeline layout {text!r}: the embedding (E) must open the first virtual stage and the "
                         "loss (L), after any multi-token-prediction layers (m), close the last")
    return tuple(stage.count("t") for stage in stages), stages[-1].count("m")


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layers of pipeline ``stage``. Equal stages where pp divides the layers; otherwise every stage gets
    ceil(layers / pp) and the first and last stages, then the second and second-to-last, ..., one fewer each
    (they also hold the embedding and the output layer), as Llama 3 405B ran 126 layers on 16 stages."""
    per = -(-num_layers // pp)
    deficit = per * pp - num_layers
    order = [k for pair in zip(range(pp), range(pp - 1, -1, -1), strict=True) for k in pair]
    short = set(list(dict.fromkeys(order))[:deficit])
    counts = [per - (k in short) for k in range(pp)]
    start = sum(counts[:stage])
    return range(start, start + counts[stage])
