"""One training step, the same code for fake tensors (simulation) and real CPU tensors (measurement).

A step is what a Hugging Face `Trainer` step does: forward with labels, keep only the loss, backward, optimizer
step, `zero_grad(set_to_none=True)`. The optimizer is warmed up first (states allocated), so the step measured is
a steady-state one: the first step of a run additionally allocates the states, which then stay.
"""

from __future__ import annotations

import contextlib
import gc
import math

import torch
from torch import nn

from tunecost.simulate.behaviour import (
    ADAMW_FUSED,
    ADAMW_TORCH_20,
    LOSS_TRANSFORMERS_5,
    LOSS_TRL_CHUNKED,
    TORCHTUNE_LOSS_CODES,
    causal_lm_loss,
    gradient_buckets,
    stack_loss_code,
    torchtune_loss,
    torchtune_output,
    trl_chunked_loss,
)
from tunecost.simulate.hf2024 import load_balancing_loss_2024
from tunecost.simulate.liger import liger_loss
from tunecost.simulate.offload import ActivationOffload, check_fake

LEARNING_RATE = 5e-5  # the paper's; irrelevant to memory


class _LowBitAdamW(torch.optim.Optimizer):
    """A low-bit AdamW's memory: each parameter's states made once by `_states`; the fused update allocates
    nothing. The update itself is a plain in-place SGD step."""

    def __init__(self, params, lr: float = LEARNING_RATE) -> None:
        super().__init__(params, {"lr": lr})

    def _states(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.state[p].update(self._states(p))
                p.add_(p.grad, alpha=-group["lr"])


class SimAdamW8bit(_LowBitAdamW):
    """bitsandbytes `AdamW8bit`'s memory on any tensor type: blockwise 8-bit states (uint8 + one fp32 absmax per
    256 values, two states) for tensors of at least 4096 elements, fp32 states below that (bitsandbytes'
    `min_8bit_size`)."""

    BLOCKSIZE = 256
    MIN_8BIT_SIZE = 4096

    def _states(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        n, out = p.numel(), {}
        for i in (1, 2):
            if n >= self.MIN_8BIT_SIZE:
                out[f"state{i}"] = p.new_zeros(p.shape, dtype=torch.uint8)
                out[f"absmax{i}"] = p.new_zeros((-(-n // self.BLOCKSIZE),), dtype=torch.float32)
            else:
                out[f"state{i}"] = p.new_zeros(p.shape, dtype=torch.float32)
        return out


class SimAdamW4bit(_LowBitAdamW):
    """torchao's `AdamW4bit` (transformers' adamw_torch_4bit) memory on any tensor type: per state, 4-bit codes
    packed two a byte, one fp32 scale per 128 values and a 16-entry fp32 code book, for tensors of at least 4096
    elements that 128 divides; `zeros_like` states (the parameter's dtype) otherwise (torchao/optim/adam.py,
    subclass_4bit.py). The compiled update's temporaries are not simulated."""

    BLOCKSIZE = 128
    MIN_QUANTIZED_SIZE = 4096

    def _states(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        n, out = p.numel(), {}
        for name in ("exp_avg", "exp_avg_sq"):
            if n >= self.MIN_QUANTIZED_SIZE and n % self.BLOCKSIZE == 0:
                out[f"{name}_codes"] = p.new_zeros((n // 2,), dtype=torch.uint8)
                out[f"{name}_scale"] = p.new_zeros((n // self.BLOCKSIZE,), dtype=torch.float32)
                out[f"{name}_qmap"] = p.new_zeros((16,), dtype=torch.float32)
            else:
                out[name] = torch.zeros_like(p)
        return out


class _AdamWStates(torch.optim.Optimizer):
    """AdamW's two states per parameter, in the parameter's dtype (`zeros_like`), and the step count."""

    def __init__(self, params, lr: float = LEARNING_RATE, eps: float = 1e-8) -> None:
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.999), "eps": eps})

    def _lists(self, group) -> tuple[list, list, list, list]:
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            state = self.state[p]
            if not state:
                state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
        return (
            params,
            [p.grad for p in params],
            [self.state[p]["exp_avg"] for p in params],
            [self.state[p]["exp_avg_sq"] for p in params],
        )


class AdamWTorch20(_AdamWStates):
    """torch 2.0.1's multi-tensor AdamW step (`torch/optim/adamw.py` `_multi_tensor_adamw`, not capturable, no
    amsgrad), its allocations op for op (the in-place weight decay allocates nothing and is left out):
    `exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)` then `denom = _foreach_add(exp_avg_sq_sqrt, eps)` out of place,
    two temporaries the size of every trainable tensor alive at the update (the installed torch adds eps in
    place: one)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs = self._lists(group)
            beta1, beta2 = group["betas"]
            by_device_dtype: dict[tuple, list[int]] = {}  # `_group_tensors_by_device_and_dtype`, first-seen order
            for i, p in enumerate(params):
                by_device_dtype.setdefault((p.device, p.dtype), []).append(i)
            for idx in by_device_dtype.values():  # the loop's locals outlive an iteration, as in torch's loop
                d_params, d_grads = [params[i] for i in idx], [grads[i] for i in idx]
                d_exp_avgs, d_exp_avg_sqs = [exp_avgs[i] for i in idx], [exp_avg_sqs[i] for i in idx]
                step = self.state[d_params[0]]["step"]
                torch._foreach_mul_(d_exp_avgs, beta1)
                torch._foreach_add_(d_exp_avgs, d_grads, alpha=1 - beta1)
                torch._foreach_mul_(d_exp_avg_sqs, beta2)
                torch._foreach_addcmul_(d_exp_avg_sqs, d_grads, d_grads, 1 - beta2)
                exp_avg_sq_sqrt = torch._foreach_sqrt(d_exp_avg_sqs)
                torch._foreach_div_(exp_avg_sq_sqrt, math.sqrt(1 - beta2**step))
                denom = torch._foreach_add(exp_avg_sq_sqrt, group["eps"])
                torch._foreach_addcdiv_(d_params, d_exp_avgs, denom, -group["lr"] / (1 - beta1**step))


class FusedAdamW(_AdamWStates):
    """DeepSpeed's FusedAdam in AdamW mode (deepspeed 0.11.1 `runtime/engine.py` picks it for an "AdamW" optimizer
    section without torch_adam): one multi-tensor CUDA kernel updates parameters and states in place and
    allocates nothing. The update here is a plain in-place step (its values do not matter to memory)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params, grads, *_states = self._lists(group)
            if params:
                torch._foreach_add_(params, grads, alpha=-group["lr"])


class OptimizerInBackward(torch.optim.Optimizer):
    """torchtune's `optimizer_in_bwd` (`training.register_optim_in_bwd_hooks`): one optimizer per parameter,
    stepped by a post-accumulate-grad hook as soon as that parameter's gradient is complete, and its gradient freed
    (`zero_grad(set_to_none=True)`), so one gradient at a time is alive instead of all of them. `hooks()` installs
    the hooks around a backward; `step` and `zero_grad` act on what is left (nothing after such a backward)."""

    def __init__(self, optimizers: dict[nn.Parameter, torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        super().__init__(list(optimizers), {"lr": LEARNING_RATE})

    @torch.no_grad()
    def step(self, closure=None):
        for param, optimizer in self.optimizers.items():
            if param.grad is not None:
                optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    @contextlib.contextmanager
    def hooks(self):
        def done(param: torch.Tensor) -> None:
            optimizer = self.optimizers[param]  # type: ignore[index]  # a trainable tensor is a parameter
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        handles = [p.register_post_accumulate_grad_hook(done) for p in self.optimizers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def simulated_optimizer(
    name: str, params: list[nn.Parameter], adamw_impl: str = "", *, in_backward: bool = False
) -> torch.optim.Optimizer:
    """The optimizer as a GPU run would build it: torch AdamW / SGD take the multi-tensor (foreach) path on CUDA,
    whose temporaries span every parameter at once, so foreach is forced here too. `adamw_impl` names another
    AdamW a stack runs (`behaviour.ADAMW_IMPLS`); `in_backward` steps each parameter in the backward
    (`OptimizerInBackward`)."""
    if in_backward:
        return OptimizerInBackward({p: simulated_optimizer(name, [p], adamw_impl) for p in params})
    if name == "adamw" and adamw_impl == ADAMW_TORCH_20:
        return AdamWTorch20(params)
    if name == "adamw" and adamw_impl == ADAMW_FUSED:
        return FusedAdamW(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE, foreach=True)
    if name == "adamw-8bit":
        return SimAdamW8bit(params)
    if name == "adamw-4bit":
        return SimAdamW4bit(params)
    raise ValueError(name)


def warm_up_optimizer(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    """Allocate the optimizer states with one zero-gradient step (outside any fake mode: torch's Adam reads its
    step counter with `.item()`, so the counters stay real 0-d CPU tensors, as they are on a GPU run)."""
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """State tensors that live on the device (the 0-d step counters stay on the host)."""
    if isinstance(optimizer, OptimizerInBackward):
        return [t for inner in optimizer.optimizers.values() for t in optimizer_state_tensors(inner)]
    out = []
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out.append(v)
    return out


def make_batch(
    vocab_size: int, batch_size: int, seq_len: int, fake_mode=None, seed: int = 0, device: str = "cpu"
) -> dict:
    """Random token ids, every position a real token (padding costs the same memory as a token)."""
    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with ctx:
        if fake_mode is None:
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g).to(device)
        else:
            ids = torch.empty((batch_size, seq_len), dtype=torch.long)
        labels = ids.clone()
    return {"input_ids": ids, "labels": labels}


def forward_loss(prepared, batch: dict) -> torch.Tensor:
    model = prepared.model
    if prepared.spec.family == "blackmamba":
        return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    loss_code = stack_loss_code(prepared.stack, prepared.behaviour)
    moe = {"output_router_logits": True} if prepared.is_moe else {}
    if prepared.liger_loss or loss_code in (LOSS_TRANSFORMERS_5, LOSS_TRL_CHUNKED):
        offload = _activation_offload(prepared)  # TRL's activation_offloading, over forward and loss
        with offload.trainer_step(model.lm_head) if offload is not None else contextlib.nullcontext():
            return _trainer_loss(prepared, batch, loss_code, moe)
    # the loss of other model code, on the model's logits
    offload = _activation_offload(prepared)
    with offload.forward() if offload is not None else contextlib.nullcontext():
        # the decoder under the LM head: `model.model` in most families, `model.transformer` in GPTBigCode
        out = model.base_model(input_ids=batch["input_ids"], use_cache=False, **moe)
        if loss_code in TORCHTUNE_LOSS_CODES:
            with offload.kept_on_device() if offload is not None else contextlib.nullcontext():
                output = torchtune_output(loss_code, model.lm_head, out.last_hidden_state)
        else:
            logits = model.lm_head(out.last_hidden_state)
    if loss_code in TORCHTUNE_LOSS_CODES:
        loss = torchtune_loss(output, batch["labels"])
        del out, output
        return loss
    loss = _with_aux_loss(prepared, causal_lm_loss(loss_code, logits, batch["labels"]), out)
    del out, logits
    return loss


def _trainer_loss(prepared, batch: dict, loss_code: str, moe: dict) -> torch.Tensor:
    """The loss as a Trainer's model forward computes it: transformers' own, Liger's lce_forward (the fused linear
    cross-entropy on the last hidden states) or SFTTrainer's patched forward (TRL's chunked loss)."""
    model = prepared.model
    if loss_code == LOSS_TRANSFORMERS_5 and not prepared.liger_loss:
        return model(**batch, use_cache=False).loss
    out = model.base_model(input_ids=batch["input_ids"], use_cache=False, **moe)
    if prepared.liger_loss:
        loss = liger_loss(out.last_hidden_state, model.lm_head, batch["labels"])
    else:
        loss = trl_chunked_loss(out.last_hidden_state, model.lm_head, batch["labels"], model.config)
    return _with_aux_loss(prepared, loss, out)


def _with_aux_loss(prepared, loss: torch.Tensor, out) -> torch.Tensor:
    """The loss plus the MoE load-balancing loss the model's forward adds (router_aux_loss_coef)."""
    coef = float(getattr(prepared.model.config, "router_aux_loss_coef", 0.0) or 0.0)
    if prepared.is_moe and coef and out.router_logits:
        loss = loss + coef * load_balancing_loss_2024(out.router_logits, prepared.num_experts, prepared.top_k)
    return loss


def _activation_offload(prepared):
    """torchtune's (or TRL's) activation offload over this model (None: the stack does not offload)."""
    if not prepared.behaviour.activation_offload:
        return None

    check_fake(prepared.model)
    return ActivationOffload([t for t, _category, _group in prepared.static])


def _autocast(prepared):
    """torch AMP over forward and loss (fp32 weights): a trained weight's compute-dtype cast cached until the forward
    ends, a frozen one's made where it is used, as `torch.autocast` does on a GPU; CPU autocast casts fake tensors."""
    if prepared.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=prepared.autocast)


def run_step(prepared, batch: dict, recorder=None) -> None:
    """Forward, backward, optimizer step, zero_grad; `recorder` (a StepRecorder) watches if given."""
    fake_ctx = prepared.fake_mode if prepared.fake_mode is not None else contextlib.nullcontext()
    rec_ctx = recorder if recorder is not None else contextlib.nullcontext()
    phase = recorder.set_phase if recorder is not None else (lambda _p: None)
    if prepared.fake_mode is None:
        gc.collect()  # real tensors: start from a clean heap (fake runs skip it: it costs ~1 s on a big graph)
    gc.disable()  # frees happen when the last reference goes, as in a training loop with no cycles
    try:
        with fake_ctx, rec_ctx:
            phase("forward")
            with _autocast(prepared):
                loss = forward_loss(prepared, batch)
            phase("backward")
            buckets = gradient_buckets(prepared.behaviour.deepspeed_zero2, prepared.model)
            optimizer = prepared.optimizer
            in_backward = optimizer.hooks() if isinstance(optimizer, OptimizerInBackward) else contextlib.nullcontext()
            with in_backward:
                loss.backward()
            del loss, buckets  # DeepSpeed frees its gradient buckets when the backward ends
        with rec_ctx:
            phase("optimizer")
            prepared.optimizer.step()
            prepared.optimizer.zero_grad(set_to_none=True)
    finally:
        gc.enable()
