"""Liger's Triton kernels for the step simulator: autograd functions that allocate and keep for backward what
Liger's keep, bound to a model as `use_liger_kernel` binds Liger's, so a traced step's memory is Liger's.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.liger`.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
from torch import nn

from tunecost.simulate.counts import like_iterations, note_not_affine
from tunecost.workload.liger import GEMMA_NORMS, NO_GLU, NORMS_NOT_IN_PLACE, flce_chunk_rows

GLU_ACTS = frozenset({"silu", "swish", "gelu_pytorch_tanh", "gelu"})  # Liger's SwiGLU and GEGLU MLPs
BLOCKS = 16  # element-wise math in this many row blocks, so its fp32 scratch stays small (Liger's is in registers)


def _row_blocks(rows: int) -> list[slice]:
    if rows % BLOCKS:
        note_not_affine()  # blocks of ceil(rows / BLOCKS) rows
    step = max(-(-rows // BLOCKS), 1)
    return [slice(start, start + step) for start in range(0, rows, step)]


class RMSNormFunction(torch.autograd.Function):
    """LigerRMSNormFunction: Y in the input's dtype, the inverse RMS per row in fp32; keeps X, W and RSTD; backward
    writes dX into dY (`in_place`) or into a new tensor."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, in_place: bool) -> Any:
        rows = x.reshape(-1, x.shape[-1])
        acc = torch.promote_types(x.dtype, torch.float32)  # fp32 for the compute dtypes
        norm = torch.linalg.vector_norm(rows, 2, dim=-1, dtype=acc)
        rstd = torch.rsqrt(norm.pow_(2).div_(rows.shape[-1]).add_(eps))
        y = rows * rstd.to(x.dtype)[:, None]
        y.mul_((weight.to(acc) + offset).to(x.dtype))
        ctx.save_for_backward(x, weight, rstd)  # Liger keeps X viewed as rows: the same storage
        ctx.offset, ctx.in_place = offset, in_place
        return y.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        x, weight, rstd = ctx.saved_tensors
        rows, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dx = dy2 if ctx.in_place else torch.empty_like(dy2)
        w = weight.to(rstd.dtype) + ctx.offset
        dw = torch.zeros_like(w) if ctx.needs_input_grad[1] else None
        blocks = _row_blocks(rows.shape[0])
        x_hat, g, prod = _scratch(3, blocks, rows.shape[-1], rstd.dtype, rows.device)
        for i in like_iterations(len(blocks), rows):
            sl = blocks[i]
            n = rows[sl].shape[0]
            xh, gb, pb, r = x_hat[:n], g[:n], prod[:n], rstd[sl, None]
            xh.copy_(rows[sl]).mul_(r)
            gb.copy_(dy2[sl])
            if dw is not None:
                dw.add_(torch.mul(gb, xh, out=pb).sum(0))
            gb.mul_(w)
            dot = torch.mul(gb, xh, out=pb).mean(-1, keepdim=True)
            dx[sl].copy_(gb.sub_(xh.mul_(dot)).mul_(r))
        return dx.view(dy.shape), None if dw is None else dw.to(weight.dtype), None, None, None


def _scratch(count: int, blocks: list[slice], cols: int, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    """`count` buffers of one row block, reused across the blocks (no allocation inside the loop)."""
    rows = blocks[0].stop - blocks[0].start
    return [torch.empty((rows, cols), dtype=dtype, device=device) for _ in range(count)]


class GLUFunction(torch.autograd.Function):
    """LigerSiLUMulFunction / LigerGELUMulFunction: c = act(a) * b; keeps a and b only (act(a) recomputed);
    backward writes da into a and db into b."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, gelu: bool) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()  # @ensure_contiguous: Phi-3's halves of gate_up become copies
        ctx.save_for_backward(a, b)
        ctx.gelu = gelu
        c = torch.empty_like(a)
        a2, b2, c2 = (t.view(-1, t.shape[-1]) for t in (a, b, c))
        blocks = _row_blocks(a2.shape[0])
        for i in like_iterations(len(blocks), a2):
            sl = blocks[i]
            act = nn.functional.gelu(a2[sl], approximate="tanh") if gelu else nn.functional.silu(a2[sl])
            c2[sl] = act * b2[sl]
        return c

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        a2, b2, dc2 = (t.reshape(-1, t.shape[-1]) for t in (a, b, dc.contiguous()))
        blocks = _row_blocks(a2.shape[0])
        acc = torch.promote_types(a.dtype, torch.float32)
        buffers = _scratch(4 if ctx.gelu else 3, blocks, a2.shape[-1], acc, a.device)
        x, s, t = buffers[:3]
        w = buffers[3] if ctx.gelu else None
        for i in like_iterations(len(blocks), a2):
            sl = blocks[i]
            n = a2[sl].shape[0]
            xb, sb, tb = x[:n], s[:n], t[:n]
            xb.copy_(a2[sl])
            tb.copy_(dc2[sl]).mul_(b2[sl])  # dc * b
            if w is not None:  # GELU (tanh): 0.5 x (1 + tanh(c (x + k x^3))) and its derivative
                wb = w[:n]
                sb.copy_(xb).pow_(3).mul_(GELU_K).add_(xb).mul_(GELU_C).tanh_()
                b2[sl].copy_(sb).add_(1).mul_(xb).mul_(0.5).mul_(dc2[sl])
                wb.copy_(xb).mul_(xb).mul_(3 * GELU_K).add_(1).mul_(GELU_C).mul_(xb).mul_(0.5)
                wb.mul_(xb.copy_(sb).mul_(sb).neg_().add_(1)).add_(sb.add_(1).mul_(0.5)).mul_(tb)
                a2[sl].copy_(wb)
            else:  # SiLU: x s with s = sigmoid(x), derivative s (1 + x (1 - s))
                torch.sigmoid(xb, out=sb)
                b2[sl].copy_(xb).mul_(sb).mul_(dc2[sl])
                a2[sl].copy_(xb.addcmul_(xb, sb, value=-1).add_(1).mul_(sb).mul_(tb))
        return a, b, None


GELU_C = (2 / torch.pi) ** 0.5
GELU_K = 0.044715


class FusedLinearCrossEntropy(torch.autograd.Function):
    """LigerFusedLinearCrossEntropyFunction (mean over the non-ignored targets): the logits of one chunk of
    `flce_chunk_rows` rows at a time, their cross-entropy gradient written over them, dX and dW accumulated in the
    forward; keeps dX (and dW when the head trains) for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int) -> Any:
        tokens, hidden = x.shape
        chunk = flce_chunk_rows(tokens, hidden, weight.shape[0])
        note_not_affine()  # a power-of-two chunk of rows
        grad_input = torch.zeros_like(x)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        loss_1d = torch.zeros(tokens, dtype=torch.float32, device=x.device)
        mask = target != ignore_index
        count = mask.sum().clamp(min=1)
        logits = torch.empty((chunk, weight.shape[0]), dtype=x.dtype, device=x.device)
        starts = range(0, tokens, chunk)
        for i in like_iterations(len(starts), x):
            start = starts[i]
            end = min(start + chunk, tokens)
            rows, t, m = x[start:end], target[start:end], mask[start:end]
            block = logits[: end - start]
            torch.mm(rows, weight.t(), out=block)
            picked = block.gather(1, t.clamp(min=0)[:, None]).float()[:, 0]
            top = block.amax(-1, keepdim=True)
            block.sub_(top).exp_()  # softmax in place, as the kernel does in registers
            lse = block.sum(-1, dtype=torch.float32).log()  # row sums (the kernel reduces a row in fp32)
            block.div_(block.sum(-1, keepdim=True))
            loss_1d[start:end] = torch.where(m, lse + top[:, 0].float() - picked, 0.0)
            block.scatter_add_(1, t.clamp(min=0)[:, None], -torch.ones_like(picked, dtype=x.dtype)[:, None])
            block.mul_(m[:, None].to(x.dtype)).div_(count.to(x.dtype))
            torch.mm(block, weight, out=grad_input[start:end])
            if grad_weight is not None:
                grad_weight.addmm_(block.t(), rows)
        del logits
        ctx.save_for_backward(grad_input, *([] if grad_weight is None else [grad_weight]))
        ctx.has_weight_grad = grad_weight is not None
        return loss_1d.sum() / count

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        saved = ctx.saved_tensors
        grad_input = saved[0].mul_(grad_output)  # in place, as element_mul_kernel
        grad_weight = saved[1].mul_(grad_output) if ctx.has_weight_grad else None
        return grad_input, grad_weight, None, None


def liger_loss(hidden: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """LigerForCausalLMLoss on the decoder's last hidden states: labels padded by one ignored position and shifted
    (`shift_labels` contiguous), the hidden states flattened, the fused linear cross-entropy on the head's weight."""
    ignore = -100
    shifted = nn.functional.pad(labels, (0, 1), value=ignore)[..., 1:].contiguous()
    weight = lm_head.weight
    return FusedLinearCrossEntropy.apply(hidden.view(-1, hidden.shape[-1]), weight, shifted.view(-1), ignore)


def _norm_forward(offset: float, in_place: bool):
    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        eps = getattr(self, "variance_epsilon", None) or getattr(self, "eps", 1e-6)
        return RMSNormFunction.apply(x.contiguous(), self.weight, eps, offset, in_place)

    return forward


def _glu_forward(gelu: bool):
    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "gate_up_proj"):  # Phi-3, GLM-4: one fused projection, split in two
            a, b = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            a, b = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(GLUFunction.apply(a, b, gelu))

    return forward


def _glu_act(module: nn.Module, config: Any) -> str | None:
    """The activation of a gated dense MLP Liger replaces, else None (MoE blocks and other MLPs stay)."""
    gated = hasattr(module, "down_proj") and (
        hasattr(module, "gate_up_proj") or (hasattr(module, "gate_proj") and hasattr(module, "up_proj"))
    )
    act = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
    return act if gated and act in GLU_ACTS else None


def install_liger(model: nn.Module, family: str) -> None:
    """Bind Liger's RMSNorm to every RMSNorm and its SwiGLU/GEGLU to every gated dense MLP (and DeepSeek's shared
    experts) of `model`: instance methods, as `_patch_rms_norm_module` and `_patch_swiglu_module` bind them."""
    offset = 1.0 if family in GEMMA_NORMS else 0.0
    in_place = family not in NORMS_NOT_IN_PLACE
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
            module.forward = MethodType(_norm_forward(offset, in_place), module)
        elif (
            leaf in ("mlp", "shared_experts", "shared_expert")
            and family not in NO_GLU
            and (act := _glu_act(module, model.config))
        ):
            module.forward = MethodType(_glu_forward(act.startswith("gelu")), module)
