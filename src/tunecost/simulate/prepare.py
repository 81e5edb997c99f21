"""Turn a `FineTuneJob` into a ready-to-step model: built from the config (meta device, then empty fake CPU
tensors; or real random CPU tensors for measurements), frozen, quantized and LoRA-wrapped per the method and the
software stack (`STACKS`; `hf2024` for the paper's), with its recomputation and an optimizer whose states already
exist (a steady-state step)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tunecost.errors import TunecostError
from tunecost.models.anatomy import (
    ATTENTION_NAMES,
    FEED_FORWARD_NAMES,
    decoder_layers,
    layer_part,
    layer_pattern,
    router_name,
)
from tunecost.models.build import build_model
from tunecost.models.catalog import ModelSpec, resolve_model
from tunecost.models.families import GATED_DELTA_FAMILIES, MAMBA2_FAMILIES, SUPPORTED_FAMILIES
from tunecost.simulate.behaviour import (
    DEFAULT_BEHAVIOUR,
    LOSS_TRL_CHUNKED,
    TORCHTUNE_LOSS_CODES,
    StackBehaviour,
    autocast_attention,
    cast_norms_fp32,
    install_autocast_boundaries,
    stack_adamw_impl,
)
from tunecost.simulate.checkpointing import enable_checkpointing
from tunecost.simulate.fused_attention import (
    falcon_fused_attention,
    fused_attention_dropout,
    mask_free_sdpa,
    recomputed_attention,
)
from tunecost.simulate.gated_delta import install_gated_delta_kernels
from tunecost.simulate.hf2024 import Loop2024Experts
from tunecost.simulate.liger import install_liger
from tunecost.simulate.mamba2 import install_mamba2_kernels
from tunecost.simulate.modules import ModulesToSave, SimExperts, SimLinear, SimLoraRouter
from tunecost.simulate.quant4bit import QuantSpec
from tunecost.simulate.recorder import LayerPlan
from tunecost.simulate.step import optimizer_state_tensors, simulated_optimizer, warm_up_optimizer
from tunecost.simulate.tensor_groups import module_info, static_tensors, to_fake
from tunecost.workload.job import FineTuneJob
from tunecost.workload.liger import liger_loss_applies, liger_patches

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Prepared:
    """A model ready for `step.run_step`, with what the recorder needs to know about it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    trainable: list[nn.Parameter]
    fake_mode: Any  # FakeTensorMode or None (real tensors)
    plan: LayerPlan
    module_info: dict[int, tuple[str, int | None]]
    static: list[tuple[torch.Tensor, str, str]]  # (tensor, category, module group)
    spec: ModelSpec
    stack: str
    is_moe: bool
    num_experts: int
    top_k: int
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR
    liger_loss: bool = False  # the loss is Liger's fused linear cross-entropy on the last hidden states
    autocast: torch.dtype | None = None  # forward and loss under torch.autocast in this dtype (fp32 parameters)
    batch_lines: dict = field(default_factory=dict)  # (length, granule) -> `batch_line.BatchLine` of its steps


def autocast_dtype(job: FineTuneJob) -> torch.dtype | None:
    """The dtype torch.autocast computes a job with fp32 weights in (None: no autocast over its weights)."""
    return TORCH_DTYPES[job.compute_dtype] if job.fp32_params else None


def check_supported(job: FineTuneJob, spec: ModelSpec, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR) -> None:
    """Raise a one-line TunecostError naming exactly what is unsupported."""
    stack = job.stack  # one of STACKS: `FineTuneJob` checks it
    if job.fp32_params and (spec.family == "blackmamba" or job.stack_spec.torchtune_recipes):
        raise TunecostError(f"--fp32-params: torch AMP over fp32 weights is simulated on the HF stacks, not "
                            f"{spec.family if spec.family == 'blackmamba' else 'stack ' + stack}")  # fmt: skip
    if job.fp32_params and job.method == "lora" and spec.is_moe:
        raise TunecostError(f"{spec.name}: LoRA over fp32 weights (--fp32-params) is simulated for dense models")
    if spec.family not in SUPPORTED_FAMILIES:
        raise TunecostError(
            f"{spec.name}: architecture {spec.family!r} is not supported by the step simulator; "
            f"supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    if job.seq_len is not None or job.lengths:
        spec.check_seq_len(job.worst_case_seq_len)
    if spec.family == "falcon" and spec.config.get("alibi") and job.attention != "eager":
        raise TunecostError(
            f"{spec.name}: Falcon with ALiBi adds a (B, heads, L, L) bias to its attention, which the fused-attention "
            "simulation leaves out; simulate it with --attention eager"
        )
    if job.selective_recompute and spec.family in ("blackmamba", "falcon"):
        raise TunecostError(f"{spec.name}: selective recomputation is not simulated for {spec.family}'s attention")
    if spec.family == "blackmamba" and job.method != "full":
        raise TunecostError(
            f"{spec.name}: the step simulator supports BlackMamba full fine-tuning only (as the "
            f"paper), not {job.method}"
        )
    if job.method != "full":
        targets = set(job.lora.targets)
        if not spec.is_moe and targets & {"experts", "router"}:
            bad = ", ".join(sorted(targets & {"experts", "router"}))
            raise TunecostError(
                f"LoRA target(s) {bad} do not apply to {spec.name}: it is a dense model with no MoE "
                f"layers; use --lora-targets attention,mlp"
            )
    if job.base_quant == "gptq" and job.gptq_kernel == "torch" and spec.is_moe:
        raise TunecostError("the torch GPTQ kernel path is modelled for dense layers; use gptq_kernel triton-v2")
    if job.base_quant == "int8" and spec.is_moe:
        raise TunecostError(
            f"{spec.name}: 8-bit (LLM.int8) base weights are simulated for dense models; use --quant-type nf4"
        )
    own = job.stack_spec
    if job.base_quant == "int8" and not own.int8_lora:
        raise TunecostError(f"stack {stack} has no 8-bit (LLM.int8) LoRA; use --quant-type nf4 or --stack hf-peft")
    if job.base_quant == "gptq" and not own.gptq:
        raise TunecostError(f"stack {stack} ran QLoRA on bitsandbytes 4-bit weights, not GPTQ")
    if job.method == "qlora" and job.compute_dtype == "fp32" and not own.fp32_qlora:
        raise TunecostError(f"stack {stack} ran QLoRA with bf16 compute only; use --dtype bf16 or the tunecost stack")
    offload_elsewhere = behaviour.activation_offload and not own.activation_offload
    torchtune_only = offload_elsewhere or behaviour.optimizer_in_backward
    if (torchtune_only or behaviour.loss_code in TORCHTUNE_LOSS_CODES) and not own.torchtune_recipes:
        raise TunecostError(
            f"torchtune's loss, activation offload and optimizer in backward are simulated under stack torchtune, "
            f"not {stack}"
        )
    if behaviour.loss_code == LOSS_TRL_CHUNKED and (not own.trl_chunked_loss or job.liger_kernel):
        raise TunecostError(f"TRL's chunked_nll runs under stack hf-peft without Liger, not {stack}")
    if behaviour.loss_code == LOSS_TRL_CHUNKED and "lm_head" in job.modules_to_save:
        raise TunecostError(
            "TRL's chunked_nll reads the head's own weight: not modelled with lm_head in modules_to_save"
        )
    if own.transformers_models_only and spec.family == "blackmamba":
        raise TunecostError(f"{spec.name}: stack {stack} is simulated for transformers' model families")
    if behaviour.kbit_fp32_norms and (job.method != "qlora" or job.attention == "eager"):
        raise TunecostError(
            "prepare_model_for_kbit_training's fp32 norms are simulated for QLoRA with flash or SDPA attention only"
        )


def _swap_linears(
    parent: nn.Module,
    *,
    quant: QuantSpec | None,
    lora: tuple[int, float] | None,
    style: str,
    skip: tuple[str, ...] = (),
    dropout: float = 0.0,
    only: tuple[str, ...] | None = None,
    autocast: torch.dtype | None = None,
) -> None:
    """Quantize (`quant`) every linear under `parent` and give it LoRA (`lora`: rank, alpha), or, with `only`, give
    LoRA to the linears of those names only; `autocast`: the dtype fp32 weights compute in."""
    for name, child in list(parent.named_children()):
        if name in skip:
            continue
        # nn.Linear, or a subclass computing the same x W^T + b (Falcon's FalconLinear); PEFT wraps both alike
        if isinstance(child, nn.Linear):
            rank, alpha = lora if lora and (only is None or name in only) else (None, 0.0)
            # torchtune builds its LoRA model under the compute dtype as the default dtype: adapters in bf16
            lora_dtype = child.weight.dtype if style == "torchtune" else torch.float32
            sim = SimLinear(
                child,
                quant=quant,
                lora_rank=rank,
                lora_alpha=alpha,
                lora_dtype=lora_dtype,
                style=style,
                lora_dropout=dropout,
                compute_dtype=autocast,
            )
            setattr(parent, name, sim)
        else:
            _swap_linears(child, quant=quant, lora=lora, style=style, dropout=dropout, only=only, autocast=autocast)


def _only(job: FineTuneJob, group: str) -> tuple[str, ...] | None:
    """The linears of `group` that get LoRA: all (None) when the group is a target, else its named projections."""
    return None if group in job.lora.targets else job.lora.adapted(group)


def transform(model: nn.Module, job: FineTuneJob) -> None:
    """Freeze, quantize and add LoRA in place (method full: every weight trainable, stack changes the experts)."""
    quant = (
        QuantSpec(job.quant_type, job.double_quant, job.gptq_group_size, job.gptq_kernel)
        if job.method == "qlora"
        else None
    )
    lora = (job.lora.rank, job.lora.alpha)
    targets, p = set(job.lora.targets), job.lora.dropout  # dropout on the dense adapters (experts: none simulated)
    style, loop = job.stack_spec.lora_style, job.stack_spec.per_expert_loop
    if job.method == "full":
        for layer in decoder_layers(model):
            mlp = layer_part(layer, FEED_FORWARD_NAMES)
            if loop and mlp is not None and hasattr(mlp, "experts"):
                mlp.experts = Loop2024Experts(mlp.experts, quant=None, lora_rank=None, lora_alpha=0.0, trainable=True)
        return
    model.requires_grad_(False)
    amp = autocast_dtype(job)  # frozen fp32 weights compute in it
    for layer in decoder_layers(model):
        attn = layer_part(layer, ATTENTION_NAMES)
        if attn is not None:
            _swap_linears(attn, quant=quant, lora=lora, style=style, dropout=p, only=_only(job, "attention"),
                          autocast=amp)  # fmt: skip
        mlp = layer_part(layer, FEED_FORWARD_NAMES)
        shared_mlp = getattr(layer, "shared_mlp", None)  # GraniteMoeShared: the shared experts beside the block
        if shared_mlp is not None:  # Granite 4.0's dense models: the only MLP
            target = "experts" if mlp is not None else "mlp"
            _swap_linears(shared_mlp, quant=quant, lora=lora if target in targets else None, style=style)
        if mlp is None:
            continue
        if hasattr(mlp, "experts"):
            experts_lora = lora if "experts" in targets else None
            if loop:
                mlp.experts = Loop2024Experts(
                    mlp.experts,
                    quant=quant,
                    lora_rank=experts_lora and experts_lora[0],
                    lora_alpha=lora[1],
                    trainable=False,
                )
            else:
                mlp.experts = SimExperts(
                    mlp.experts, quant=quant, lora_rank=experts_lora and experts_lora[0], lora_alpha=lora[1]
                )
            for shared in ("shared_expert", "shared_experts"):
                if hasattr(mlp, shared):
                    _swap_linears(getattr(mlp, shared), quant=quant, lora=experts_lora, style=style)
            router = router_name(mlp)
            if "router" in targets and router is not None:
                lora_router = SimLoraRouter(getattr(mlp, router), lora_rank=lora[0], lora_alpha=lora[1])
                setattr(mlp, router, lora_router)
        else:
            _swap_linears(mlp, quant=quant, lora=lora, style=style, dropout=p, only=_only(job, "mlp"), autocast=amp)
    if not any(p.requires_grad for p in model.parameters()):
        raise TunecostError(f"no LoRA target among {', '.join(job.lora.targets)} exists in {job.model}")
    wrap_modules_to_save(model, job.modules_to_save)


def wrap_modules_to_save(model: nn.Module, names: tuple[str, ...]) -> None:
    """Wrap every module whose name is in `names` (its last path component) as PEFT does for modules_to_save."""
    found: set[str] = set()
    for path, module in list(model.named_modules()):
        name = path.rsplit(".", 1)[-1]
        if name in names and not isinstance(module, ModulesToSave):
            parent = model.get_submodule(path.rsplit(".", 1)[0]) if "." in path else model
            setattr(parent, name, ModulesToSave(module))
            found.add(name)
    missing = [n for n in names if n not in found]
    if missing:
        raise TunecostError(f"modules_to_save: no module named {', '.join(missing)} in {type(model).__name__}")


def build_prepared(
    job: FineTuneJob,
    *,
    num_units: int | None,
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR,
    real: bool = False,
    seed: int = 0,
    device: str = "cpu",
    wrap: Callable[[nn.Module], None] | None = None,
) -> Prepared:
    """Build the model of `job` with `num_units` repeating units (None: full depth), ready to step: on fake
    tensors, or with `real=True` on real random tensors on `device` (measurements). `wrap` (e.g. FSDP2's
    `fully_shard` per layer) runs on the finished model before the optimizer is built over its parameters."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec, stack = resolve_model(job.model), job.stack
    check_supported(job, spec, behaviour)
    prefix, period, full_units = layer_pattern(spec)
    if num_units is None or num_units >= full_units:
        num_units = full_units
    num_layers = spec.num_layers if num_units == full_units else prefix + num_units * period
    experts_per_token = job.experts_per_token if spec.is_moe else None
    if job.experts_per_token is not None and not spec.is_moe:
        raise TunecostError(f"{spec.name} is a dense model: --experts-per-token does not apply")
    model = _built_model(job, spec, behaviour, num_layers, experts_per_token, real=real, device=device, seed=seed)
    fake_mode = None
    if not real:
        fake_mode = FakeTensorMode()
        to_fake(model, fake_mode)
    model.train()
    if job.gradient_checkpointing:
        enable_checkpointing(model, job, spec, behaviour)
    if wrap is not None:
        wrap(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    impl = stack_adamw_impl(stack, behaviour)
    optimizer = simulated_optimizer(job.optimizer, trainable, impl, in_backward=behaviour.optimizer_in_backward)
    warm_up_optimizer(optimizer, trainable)
    info = module_info(model)
    static = static_tensors(model, info)
    static += [(t, "optimizer_states", "optimizer") for t in optimizer_state_tensors(optimizer)]
    top_k = spec.top_k(experts_per_token)
    return Prepared(
        model=model,
        optimizer=optimizer,
        trainable=trainable,
        fake_mode=fake_mode,
        plan=LayerPlan(prefix, period, num_units),
        module_info=info,
        static=static,
        spec=spec,
        stack=stack,
        is_moe=spec.is_moe,
        num_experts=spec.num_experts,
        top_k=top_k,
        behaviour=behaviour,
        liger_loss=job.liger_kernel and liger_loss_applies(spec.family),
        autocast=autocast_dtype(job),
    )


def _built_model(
    job: FineTuneJob,
    spec: ModelSpec,
    behaviour: StackBehaviour,
    num_layers: int,
    experts_per_token: int | None,
    *,
    real: bool,
    device: str,
    seed: int,
) -> Any:
    """The model of `job` with `num_layers` layers, on the meta device (or real on `device`), transformed for the
    method and stack."""

    overrides: dict[str, Any] = {}
    if spec.family == "blackmamba":
        overrides["num_layers"] = num_layers
    else:
        overrides["num_hidden_layers"] = num_layers
        if spec.is_moe:
            overrides["output_router_logits"] = True
        if job.attention != "eager":
            overrides.update(fused_attention_dropout(spec))
    dtype = TORCH_DTYPES["fp32" if job.fp32_params else job.compute_dtype]  # fp32_params: autocast computes
    if spec.family == "blackmamba":
        if real:
            raise TunecostError("BlackMamba steps are simulated only (fused Mamba kernels), not measured on CPU")
        from tunecost.simulate.mamba import build_blackmamba_for_sim

        return build_blackmamba_for_sim(
            spec, num_layers=num_layers, experts_per_token=experts_per_token, dtype=dtype, device="meta"
        )
    model = build_model(
        spec,
        device=device if real else "meta",
        dtype=dtype,
        experts_per_token=experts_per_token,
        seed=seed,
        attn_implementation="eager" if job.attention == "eager" else "sdpa",
        **overrides,
    )
    if job.attention != "eager":
        model.config._attn_implementation = mask_free_sdpa()
        if spec.family == "falcon":
            falcon_fused_attention(model)
    transform(model, job)
    if spec.family in MAMBA2_FAMILIES and not real and job.method != "qlora":
        install_mamba2_kernels(model)
    if spec.family in GATED_DELTA_FAMILIES and not real:
        install_gated_delta_kernels(model)
    if job.liger_kernel and liger_patches(spec.family):
        install_liger(model, spec.family)
    if behaviour.kbit_fp32_norms:
        _kbit_fp32_norms(model, dtype)
    if job.selective_recompute:
        model.config._attn_implementation = recomputed_attention(model.config._attn_implementation)
    return model


def _kbit_fp32_norms(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """The model as `prepare_model_for_kbit_training` + TRL's bf16 recast leave it (see `behaviour`)."""
    cast_norms_fp32(model)
    install_autocast_boundaries(model, compute_dtype)
    config: Any = model.config
    config._attn_implementation = autocast_attention(config._attn_implementation, compute_dtype)
