"""Shared fixtures for the MoE tests: small Mixtral blocks and a PEFT reference with copied LoRA weights."""

from __future__ import annotations

import copy

import torch


def make_block(
    *,
    hidden=32,
    intermediate=48,
    experts=8,
    top_k=2,
    seed=0,
    starve_expert: int | None = 3,
    experts_impl: str = "grouped_mm",
):
    """A transformers MixtralSparseMoeBlock with random weights; `starve_expert` never wins the routing
    for inputs from `make_inputs` (its router row points away from their mean), so it gets no tokens."""
    from tunecost.moe.bench import mixtral_moe_block

    torch.manual_seed(seed)
    block = mixtral_moe_block(
        hidden=hidden, intermediate=intermediate, experts=experts, top_k=top_k, experts_impl=experts_impl
    )
    with torch.no_grad():
        block.gate.weight.normal_(0, 0.3)
        block.experts.gate_up_proj.normal_(0, 0.1)
        block.experts.down_proj.normal_(0, 0.1)
        if starve_expert is not None and top_k < experts:
            block.gate.weight[starve_expert] = -1.0
    return block


def make_inputs(tokens=40, hidden=32, seed=1, shift=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, tokens, hidden, generator=g) + shift  # positive mean starves one expert: see make_block


def randomize_lora(module: torch.nn.Module, std: float = 0.2, seed: int = 2) -> None:
    """Make every LoRA factor nonzero (B starts at zero, which would hide A's gradient)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def forward_backward(block, x, probe_seed: int = 3):
    """Output and input gradient of a fixed non-trivial loss; parameter grads land in .grad."""
    for p in block.parameters():
        p.grad = None
    inputs = x.clone().requires_grad_(True)
    out = block(inputs)
    g = torch.Generator().manual_seed(probe_seed)
    weights = torch.randn(out.shape, generator=g)
    (out * weights).sum().backward()
    return out.detach(), inputs.grad


def assert_close(actual, expected, rtol=1e-4):
    """fp32 tolerance relative to the tensor's scale (sums over many terms reorder)."""
    scale = expected.abs().max().item() + 1e-12
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale)


def peft_reference(block, *, rank: int, alpha: float, router: bool = True):
    """The reference path: PEFT LoRA (ParamWrapper) on a copy of the stock block's fused experts (+ router)."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = ["experts.gate_up_proj", "experts.down_proj"] + (["gate.weight"] if router else [])
    ref = inject_adapter_in_model(
        LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=[], target_parameters=targets),
        copy.deepcopy(block),
    )
    for name, p in ref.named_parameters():
        p.requires_grad_("lora_" in name)
    return ref


def peft_factors(ref):
    """{name: PEFT lora weight} of a peft_reference block (gate_up is the inner wrapper, down the outer)."""
    out = {
        "A_down": ref.experts.lora_A["default"].weight,
        "B_down": ref.experts.lora_B["default"].weight,
        "A_gate_up": ref.experts.base_layer.lora_A["default"].weight,
        "B_gate_up": ref.experts.base_layer.lora_B["default"].weight,
    }
    assert ref.experts.parameter_name == "down_proj" and ref.experts.base_layer.parameter_name == "gate_up_proj"
    if hasattr(ref.gate, "lora_A"):
        out["A_router"] = ref.gate.lora_A["default"].weight
        out["B_router"] = ref.gate.lora_B["default"].weight
    return out


def to_peft_a(a):  # ours (E, r, in) -> PEFT lora_A.weight (E*r, in): expert e owns rows [e*r, (e+1)*r)
    return a.reshape(-1, a.shape[-1])


def to_peft_b(b):  # ours (E, out, r) -> PEFT lora_B.weight (out, r*E): expert e owns columns j*E + e
    return b.permute(1, 2, 0).reshape(b.shape[1], -1)


def copy_fast_lora_into_peft(fast_block, ref) -> None:
    experts, f = fast_block.experts, peft_factors(ref)
    with torch.no_grad():
        f["A_gate_up"].copy_(to_peft_a(experts.lora_A_gate_up))
        f["B_gate_up"].copy_(to_peft_b(experts.lora_B_gate_up))
        f["A_down"].copy_(to_peft_a(experts.lora_A_down))
        f["B_down"].copy_(to_peft_b(experts.lora_B_down))
        if "A_router" in f:
            f["A_router"].copy_(fast_block.gate.lora_A.weight)
            f["B_router"].copy_(fast_block.gate.lora_B.weight)


def merged_reference(x, *, router_weight, router_lora, top_k, gate, up, down, activation=torch.nn.functional.silu):
    """An independent dense reference: router logits x W^T (+ s x A^T B^T), softmax, top-k, renormalise, then
    per token and chosen expert e: down[e](act(gate[e] x) * up[e] x) weighted; each weight may be a merged
    W + s B A built with autograd. Returns (tokens, H)."""
    x2 = x.reshape(-1, x.shape[-1])
    logits = x2 @ router_weight.T
    if router_lora is not None:
        a, b, s = router_lora
        logits = logits + s * (x2 @ a.T) @ b.T
    probs = torch.softmax(logits.float(), dim=-1)
    top, idx = torch.topk(probs, top_k, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    rows = []
    for t in range(x2.shape[0]):
        acc = torch.zeros_like(x2[t])
        for slot in range(top_k):
            e = int(idx[t, slot])
            h = activation(gate[e] @ x2[t]) * (up[e] @ x2[t])
            acc = acc + top[t, slot] * (down[e] @ h)
        rows.append(acc)
    return torch.stack(rows)


def merged_reference_backward(x, *, block, lora_block, scaling, gate, up, down):
    """`merged_reference` of `x` with top-2 routing by the stock `block`'s router weight plus `lora_block`'s router
    LoRA, and the (merged) expert weights given, then backward through the probe loss of `forward_backward`: the
    leaves behind `gate`, `up` and `down` get their reference gradients. Returns (expected output, grad of x)."""
    xr = x.clone().requires_grad_(True)
    router_lora = (lora_block.gate.lora_A.weight.detach(), lora_block.gate.lora_B.weight.detach(), scaling)
    expected = merged_reference(
        xr, router_weight=block.gate.weight.detach(), top_k=2, router_lora=router_lora, gate=gate, up=up, down=down
    )
    probe = torch.randn(1, *expected.shape, generator=torch.Generator().manual_seed(3))
    (expected.reshape(1, *expected.shape) * probe).sum().backward()
    return expected.detach(), xr.grad
