"""Megatron-style tensor parallelism (and sequence parallelism) of one rank with PyTorch's DTensor TP
(`parallelize_module`), following torchtitan's Llama plan: q/k/v and gate/up column-parallel, o/down row-parallel,
the embedding row-parallel and the LM head column-parallel; with sequence parallelism the norms under
`SequenceParallel` and the attention and MLP inputs all-gathered by `PrepareModuleInput`. Simulated on a fake process
group (fake tensors) or measured on real gloo ranks (`tp_measure`), with the FSDP2 step's recorder.

Sources and derivations: docs/multi-gpu.md, section "Tensor parallelism: one rank on a fake process group vs gloo".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from torch import nn

from tunecost.distributed.sharded_step import RankStep, fake_process_group, record_rank_step
from tunecost.distributed.tp_experts import moe_block_style, shard_experts
from tunecost.distributed.tp_lora import lora_linear_style
from tunecost.errors import TunecostError
from tunecost.models.anatomy import decoder_layers
from tunecost.models.catalog import resolve_model
from tunecost.simulate.modules import SimLinear
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.step import make_batch
from tunecost.workload.job import FineTuneJob

# families with Llama's module names (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, the two layer norms,
# model.embed_tokens, model.norm, lm_head); Nemotron's MLP has no gate_proj; Mixtral's is an MoE block
# (mlp.gate, mlp.experts: `tp_experts`)
TP_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "nemotron", "mixtral")
COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def check_tp_supported(job: FineTuneJob, tp: int, *, sequence_parallel: bool) -> None:
    """One-line errors for a job this module cannot split `tp` ways."""
    spec = resolve_model(job.model)
    if tp < 1:
        raise TunecostError(f"--tp: the degree must be at least 1, got {tp}")
    if spec.family not in TP_FAMILIES:
        raise TunecostError(
            f"{spec.name}: tensor parallelism is simulated for the Llama layout ({', '.join(TP_FAMILIES)}), "
            f"not {spec.family!r}"
        )
    if job.method == "qlora":
        raise TunecostError(
            "--tp with --method qlora: tensor parallelism is simulated for full fine-tuning and LoRA, not quantized "
            "weights (their packed bytes would need a sharded layout of their own); use --method lora or full"
        )
    if spec.is_moe and job.stack_spec.per_expert_loop:
        raise TunecostError(
            "--tp with stack hf-2024: its per-expert linears are not split by the TP plan; use the default stack"
        )
    if job.modules_to_save:
        raise TunecostError("--tp with modules_to_save: the wrapped copies are not sharded by the TP plan")
    heads = int(spec.config.get("num_attention_heads") or 0)
    kv_heads = int(spec.config.get("num_key_value_heads") or heads)
    intermediate = int(spec.config.get("intermediate_size") or 0)
    vocab = int(spec.vocab_size)
    for what, n in (("attention heads", heads), ("key-value heads", kv_heads), ("intermediate size", intermediate)):
        if n % tp:
            raise TunecostError(f"--tp {tp} does not divide the {n} {what} of {spec.name}")
    if vocab % tp:
        raise TunecostError(f"--tp {tp} does not divide the vocabulary of {spec.name} ({vocab} tokens)")
    if sequence_parallel and tp == 1:
        raise TunecostError("--sequence-parallel shards along the tensor-parallel group; it needs --tp 2 or more")
    if sequence_parallel and job.worst_case_seq_len % tp:
        raise TunecostError(
            f"--sequence-parallel: --tp {tp} does not divide the sequence length {job.worst_case_seq_len}"
        )


def layer_plan(*, sequence_parallel: bool) -> dict[str, Any]:
    """torchtitan's per-block plan (`apply_tp`) on transformers' module names. Without sequence parallelism the
    block's input is replicated and the row-parallel outputs are all-reduced; with it, the norms run on a
    sequence shard, the attention and MLP inputs are all-gathered and the row-parallel outputs reduce-scattered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    # the attention and MLP inputs become one replicated DTensor that q/k/v (gate/up) share, so the backward sums
    # their input gradients before one all-reduce (reduce-scatter with SP): Megatron's f operator
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        # transformers calls the attention with keyword arguments, the MLP with one positional argument
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": seq}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        ),
        "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
    }
    plan |= {name: ColwiseParallel() for name in COLWISE}
    if not sequence_parallel:
        plan |= {name: RowwiseParallel() for name in ROWWISE}
        return plan | {name: replicated() for name in ("input_layernorm", "post_attention_layernorm")}
    # the residual stream stays a DTensor sharded on the sequence (use_local_output=False), so the model's code sees
    # the global shape (its positions and mask are built from it)
    plan |= {name: RowwiseParallel(output_layouts=Shard(1), use_local_output=False) for name in ROWWISE}
    plan["input_layernorm"] = SequenceParallel()
    plan["post_attention_layernorm"] = SequenceParallel()
    return plan


def root_plan(*, sequence_parallel: bool, loss_parallel: bool = True) -> dict[str, Any]:
    """torchtitan's plan outside the blocks: the embedding row-parallel (vocabulary rows), its output reduced to a
    sequence shard (SP) or replicated; the final norm on the sequence shard (SP); the LM head column-parallel
    (vocabulary columns), its logits left sharded for loss parallelism (torchtitan's default: transformers' loss
    runs on them under `loss_context`) or all-gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    sp_layout = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=sp_layout, use_local_output=not sequence_parallel
        ),
        "lm_head": ColwiseParallel(
            input_layouts=sp_layout,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }
    plan["model.norm"] = SequenceParallel() if sequence_parallel else replicated()
    return plan


def replicated():
    """A ParallelStyle that replicates a module's parameters as DTensors and runs it on the replicated input (as
    torchtitan's `NoParallel`): without sequence parallelism the norms are not sharded, but their parameters must
    be DTensors like the others for the optimizer's multi-tensor (foreach) update."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    def input_fn(_module, inputs, mesh):
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
        return (x, *inputs[1:])

    def output_fn(_module, outputs, _mesh):
        return outputs.to_local()

    class Replicated(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh):
            return distribute_module(module, device_mesh, None, input_fn, output_fn)

    return Replicated()


def apply_tp(model: nn.Module, mesh, *, sequence_parallel: bool, loss_parallel: bool = True) -> None:
    """Parallelize `model` (a transformers causal LM of `TP_FAMILIES`, as `models.build` builds it) in place over
    the 1-D device mesh `mesh`: every decoder layer, then the embedding, final norm and LM head. With
    `loss_parallel` the step's forward and backward must run under `loss_context(True)`."""
    from torch.distributed.tensor.parallel import parallelize_module

    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    head, embedding = model.get_submodule("lm_head"), model.get_submodule("model.embed_tokens")
    tied = head.weight is embedding.weight
    for layer in decoder_layers(model):
        plan = layer_plan(sequence_parallel=sequence_parallel)
        mlp = _submodule(layer, "mlp")
        if mlp is not None and hasattr(mlp, "experts"):
            if not loss_parallel:  # transformers adds the (DTensor) load-balancing loss in place to a plain loss
                raise TunecostError("tensor parallelism of an MoE model: gathered logits are not simulated")
            shard_experts(mlp, mesh)
            plan["mlp"] = moe_block_style(sequence_parallel=sequence_parallel)
        for name in (*COLWISE, *ROWWISE):
            module = _submodule(layer, name)
            if module is None:  # a projection the family does not have
                plan.pop(name)
                continue
            if isinstance(module, SimLinear) and module.qweight is None:  # LoRA, or a frozen linear beside it
                plan[name] = lora_linear_style(plan[name])
            elif not isinstance(module, nn.Linear):
                raise TunecostError(f"tensor parallelism: {name} of {type(layer).__name__} is not an nn.Linear")
        parallelize_module(layer, mesh, plan)
    parallelize_module(model, mesh, root_plan(sequence_parallel=sequence_parallel, loss_parallel=loss_parallel))
    _replicate_the_rest(model, mesh)
    if tied:  # both styles shard the vocabulary rows (Shard(0)): the head shares the embedding's shard again
        head.weight = embedding.weight
    for name, p in model.named_parameters():  # SequenceParallel's new parameters forget that a norm was frozen
        p.requires_grad_(trainable.get(name, p.requires_grad))  # the experts' (renamed) keep their flag


def _submodule(layer: nn.Module, name: str) -> nn.Module | None:
    try:
        return layer.get_submodule(name)
    except AttributeError:
        return None


def _replicate_the_rest(model: nn.Module, mesh) -> None:
    """Modules the plan leaves out (Qwen3's per-head q_norm and k_norm, on the rank's own heads) run on their local
    input with replicated DTensor parameters, so that the optimizer's foreach update sees DTensors only."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if own and not any(isinstance(p, DTensor) for p in own):
            parallelize_module(module, mesh, replicated())


def loss_context(loss_parallel: bool):
    """The context a step of a model under `apply_tp` runs in: DTensor's `loss_parallel` (cross-entropy on
    vocabulary-sharded logits) or not, and `implicit_replication` (plain tensors beside DTensors taken as replicated:
    the MoE load-balancing loss builds its sums from plain zeros)."""
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.distributed.tensor.parallel import loss_parallel as parallel_loss

    stack = contextlib.ExitStack()
    stack.enter_context(implicit_replication())
    if loss_parallel:
        stack.enter_context(parallel_loss())
    return stack


def prepare_tp_rank(
    job: FineTuneJob,
    *,
    sequence_parallel: bool,
    real: bool,
    num_units: int | None = None,
    seed: int = 0,
    loss_parallel: bool = True,
    before_tp: Callable[[nn.Module], None] | None = None,
):
    """Build `job`'s model (`num_units` decoder layers, None: all) and parallelize it over the default process
    group (which must exist); `before_tp` runs on the whole model first (measurements set weights)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    tp = dist.get_world_size()
    check_tp_supported(job, tp, sequence_parallel=sequence_parallel)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))

    def wrap(model: nn.Module) -> None:
        if before_tp is not None:
            before_tp(model)
        apply_tp(model, mesh, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel)

    return build_prepared(
        job,
        num_units=num_units,
        real=real,
        seed=seed,
        wrap=wrap,
    )


def tp_strategy(tp: int, sequence_parallel: bool, loss_parallel: bool = True) -> str:
    """The `RankStep.strategy` label of a TP layout."""
    return f"tp{tp}" + ("-sp" if sequence_parallel else "") + ("" if loss_parallel else "-gathered-logits")


def simulate_tp_rank(
    job: FineTuneJob,
    *,
    tp: int,
    sequence_parallel: bool,
    rank: int = 0,
    granule_bytes: int = 512,
    loss_parallel: bool = True,
) -> RankStep:
    """Simulate one rank of `job` split `tp` ways by tensor parallelism, on fake tensors in a fake process group."""
    check_tp_supported(job, tp, sequence_parallel=sequence_parallel)
    with fake_process_group(tp, rank):
        prepared = prepare_tp_rank(job, sequence_parallel=sequence_parallel, real=False, loss_parallel=loss_parallel)
        batch = make_batch(prepared.spec.vocab_size, job.batch_size, job.worst_case_seq_len, prepared.fake_mode)
        strategy = tp_strategy(tp, sequence_parallel, loss_parallel)
        with loss_context(loss_parallel):
            return record_rank_step(
                prepared, batch, strategy=strategy, granule_bytes=granule_bytes, desugar_dtensor=True
            )
