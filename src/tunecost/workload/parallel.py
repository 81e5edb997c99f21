"""How a job is spread over GPUs: a frozen, self-validating description (`FineTuneJob.parallel`)."""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.errors import TunecostError
from tunecost.workload.offload import check_offload

# strategy -> what it shards (P: parameters, G: gradients, O: optimizer states) across the data-parallel group
STRATEGIES = {
    "single": "",  # one GPU: nothing to shard
    "ddp": "",  # one full replica per rank; gradients all-reduced in buckets
    "fsdp2": "PGO",  # fully_shard, parameters resharded after forward
    "fsdp1": "PGO",  # torch FullyShardedDataParallel FULL_SHARD (accelerate's FSDP plugin): as fsdp2, plus `fsdp1`
    "fsdp2-shard-grad-op": "GO",  # reshard_after_forward=False: parameters stay unsharded until backward ends
    "hsdp": "PGO",  # fsdp2 within a node, replicated across nodes (gradients all-reduced between nodes)
    "zero1": "O",  # DeepSpeed ZeRO stage 1
    "zero2": "GO",  # DeepSpeed ZeRO stage 2
    "zero3": "PGO",  # DeepSpeed ZeRO stage 3
}
MULTI_GPU_STRATEGIES = tuple(s for s in STRATEGIES if s != "single")
# DeepSpeed's PipelineEngine asserts a ZeRO stage below 2: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
# parallelism" (deepspeed/runtime/pipe/engine.py)
NOT_WITH_PIPELINE = ("zero2", "zero3")
# pipeline schedule -> micro-batches whose activations the first stage holds at once (m: micro-batches, pp: stages,
# v: virtual stages per rank); torch.distributed.pipelining's names
PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
# whose tensor parallelism a layout runs: PyTorch's DTensor plan (torchtitan) or Megatron-LM's layers (NeMo)
TP_IMPLS = ("torchtitan", "megatron")
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default zero_optimization.reduce_bucket_size
DEFAULT_MAX_GPUS = 64  # --gpus auto: the most GPUs searched
DEFAULT_GPUS_PER_NODE = 8  # a node's GPUs where neither --gpus-per-node nor a multi-node config says


def config_node_size(per_node: int, nodes: int) -> dict[str, int]:
    """The `gpus_per_node` a launch config states: its GPUs per node where it spans nodes or fills more than a
    default node; none for one node, whose size it does not say (`--gpus 16` then fills default nodes)."""
    return {"gpus_per_node": per_node} if nodes > 1 or per_node > DEFAULT_GPUS_PER_NODE else {}


def split_note(first_less: int, last_less: int) -> str:
    """How the stages deal the decoder layers, for the notes of a layout priced with that split."""
    return (
        f"the decoder layers dealt over the stages with the embedding counted as {first_less} and the head as "
        f"{last_less} layer(s), the earlier stages taking one more where the stages do not divide them (torchtitan's "
        "pipeline_parallel_first/last_stage_less_layers, 1 and 1 by default; Megatron's 0 and 0, 1 each with "
        "account_for_embedding/loss_in_pipeline_split)"
    )


def effective_layers_per_stage(num_layers: int, num_stages: int, input_weight: int = 1, output_weight: int = 1) -> int:
    """The effective layers each pipeline stage holds at least, the embedding counted as `input_weight` layers and
    the head as `output_weight` (torchtitan's `generate_llm_fqn_per_model_part`); 0 where a stage would be left
    without layers."""
    per_stage = (num_layers + input_weight + output_weight) // num_stages
    return per_stage if per_stage >= max(input_weight, output_weight, 1) else 0


def fixed_stage_weights(num_layers: int, pp: int, first: int | None, last: int | None) -> tuple[int, int]:
    """Megatron's uneven pipeline (num_layers_in_first/last_pipeline_stage: `first` and `last` decoder layers,
    None where not set, the rest divided evenly over the other stages) as the two weights that make
    `pipeline.stage_layer_ids` deal the same: with k layers on the other stages, k - first and k - last."""
    others = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if rest < 0 or bool(rest) != bool(others) or (others and rest % others):
        raise TunecostError(
            f"{fixed_flags(first, last)} leave {rest} of the model's {num_layers} decoder layers to {others} other "
            "stage(s): Megatron needs them divided evenly"
        )
    k = rest // others if others else (last or 0)
    return k - (k if first is None else first), k - (k if last is None else last)


def fixed_flags(first: int | None, last: int | None) -> str:
    """The options that gave the first and last stages' layers, for errors."""
    given = ((first, "--pp-first-stage-layers"), (last, "--pp-last-stage-layers"))
    return " and ".join(f"{flag} {n}" for n, flag in given if n is not None)


def fixed_split_note(first: int | None, last: int | None) -> str:
    """How stages with the first and last stages' layers given deal the decoder layers (`split_note`'s twin)."""
    given = " and ".join(f"{n} layers on the {w} stage" for n, w in ((first, "first"), (last, "last")) if n is not None)
    return f"{given}, the other stages dividing the rest evenly (Megatron's num_layers_in_first/last_pipeline_stage)"


def empty_stage_message(num_layers: int, num_stages: int, weights: tuple[int, int]) -> str:
    """The error where `effective_layers_per_stage` is 0."""
    return (
        f"{num_stages} pipeline stages leave a stage without layers ({num_layers} layers, the embedding and the head "
        f"counted as {weights[0]} and {weights[1]})"
    )


def micro_batches_per_step(global_batch: int, micro_batch: int, data_parallel: int) -> int:
    """Megatron's micro-batches per optimizer step: global batch / (micro-batch x data-parallel ranks)."""
    if global_batch % (micro_batch * data_parallel):
        raise ValueError(
            f"{global_batch} is not a multiple of micro-batch {micro_batch} x data-parallel {data_parallel}"
        )
    return global_batch // (micro_batch * data_parallel)


def check_pipeline_strategy(strategy: str, pp: int) -> None:
    """DeepSpeed's ZeRO-2 and ZeRO-3 do not run beside pipeline parallelism: one error."""
    if pp > 1 and strategy in NOT_WITH_PIPELINE:
        raise TunecostError(
            f"{strategy} with --pp {pp}: DeepSpeed runs ZeRO-2 and ZeRO-3 without pipeline parallelism "
            "(its PipelineEngine asserts a stage below 2); use zero1, fsdp2 or ddp"
        )


def check_fsdp2_method(method: str, *, alternatives: str = "--method lora or full") -> None:
    """Refuse QLoRA where tunecost runs PyTorch's FSDP2 itself (the fake-process-group simulation of a rank and
    `tunecost profile --nproc-per-node`): FSDP2 shards 4-bit weights only when bitsandbytes stores them in a float
    dtype (`bnb_4bit_quant_storage`), which neither tunecost's 4-bit layer nor its profiling setup does yet."""
    if method == "qlora":
        raise TunecostError(
            "QLoRA under FSDP2 is not supported: sharding 4-bit weights needs bitsandbytes' float quant storage "
            f"(bnb_4bit_quant_storage), which tunecost neither models nor sets up yet; use {alternatives}"
        )


@dataclass(frozen=True, kw_only=True)
class ModelParallel:
    """The model-parallel part of a layout; `ParallelPlan` is one with its data-parallel part. `check` validates
    it (a `ParallelPlan` runs it when built).

    tp, pp, cp: tensor-, pipeline- and context-parallel degrees. sequence_parallel: Megatron's sequence parallelism
    inside the TP group. tp_impl: one of `TP_IMPLS` (with SP, Megatron keeps the column-parallel projections'
    inputs as sequence shards and gathers them again in backward). tp_comm_overlap: the TP collectives overlapped
    with the linears' GEMMs (Transformer Engine's userbuffers). micro_batches: pipeline micro-batches per step
    (None: pp); pipeline_schedule: one of `PIPELINE_SCHEDULES`, virtual_stages its stages per rank (interleaved
    only); first/last_stage_less_layers: the layers the embedding and the head count as where the stages deal the
    decoder layers (torchtitan's keys and defaults; `pipeline.stage_layer_ids`); first/last_stage_layers: the
    decoder layers of the first and last stages, the rest divided evenly over the others (Megatron's
    num_layers_in_first/last_pipeline_stage; they replace the two weights, `stage_weights`).
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    tp_impl: str = "torchtitan"
    tp_comm_overlap: bool = False
    micro_batches: int | None = None
    pipeline_schedule: str = "1f1b"
    virtual_stages: int = 1
    first_stage_less_layers: int = 1
    last_stage_less_layers: int = 1
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    @property
    def degree(self) -> int:
        """Ranks that hold one copy of the model between them: tp x pp x cp."""
        return self.tp * self.pp * self.cp

    def stage_weights(self, num_layers: int) -> tuple[int, int]:
        """The layers the embedding and the head count as where the pipeline stages deal the model's
        `num_layers` decoder layers (`fixed_stage_weights` where the first or last stage's layers are given)."""
        if self.first_stage_layers is None and self.last_stage_layers is None:
            return self.first_stage_less_layers, self.last_stage_less_layers
        return fixed_stage_weights(num_layers, self.pp, self.first_stage_layers, self.last_stage_layers)

    def split_text(self, num_layers: int) -> str:
        """How the stages deal the decoder layers, for the notes of a layout priced with this split."""
        if self.first_stage_layers is None and self.last_stage_layers is None:
            return split_note(*self.stage_weights(num_layers))
        return fixed_split_note(self.first_stage_layers, self.last_stage_layers)

    @property
    def num_micro_batches(self) -> int:
        """Pipeline micro-batches per step (one without a pipeline; pp when not given)."""
        if self.pp == 1:
            return 1 if self.micro_batches is None else self.micro_batches
        return self.pp if self.micro_batches is None else self.micro_batches

    def check(self, num_gpus: int | None = None) -> None:
        """One-line errors for degrees below 1 or (given `num_gpus`) whose product does not divide the GPUs, and
        for pipeline options that do not go together."""
        for name, degree in (("--tp", self.tp), ("--pp", self.pp), ("--cp", self.cp)):
            if degree < 1:
                raise TunecostError(f"{name}: the degree must be at least 1, got {degree}")
        if num_gpus is not None and num_gpus % self.degree:
            raise TunecostError(
                f"--tp {self.tp} x --pp {self.pp} x --cp {self.cp} = {self.degree} does not divide the {num_gpus} GPUs"
            )
        if self.sequence_parallel and self.tp == 1:
            raise TunecostError("--sequence-parallel shards along the tensor-parallel group; it needs --tp 2 or more")
        if self.tp_comm_overlap and self.tp == 1:
            raise TunecostError("--tp-comm-overlap overlaps the tensor-parallel collectives; it needs --tp 2 or more")
        if self.tp_impl not in TP_IMPLS:
            raise TunecostError(
                f"unknown tensor-parallel implementation {self.tp_impl!r}; supported: {', '.join(TP_IMPLS)}"
            )
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise TunecostError(
                f"unknown pipeline schedule {self.pipeline_schedule!r}; supported: {', '.join(PIPELINE_SCHEDULES)}"
            )
        if self.micro_batches is not None and self.micro_batches < 1:
            raise TunecostError(f"--micro-batches must be at least 1, got {self.micro_batches}")
        if (self.micro_batches or 1) > 1 and self.degree == 1:  # `timing.step_time` times one micro-step
            raise TunecostError(
                f"--micro-batches {self.micro_batches}: micro-batches per step are a TP/PP/CP layout's; a "
                "data-parallel layout accumulates them with --grad-accum"
            )
        fixed = [n for n in (self.first_stage_layers, self.last_stage_layers) if n is not None]
        if fixed and (min(fixed) < 1 or self.pp == 1 or self.virtual_stages > 1):
            raise TunecostError(
                f"{fixed_flags(self.first_stage_layers, self.last_stage_layers)}: at least 1 each, with --pp 2 or "
                "more and no virtual stages (tunecost does not model them with a virtual pipeline)"
            )
        if min(self.first_stage_less_layers, self.last_stage_less_layers) < 0:
            raise TunecostError(
                "--pp-first-stage-less-layers and --pp-last-stage-less-layers must be at least 0, got "
                f"{self.first_stage_less_layers} and {self.last_stage_less_layers}"
            )
        if self.virtual_stages < 1 or (self.virtual_stages > 1 and self.pipeline_schedule != "interleaved-1f1b"):
            raise TunecostError(
                f"virtual pipeline stages {self.virtual_stages}: at least 1, and above 1 only with interleaved-1f1b"
            )
        if self.pipeline_schedule == "interleaved-1f1b" and self.num_micro_batches % self.pp:
            raise TunecostError(
                f"interleaved-1f1b needs --micro-batches ({self.num_micro_batches}) a multiple of --pp {self.pp}"
            )

    def check_model(
        self, *, num_heads: int, num_kv_heads: int, num_layers: int, seq_len: int, even_layers: bool = True
    ) -> None:
        """One-line errors for degrees the model or the sequence cannot be split by (Megatron's and torchtitan's
        rules: heads and key-value heads by tp, layers by pp x virtual stages unless `even_layers` is False (a
        run that deals them unevenly: then no stage may be left without layers), the sequence by cp and, with
        sequence parallelism, by tp)."""
        sequence = "{} tokens of the job's sequence (--seq-len)"
        checks = [
            ("--tp", self.tp, "the model's {} attention heads", num_heads),
            ("--tp", self.tp, "the model's {} key-value heads", num_kv_heads),
            (
                f"--pp {self.pp} x {self.virtual_stages} virtual stages" if self.virtual_stages > 1 else "--pp",
                self.pp * self.virtual_stages,
                "the model's {} decoder layers",
                num_layers,
            ),
            ("--cp", self.cp, sequence, seq_len),
        ]
        if self.sequence_parallel:
            checks.append(("--sequence-parallel (--tp)", self.tp, sequence, seq_len))
        weights = self.stage_weights(num_layers)
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            even_layers = False  # the stages hold the layers the plan gives them
        if not even_layers:
            option, stages = checks.pop(2)[:2]
            if stages > 1 and not effective_layers_per_stage(num_layers, stages, *weights):
                label = option if " x " in option else f"{option} {stages}"
                raise TunecostError(f"{label}: {empty_stage_message(num_layers, stages, weights)}")
        for option, degree, what, count in checks:
            if degree > 1 and count % degree:
                label = option if " x " in option else f"{option} {degree}"
                raise TunecostError(f"{label} does not divide {what.format(count)}")


@dataclass(frozen=True, kw_only=True)
class _DataParallel:
    """`ParallelPlan`'s own fields, in a base after `ModelParallel` so that they come first (repr, asdict, JSON)."""

    num_gpus: int = 1
    gpus_per_node: int | None = None
    strategy: str = "single"
    expert_parallel: int = 1
    offload: str = "none"
    reduce_bucket_elements: int = DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    overlap_comm: bool = False


@dataclass(frozen=True, kw_only=True)
class ParallelPlan(ModelParallel, _DataParallel):
    """A data-parallel (optionally expert-, tensor-, pipeline- and context-parallel) layout; the default is one GPU.

    num_gpus: ranks in total.
    gpus_per_node: ranks per node (collectives across nodes use the inter-node link); None: all on one node.
    strategy: one of `STRATEGIES` ("single" for one GPU).
    expert_parallel: expert-parallel degree for MoE models (1: every rank holds every expert); it must divide
        the number of GPUs and, checked by `check_experts`, the number of experts.
    offload: DeepSpeed ZeRO CPU offload: "none", "optimizer" (zero1/2/3) or "params" (zero3; parameters and
        optimizer), see `offload`.
    reduce_bucket_elements, overlap_comm: DeepSpeed ZeRO-1/2's `zero_optimization.reduce_bucket_size` and
        `overlap_comm` (its defaults: 5e8 elements, off): the gradient buckets each backward allocates, two with
        overlap_comm.
    tp, pp, cp, sequence_parallel, tp_impl, tp_comm_overlap, micro_batches, pipeline_schedule, virtual_stages,
        first_stage_less_layers, last_stage_less_layers, first_stage_layers, last_stage_layers:
        `ModelParallel`'s; the
        data-parallel group is the rest (`dp` = num_gpus / (tp x pp x cp)), and `strategy` shards over it.
    """

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise TunecostError(f"number of GPUs must be at least 1, got {self.num_gpus}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise TunecostError(f"GPUs per node must be at least 1, got {self.gpus_per_node}")
        if self.num_gpus > self.node_size and self.num_gpus % self.node_size:
            raise TunecostError(
                f"{self.num_gpus} GPUs cannot be split into whole nodes of {self.node_size} GPUs; "
                f"use a multiple of {self.node_size} (or --gpus-per-node for nodes of another size)"
            )
        if self.strategy not in STRATEGIES:
            raise TunecostError(f"unknown strategy {self.strategy!r}; supported: {', '.join(STRATEGIES)}")
        self.check(self.num_gpus)
        if self.strategy == "single" and self.dp != 1:
            raise TunecostError(
                f"a job on {self.num_gpus} GPUs needs a multi-GPU strategy ({', '.join(MULTI_GPU_STRATEGIES)}), "
                "not 'single'"
            )
        if self.expert_parallel < 1 or self.dp % self.expert_parallel:
            where = f"the {self.num_gpus} GPUs" if self.dp == self.num_gpus else f"the data-parallel degree {self.dp}"
            raise TunecostError(f"expert-parallel degree {self.expert_parallel} must be at least 1 and divide {where}")
        check_offload(self.offload, self.strategy)
        check_pipeline_strategy(self.strategy, self.pp)
        if self.reduce_bucket_elements < 1:
            raise TunecostError(f"reduce_bucket_size must be at least 1 element, got {self.reduce_bucket_elements}")

    @property
    def layout_name(self) -> str:
        """The strategy, preceded by the model- and expert-parallel degrees above 1 ("tp8+sp pp2 fsdp2", "ep8
        zero1"; "tp8 pp2" when the data-parallel degree is 1 and the strategy shards nothing)."""
        parts = [f"tp{self.tp}{'+sp' if self.sequence_parallel else ''}"] if self.tp > 1 else []
        parts += [f"pp{self.pp}"] if self.pp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.expert_parallel}"] if self.expert_parallel > 1 else []
        if not parts or self.dp * self.cp > 1 or self.strategy.startswith("zero") or self.offload != "none":
            parts.append(self.strategy)
        return " ".join(parts)

    @property
    def dp(self) -> int:
        """The data-parallel degree: the ranks `strategy` replicates or shards over."""
        return self.num_gpus // self.degree

    @property
    def micro_batch_slots(self) -> int:
        """The micro-batches a step takes at accumulation 1, among which a global batch is shared: one per
        data-parallel rank and pipeline micro-batch (TP and CP ranks share theirs: `setups.evaluate_setup`)."""
        return self.dp * self.num_micro_batches

    @property
    def num_reduce_buckets(self) -> int:
        """DeepSpeed ZeRO-1/2's gradient buckets per backward: two with overlap_comm (double buffering), else one."""
        return 2 if self.overlap_comm else 1

    @property
    def node_size(self) -> int:
        """GPUs per node, with None read as every GPU on one node."""
        return self.num_gpus if self.gpus_per_node is None else self.gpus_per_node

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.num_gpus // self.node_size))

    @property
    def intra_node(self) -> bool:
        """True when every rank sits in one node (collectives stay on the node's link)."""
        return self.num_gpus <= self.node_size

    def check_experts(self, num_experts: int) -> None:
        """Raise when the expert-parallel degree does not divide the model's experts."""
        if self.expert_parallel > 1 and (num_experts < 1 or num_experts % self.expert_parallel):
            raise TunecostError(
                f"expert-parallel degree {self.expert_parallel} does not divide the model's {num_experts} experts"
            )
