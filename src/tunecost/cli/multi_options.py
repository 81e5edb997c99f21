"""The several-GPU options of `estimate` and `plan`: the count, the layout and the links."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from tunecost.cli.options import count_option, opt
from tunecost.errors import TunecostError
from tunecost.limits import MAX_DEGREE, MAX_EXPERTS, MAX_GPUS_PER_NODE, MAX_SEARCH_GPUS, MAX_STAGE_LAYERS, check_count
from tunecost.workload.parallel import (
    MULTI_GPU_STRATEGIES,
    PIPELINE_SCHEDULES,
    TP_IMPLS,
    ModelParallel,
)

if TYPE_CHECKING:
    from tunecost.cli.groups import MultiGpuOptions

NumGpus = Annotated[
    str | None, opt("--gpus", "Several GPUs: a number, or 'auto' for the fewest that fit and the cheapest setup.")
]
GpusPerNode = Annotated[
    int | None, count_option("--gpus-per-node", "Several GPUs: GPUs per node (default 8).", MAX_GPUS_PER_NODE)
]
Strategy = Annotated[
    str | None,
    opt("--strategy", "Several GPUs: " + ", ".join(MULTI_GPU_STRATEGIES) + ", or all (default; comma list)."),
]
MaxGpus = Annotated[
    int | None, count_option("--max-gpus", "--gpus auto: the most GPUs to consider (default 64).", MAX_SEARCH_GPUS)
]
Interconnect = Annotated[str | None, opt("--interconnect", "Several GPUs: the link inside a node (NVLink4, PCIe4...).")]
OFFLOAD_HELP = (
    "Several GPUs, CPU offload: none | optimizer (DeepSpeed zero1/2/3) | params (zero3 with the optimizer; FSDP's CPU "
    "offload for fsdp1/fsdp2)."
)
Offload = Annotated[str | None, opt("--offload", OFFLOAD_HELP)]
ExpertParallel = Annotated[
    int | None,
    count_option(
        "--expert-parallel", "Several GPUs, MoE: ranks that share the experts (divides experts, GPUs).", MAX_EXPERTS
    ),
]
TensorParallel = Annotated[int | None, count_option("--tp", "Several GPUs: tensor-parallel degree.", MAX_DEGREE)]
PipelineParallel = Annotated[int | None, count_option("--pp", "Several GPUs: pipeline stages.", MAX_DEGREE)]
ContextParallel = Annotated[int | None, count_option("--cp", "Several GPUs: context-parallel degree.", MAX_DEGREE)]
SequenceParallel = Annotated[
    bool | None,
    opt("--sequence-parallel/--no-sequence-parallel", "With --tp: Megatron's sequence parallelism (default on)."),
]
TpImpl = Annotated[str | None, opt("--tp-impl", "With --tp: whose TP, " + " | ".join(TP_IMPLS) + " (default first).")]
TP_OVERLAP_HELP = "With --tp: TP collectives overlapped with the GEMMs (Transformer Engine userbuffers; default off)."
TpCommOverlap = Annotated[bool | None, opt("--tp-comm-overlap/--no-tp-comm-overlap", TP_OVERLAP_HELP)]
MicroBatches = Annotated[
    int | None, count_option("--micro-batches", "With --pp: micro-batches per step (default: the stages).", 1 << 20)
]
PipelineSchedule = Annotated[
    str | None, opt("--pipeline-schedule", "With --pp: " + " | ".join(PIPELINE_SCHEDULES) + " (default 1f1b).")
]
VirtualStages = Annotated[
    int | None, count_option("--virtual-stages", "With --pipeline-schedule interleaved-1f1b: stages per rank.", 1024)
]
LESS_HELP = "With --pp: the layers the {} counts as where the stages deal the layers (default 1, torchtitan's)."
FirstStageLess = Annotated[
    int | None, count_option("--pp-first-stage-less-layers", LESS_HELP.format("embedding"), MAX_DEGREE, 0)
]
LastStageLess = Annotated[
    int | None, count_option("--pp-last-stage-less-layers", LESS_HELP.format("head"), MAX_DEGREE, 0)
]
FIXED_HELP = "With --pp: the decoder layers of the {} stage, the others dividing the rest evenly (Megatron's)."
FirstStageLayers = Annotated[
    int | None, count_option("--pp-first-stage-layers", FIXED_HELP.format("first"), MAX_STAGE_LAYERS)
]
LastStageLayers = Annotated[
    int | None, count_option("--pp-last-stage-layers", FIXED_HELP.format("last"), MAX_STAGE_LAYERS)
]


def model_parallel_option(options: MultiGpuOptions):
    """The TP/PP/CP layout the options give (None: none of them given)."""
    o = options
    given = (o.tp, o.pp, o.cp, o.micro_batches, o.pipeline_schedule, o.virtual_stages, o.sequence_parallel, o.tp_impl)
    split = (o.first_stage_less_layers, o.last_stage_less_layers, o.first_stage_layers, o.last_stage_layers)
    if all(v is None for v in (*given, o.tp_comm_overlap, *split)):
        return None
    tp = options.tp or 1
    if options.sequence_parallel and tp == 1:
        raise TunecostError("--sequence-parallel shards along the tensor-parallel group; it needs --tp 2 or more")
    return ModelParallel(
        tp=tp,
        pp=options.pp or 1,
        cp=options.cp or 1,
        sequence_parallel=tp > 1 and options.sequence_parallel is not False,
        tp_impl=(options.tp_impl or "torchtitan").strip().lower(),
        tp_comm_overlap=bool(options.tp_comm_overlap),
        micro_batches=options.micro_batches,
        pipeline_schedule=(options.pipeline_schedule or "1f1b").strip().lower(),
        virtual_stages=options.virtual_stages or 1,
        first_stage_less_layers=1 if options.first_stage_less_layers is None else options.first_stage_less_layers,
        last_stage_less_layers=1 if options.last_stage_less_layers is None else options.last_stage_less_layers,
        first_stage_layers=options.first_stage_layers,
        last_stage_layers=options.last_stage_layers,
    )


def parse_gpu_counts(text: str, gpus: list[str]) -> int | dict[str, int] | None:
    """--gpus: "auto" (a search up to --max-gpus), one number, or one per --gpu ("2,1" with --gpu RTX-4090,H100)."""
    from tunecost.catalog.gpus import resolve_gpu_name

    if text.strip().lower() == "auto":
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise TunecostError(f"--gpus must be a whole number, one per --gpu, or 'auto', got {text!r}")
    counts = []
    for part in parts:
        try:
            counts.append(check_count("--gpus", int(part), MAX_SEARCH_GPUS) or 0)
        except ValueError:
            raise TunecostError(f"--gpus must be a whole number or 'auto' (or one per --gpu), got {text!r}") from None
    if len(counts) == 1:
        return counts[0]
    if len(counts) != len(gpus):
        raise TunecostError(f"--gpus has {len(counts)} counts for {len(gpus)} GPUs; give one, or one per --gpu")
    names = [resolve_gpu_name(g).gpu.name for g in gpus]
    if len(set(names)) != len(names):
        raise TunecostError("--gpus with a count per GPU needs each --gpu once")
    return dict(zip(names, counts, strict=True))
