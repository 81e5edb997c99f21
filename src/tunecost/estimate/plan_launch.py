"""The launch recipe's view of a planned setup (`tunecost plan --emit`): `estimate.recipes.LaunchJob`."""

from __future__ import annotations

from tunecost.catalog.prices import price_catalog, prices_for
from tunecost.errors import TunecostError
from tunecost.estimate.estimators import sizing_seq_len
from tunecost.estimate.plan import Option
from tunecost.estimate.recipes import LAUNCH_QUANT_TYPES, LaunchJob
from tunecost.models.catalog import resolve_model
from tunecost.models.params import count_parameters
from tunecost.workload.job import FineTuneJob


def launch_job(
    option: Option,
    job: FineTuneJob,
    *,
    epochs: float,
    prices_file=None,
    model: str | None = None,
    dataset=None,
    fused_adamw: bool = False,
    base: tuple[str, dict] | None = None,
    max_steps: int | None = None,
) -> LaunchJob:
    """The recipe's view of the recommended `option` of `job`: every provider that rents its GPU as candidates.
    `model`: the hub id the user named (an instruct or re-uploaded checkpoint the catalog prices as its base);
    `dataset`: the data the user named (None: the recipe asks for it, not the default tunecost priced).
    The recipes launch data parallelism only: a TP/PP/CP/EP layout, selective or some-layers recomputation is a
    `TunecostError`; FP8 only LLaMA-Factory's recipe writes. `fused_adamw`: the plan priced torch's fused AdamW;
    `base`: (path, data) of the user's config of the target framework, whose other keys the recipe keeps;
    `max_steps`: the run's optimizer steps at the option's global batch, where it was given in steps."""
    setup, spec = option.setup, resolve_model(job.model)
    if setup.plan.degree > 1 or setup.plan.expert_parallel > 1:
        raise TunecostError(
            f"--emit: the recommended setup is {setup.plan.layout_name} (tensor/pipeline/context/expert parallel); "
            "the recipes launch data-parallel layouts only (ddp, fsdp1, fsdp2, hsdp, zero1-3, one GPU)"
        )
    switches = (
        ("selective recomputation", job.selective_recompute),
        ("some-layers recomputation", job.recompute_layers is not None),
        ("modules-to-save", bool(job.modules_to_save)),
    )
    missing = [what for what, on in switches if on]
    if missing:
        raise TunecostError(
            f"--emit: the launch recipes have no {' or '.join(missing)} switch; plan without it to emit one"
        )
    rented = [] if option.owned else prices_for(setup.gpu.name, price_catalog(prices_file), whole_nodes=True)
    weights_gb = 2 * count_parameters(spec).total / 1e9  # bf16 checkpoint files, downloaded once
    return LaunchJob(
        model=model if model and "/" in model else spec.hub_id or spec.name,
        method=job.method,
        lora_rank=job.lora.rank,
        lora_alpha=job.lora.alpha,
        lora_dropout=job.lora.dropout,
        lora_targets=job.lora.targets if job.method != "full" else (),
        quant_type=job.quant_type if job.quant_type in LAUNCH_QUANT_TYPES else "nf4",
        double_quant=job.double_quant,
        dtype=job.compute_dtype,
        fp32_params=job.fp32_params,
        gradient_checkpointing=job.gradient_checkpointing,
        attention=job.attention,
        optimizer=job.optimizer,
        packing=job.packing,
        torch_compile=job.torch_compile,
        liger_kernel=job.liger_kernel,
        fp8=job.fp8,
        seq_len=sizing_seq_len(job),  # the length the setup's memory was sized at
        micro_batch=setup.micro_batch,
        grad_accum=option.accumulation,
        epochs=epochs,
        max_steps=max_steps,
        dataset=dataset,
        gpu=setup.gpu.name,
        num_gpus=setup.plan.num_gpus,
        gpus_per_node=setup.plan.node_size,
        strategy=setup.plan.strategy,
        offload=option.offload,
        clouds=tuple(dict.fromkeys((p.provider, "") for p in rented)),
        disk_gb=int(max(100, 2 * weights_gb)),
        fused_adamw=fused_adamw,
        base=base[1] if base else {},
        base_path=base[0] if base else "",
    )
