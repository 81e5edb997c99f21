"""Option groups: options several commands share (the job, the stack, the GPU's memory, several GPUs), declared
once as a frozen dataclass of `Annotated` options and received by a command as one value."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from tunecost.cli import multi_options as multi
from tunecost.cli import options as cli
from tunecost.cli.common import err_console, stack_behaviour
from tunecost.cli.jobconfig import on_command_line
from tunecost.errors import TunecostError
from tunecost.units import memory_bytes_from_options

F = TypeVar("F", bound=Callable[..., Any])


def option_groups(func: F) -> F:
    """`func` as typer sees it: each parameter whose type is an option group stands for the group's fields (each
    an option with its default); a call packs them back into the group."""
    hints = get_type_hints(func, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for p in inspect.signature(func).parameters.values():
        kind = hints[p.name]
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=kind))
            continue
        field_hints = get_type_hints(kind, include_extras=True)
        fields = dataclasses.fields(kind)
        groups[p.name] = (kind, [f.name for f in fields])
        params += [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=field_hints[f.name])
            for f in fields
        ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        for name, (kind, names) in groups.items():
            kwargs[name] = kind(**{n: kwargs.pop(n) for n in names})
        return func(**kwargs)

    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """What is fine-tuned and how: the options `estimate`, `plan` and `memory` share."""

    model: cli.JobModel = None
    seq_len: cli.SeqLen = None
    lora_rank: cli.LoraRank = cli.DEFAULT_LORA_RANK
    lora_alpha: cli.LoraAlpha = cli.DEFAULT_LORA_ALPHA
    lora_dropout: cli.LoraDropout = 0.0
    lora_targets: cli.LoraTargets = None
    gradient_checkpointing: cli.GradientCheckpointing = None
    selective_recompute: cli.SelectiveRecompute = False
    recompute_layers: cli.RecomputeLayers = None
    attention: cli.Attention = "flash"
    packing: cli.Packing = "none"
    grad_accum: cli.GradAccum = None
    torch_compile: cli.TorchCompile = False
    liger_kernel: cli.LigerKernel = False
    optimizer: cli.Optimizer = "adamw"
    modules_to_save: cli.ModulesToSave = ""
    dtype: cli.Dtype = None
    fp32_params: cli.Fp32Params = False
    quant_type: cli.QuantType = None
    double_quant: cli.DoubleQuant = True
    stack: cli.Stack = cli.DEFAULT_STACK_NAME
    # FP8 training (docs/fp8.md)
    fp8: cli.Fp8 = "none"
    fp8_params: cli.Fp8Params = False

    def check_method(self, *methods: str) -> None:
        """Options given on the command line that none of `methods` takes are errors: --quant-type and
        --no-double-quant set qlora's base weights, the LoRA options an adapter that a full fine-tune does not have."""
        quant = {
            "quant_type": f"--quant-type {self.quant_type}",
            "double_quant": f"--{'' if self.double_quant else 'no-'}double-quant",
        }
        given = [flag for option, flag in quant.items() if on_command_line(option)]
        if given and "qlora" not in methods:
            raise TunecostError(
                f"{given[0]}: the base weights' type of --method qlora; --method {methods[0]} keeps them in the "
                f"compute dtype (drop {given[0].split()[0]}, or --method qlora)"
            )
        if self.fp32_params and set(methods) == {"qlora"}:
            raise TunecostError("--fp32-params: the model's weights in fp32; --method qlora stores them in 4 bits "
                                "(drop it, or --method full or lora)")  # fmt: skip
        check_lora_options(*methods)

    def estimate_job(
        self, model: str, method: str, data: Any = None, experts_per_token: int | None = None, *, rows: bool = False
    ) -> Any:
        """The job `estimate` and `plan` cost (`estimate.cost.estimate_job`), on `data`'s lengths when given.
        `rows`: the run is counted in steps or tokens, so a packed job needs no lengths (`_full_rows`)."""
        from tunecost.estimate.cost import estimate_job
        from tunecost.workload.job import parse_lora_targets, parse_names

        return estimate_job(
            model,
            method=method,
            experts_per_token=experts_per_token,
            dataset=data.name if data else None,
            seq_len=self.seq_len,
            lora_targets=parse_lora_targets(self.lora_targets) if self.lora_targets is not None else None,
            stack=self.stack,
            lengths=data.lengths if data else self._full_rows(rows),
            gradient_checkpointing=self.gradient_checkpointing,
            selective_recompute=self.selective_recompute,
            recompute_layers=self.recompute_layers,
            lora_rank=self.lora_rank,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            dtype=self.dtype,
            attention=self.attention,
            packing=self.packing,
            torch_compile=self.torch_compile,
            liger_kernel=self.liger_kernel,
            optimizer=self.optimizer,
            quant_type=self.quant_type,
            double_quant=self.double_quant,
            fp8=self.fp8,
            fp8_params=self.fp8_params,
            fp32_params=self.fp32_params and method != "qlora",  # plan's QLoRA jobs beside it store 4-bit weights
            modules_to_save=() if method == "full" else parse_names(self.modules_to_save),  # full trains them all
        ).with_(grad_accum=self.grad_accum or 1)

    def _full_rows(self, rows: bool) -> tuple[int, ...] | None:
        """Without the data, a packed job's rows as full ones, each counted as one query with attention over the
        whole row (an upper bound on per-document attention): only for a run counted in steps or tokens, whose
        rows do not depend on how many queries a row holds. Not the default dataset's lengths: not the user's."""
        if self.packing == "none":
            return None
        if not rows or self.seq_len is None:
            raise TunecostError(
                f"--packing {self.packing}: the queries a packed row holds come from the data's lengths; give "
                "--dataset (a data file, or a catalog dataset with a length statistic), or count the run in steps "
                "(--max-steps N), which needs no lengths"
            )
        err_console.print(
            f"assumed: packing without the data's lengths: each row {self.seq_len} tokens full, counted as one "
            "query, its attention over the whole row (an upper bound on attention within each query); --dataset "
            "gives the queries a row holds"
        )
        return (self.seq_len,)


_LORA_OPTIONS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "modules_to_save")


def check_lora_options(*methods: str) -> None:
    """LoRA options given on the command line beside only full fine-tunes are an error, not ignored."""
    lora = [o for o in _LORA_OPTIONS if on_command_line(o)]
    if lora and set(methods) == {"full"}:
        raise TunecostError(
            f"--{lora[0].replace('_', '-')}: an option of the LoRA adapter; --method full trains every weight and "
            "has none (drop it, or --method lora)"
        )


@dataclass(frozen=True, kw_only=True)
class StackFlags:
    """The stack's own switches (torchtune recipe options, re-entrant checkpointing)."""

    chunked_loss: cli.ChunkedLoss = False
    offload_activations: cli.OffloadActivations = False
    optimizer_in_backward: cli.OptimizerInBackward = False
    reentrant: cli.Reentrant = None
    fused_adamw: cli.FusedAdamw = None

    def behaviour(self, stack: str | None) -> Any:
        """The `StackBehaviour` these switches give on `stack` (the fields are `stack_behaviour`'s keywords)."""
        return stack_behaviour(stack, **dataclasses.asdict(self))


@dataclass(frozen=True, kw_only=True)
class GpuMemory:
    """Device memory given as a number instead of a catalog GPU."""

    gpu_memory_gb: cli.GpuMemoryGb = None
    gpu_memory_gib: cli.GpuMemoryGib = None

    def bytes_beside(self, gpu: str | None) -> int | None:
        """The memory in bytes (None: not given); an error beside a catalog `gpu`."""
        memory_bytes = memory_bytes_from_options(gpu_memory_gb=self.gpu_memory_gb, gpu_memory_gib=self.gpu_memory_gib)
        if gpu is not None and memory_bytes is not None:
            raise TunecostError("give --gpu or --gpu-memory-gb/--gpu-memory-gib, not both")
        return memory_bytes

    @property
    def name(self) -> str:
        return f"{self.gpu_memory_gb:g} GB" if self.gpu_memory_gb is not None else f"{self.gpu_memory_gib:g} GiB"


@dataclass(frozen=True, kw_only=True)
class MultiGpuOptions:
    """Several GPUs: the count, the layout and the links."""

    num_gpus: multi.NumGpus = None
    gpus_per_node: multi.GpusPerNode = None
    strategy: multi.Strategy = None
    max_gpus: multi.MaxGpus = None
    interconnect: multi.Interconnect = None
    expert_parallel: multi.ExpertParallel = None
    offload: multi.Offload = None
    tp: multi.TensorParallel = None
    pp: multi.PipelineParallel = None
    cp: multi.ContextParallel = None
    sequence_parallel: multi.SequenceParallel = None
    tp_impl: multi.TpImpl = None
    tp_comm_overlap: multi.TpCommOverlap = None
    micro_batches: multi.MicroBatches = None
    pipeline_schedule: multi.PipelineSchedule = None
    virtual_stages: multi.VirtualStages = None
    first_stage_less_layers: multi.FirstStageLess = None
    last_stage_less_layers: multi.LastStageLess = None
    first_stage_layers: multi.FirstStageLayers = None
    last_stage_layers: multi.LastStageLayers = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in dataclasses.astuple(self))


@dataclass(frozen=True, kw_only=True)
class Pricing:
    """Where prices come from."""

    provider: cli.Provider = None
    prices_file: cli.PricesFile = None


@dataclass(frozen=True, kw_only=True)
class RecordsOutput:
    """The answer as JSON on stdout, and records added to a run directory."""

    out: cli.RecordsOut = None
    force: cli.ReplaceRecords = False
    json_out: cli.JsonOut = False
