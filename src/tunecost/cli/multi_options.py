"""The several-GPU options of `estimate` and `plan`: the count, the layout and the links."""

from __future__ import annotations

from typing import Annotated

from tunecost.cli.options import MAX_EXPERTS, count_option, opt
from tunecost.limits import MAX_STAGE_LAYERS
from tunecost.workload.parallel import (
    MAX_SEARCH_GPUS,
    MULTI_GPU_STRATEGIES,
    PIPELINE_SCHEDULES,
    TP_IMPLS,
)

DEFAULT_GPUS_PER_NODE = 8
MAX_GPUS_PER_NODE = 1024
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
MAX_DEGREE = 1024
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
