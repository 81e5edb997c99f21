"""Stack behaviours (`simulate.behaviour`): the loss codes allocate the vocab x tokens tensors their library code
does (hand counts from the code, measured on real CPU tensors), prepare_model_for_kbit_training's fp32 norms make
each checkpointed layer input 4 bytes per element instead of 2, and the default behaviour is today's simulation."""

from __future__ import annotations

import pytest
import torch
from tiny_models import write_llama_config

from tunecost.errors import TunecostError
from tunecost.simulate import cache, simulate_step
from tunecost.simulate.behaviour import (
    DEFAULT_BEHAVIOUR,
    LOSS_MODEL_SHIFTED,
    LOSS_MODEL_SHIFTED_NO_AUTOCAST,
    LOSS_TRANSFORMERS_446,
    DeepSpeedZero2,
    StackBehaviour,
    causal_lm_loss,
)
from tunecost.simulate.measure import allocation_peak_bytes
from tunecost.simulate.overhead import DEFAULT_OVERHEAD
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.trace import trace_step
from tunecost.workload.job import FineTuneJob, LoraConfig

B, L, V = 2, 16, 1000  # batch, sequence length, vocabulary
T, S = B * L, B * (L - 1)  # tokens, shifted tokens
I64, LOSS_SCALARS = 8, 8  # int64 label bytes; nll_loss's fp32 output and total weight
HIDDEN = 64


@pytest.fixture
def logits_and_labels():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, L, V, generator=g).to(torch.bfloat16).requires_grad_()
    return logits, torch.randint(0, V, (B, L), generator=g)


def test_loss_codes_allocate_what_their_code_does(logits_and_labels) -> None:
    """Peak bytes the loss allocates beside the bf16 logits, each term read off the library code."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    logits, labels = logits_and_labels
    # transformers >= 4.49 (the installed 5.x model code): logits.float() (4 T V), log_softmax (4 T V); labels
    # padded by one (B (L + 1) int64) and made contiguous (B L int64)
    peak, _ = allocation_peak_bytes(lambda: ForCausalLMLoss(logits, labels, V))
    assert peak == 4 * T * V + 4 * T * V + I64 * B * (L + 1) + I64 * B * L + LOSS_SCALARS
    # 4.46-4.48 ForCausalLMLoss: logits.float() (4 T V), shifted contiguous fp32 copy (4 S V), log_softmax (4 S V)
    peak, _ = allocation_peak_bytes(lambda: causal_lm_loss(LOSS_TRANSFORMERS_446, logits, labels))
    assert peak == 4 * T * V + 4 * S * V + 4 * S * V + I64 * S + LOSS_SCALARS
    # Qwen (1.0) remote code: shifted contiguous bf16 copy (2 S V), autocast's fp32 copy (4 S V), log_softmax (4 S V)
    peak, _ = allocation_peak_bytes(lambda: causal_lm_loss(LOSS_MODEL_SHIFTED, logits, labels))
    assert peak == 2 * S * V + 4 * S * V + 4 * S * V + I64 * S + LOSS_SCALARS
    # the same code without autocast (DeepSpeed fp16): shifted copy (2 S V) and log_softmax (2 S V) in the logits'
    # dtype; nll_loss's output and total weight in that dtype too (2 + 2)
    peak, _ = allocation_peak_bytes(lambda: causal_lm_loss(LOSS_MODEL_SHIFTED_NO_AUTOCAST, logits, labels))
    assert peak == 2 * S * V + 2 * S * V + I64 * S + 2 + 2


def test_loss_codes_give_the_same_loss(logits_and_labels) -> None:
    from transformers.loss.loss_utils import ForCausalLMLoss

    logits, labels = logits_and_labels
    want = ForCausalLMLoss(logits, labels, V)
    for code in (LOSS_TRANSFORMERS_446, LOSS_MODEL_SHIFTED):
        assert float(causal_lm_loss(code, logits, labels).detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    half = causal_lm_loss(LOSS_MODEL_SHIFTED_NO_AUTOCAST, logits, labels)  # bf16 log-softmax: bf16 precision
    assert half.dtype == torch.bfloat16 and float(half.detach()) == pytest.approx(float(want.detach()), rel=1e-2)


def _tiny_qlora_job(tmp_path, **overrides) -> FineTuneJob:
    path = write_llama_config(
        tmp_path / "config.json",
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    fields = {
        "model": str(path),
        "method": "qlora",
        "lora": LoraConfig(rank=4, alpha=8, targets=("attention",)),
        "batch_size": B,
        "seq_len": 32,
        **overrides,
    }
    return FineTuneJob(**fields)


def _activations_per_layer(job: FineTuneJob, behaviour: StackBehaviour) -> int:
    """Activations alive at the loss, three layers minus two: one more checkpointed layer input."""
    alive = {}
    for units in (2, 3):
        prepared = build_prepared(job.with_(stack="hf-peft"), num_units=units, behaviour=behaviour)
        trace = trace_step(prepared, job.batch_size, int(job.seq_len or 0), round_bytes=1)
        alive[units] = trace.segments["forward:post"].by_category["activations"]
    return alive[3] - alive[2]


def test_fp32_norms_make_checkpointed_layer_inputs_fp32(tmp_path) -> None:
    job = _tiny_qlora_job(tmp_path)
    elements = job.batch_size * int(job.seq_len or 0) * HIDDEN  # one layer input (B, L, H)
    assert _activations_per_layer(job, DEFAULT_BEHAVIOUR) == 2 * elements  # bf16 residual stream
    assert _activations_per_layer(job, StackBehaviour(kbit_fp32_norms=True)) == 4 * elements  # fp32


def test_fp32_norms_cast_only_the_norms(tmp_path) -> None:
    prepared = build_prepared(
        _tiny_qlora_job(tmp_path).with_(stack="hf-peft"), num_units=2, behaviour=StackBehaviour(kbit_fp32_norms=True)
    )
    dtypes = {name: p.dtype for name, p in prepared.model.named_parameters()}
    assert all(dtypes[n] == torch.float32 for n in dtypes if "norm" in n)
    assert dtypes["model.embed_tokens.weight"] == dtypes["lm_head.weight"] == torch.bfloat16
    with pytest.raises(TunecostError, match="QLoRA"):
        build_prepared(
            _tiny_qlora_job(tmp_path, method="lora"), num_units=2, behaviour=StackBehaviour(kbit_fp32_norms=True)
        )


def test_four_bit_layers_return_their_input_dtype() -> None:
    """bitsandbytes' Linear4bit: compute in the compute dtype, output in the input's dtype."""
    from torch import nn

    from tunecost.simulate.modules import SimLinear
    from tunecost.simulate.quant4bit import QuantSpec

    base = nn.Linear(64, 32, bias=False, dtype=torch.bfloat16)
    layer = SimLinear(base, quant=QuantSpec("nf4", True), lora_rank=4, style="peft")
    for dtype in (torch.bfloat16, torch.float32):
        assert layer(torch.randn(3, 64, dtype=dtype)).dtype == dtype


def test_default_behaviour_is_todays_simulation(tmp_path) -> None:
    job = _tiny_qlora_job(tmp_path)
    plain = simulate_step(job.with_(stack="hf-peft"), use_cache=False)
    explicit = simulate_step(job.with_(stack="hf-peft"), behaviour=StackBehaviour(), use_cache=False)
    assert explicit.peak_bytes == plain.peak_bytes and explicit.breakdown_bytes == plain.breakdown_bytes
    peft = job.with_(stack="hf-peft")
    assert cache.job_key(peft, None, DEFAULT_OVERHEAD) == cache.job_key(
        peft, None, DEFAULT_OVERHEAD, behaviour=DEFAULT_BEHAVIOUR
    )
    older = simulate_step(job.with_(stack="hf-peft"), behaviour=StackBehaviour(loss_code=LOSS_TRANSFORMERS_446))
    assert older.peak_bytes > plain.peak_bytes
    assert any(LOSS_TRANSFORMERS_446 in line for line in older.assumptions)
    with pytest.raises(TunecostError, match="loss code"):
        StackBehaviour(loss_code="transformers-3")


def test_deepspeed_zero2_gradient_buckets() -> None:
    """Qwen's finetune/ds_config_zero2.json: reduce_bucket_size 2e8 with overlap_comm, two fp16 buckets."""
    zero2 = DeepSpeedZero2(reduce_bucket_elements=200_000_000, overlap_comm=True)
    assert zero2.bucket_bytes() == 2 * 200_000_000 * 2  # 0.8 GB
    assert DeepSpeedZero2(reduce_bucket_elements=1000, overlap_comm=False).bucket_bytes() == 1000 * 2
    with pytest.raises(TunecostError, match="reduce_bucket_size"):
        DeepSpeedZero2(reduce_bucket_elements=0, overlap_comm=True)


def test_gradient_buckets_live_through_the_backward_only(tmp_path) -> None:
    """Every backward segment's peak carries the buckets (allocated before autograd runs, freed when it ends);
    the forward and the optimizer step do not."""
    job = _tiny_qlora_job(tmp_path, method="lora")
    zero2 = DeepSpeedZero2(reduce_bucket_elements=10_000, overlap_comm=True)
    peaks = {}
    for behaviour in (DEFAULT_BEHAVIOUR, StackBehaviour(deepspeed_zero2=zero2)):
        prepared = build_prepared(job.with_(stack="hf-peft"), num_units=2, behaviour=behaviour)
        trace = trace_step(prepared, job.batch_size, int(job.seq_len or 0), round_bytes=1)
        peaks[behaviour] = {key: seg.total for key, seg in trace.segments.items()}
    plain, with_buckets = peaks.values()
    assert plain.keys() == with_buckets.keys()
    for key in plain:
        extra = 2 * 10_000 * 2 if key.startswith("backward") else 0
        assert with_buckets[key] - plain[key] == extra, key
    assert any("ZeRO-2" in line for line in StackBehaviour(deepspeed_zero2=zero2).describe())


def _step_peak_bytes(optimizer_cls, params: list[torch.nn.Parameter]) -> int:
    """Peak bytes one steady-state step allocates (states already there)."""
    from tunecost.simulate.step import warm_up_optimizer

    optimizer = optimizer_cls(params)
    warm_up_optimizer(optimizer, params)
    for p in params:
        p.grad = torch.ones_like(p)
    peak, _ = allocation_peak_bytes(optimizer.step)
    return peak


def test_adamw_implementations_allocate_their_temporaries() -> None:
    """torch 2.0.1's multi-tensor AdamW keeps sqrt(v) and denom = sqrt(v) + eps (two copies of the trainable
    tensors, per device/dtype group, the previous group's locals alive until reassigned); the installed torch adds
    eps in place (one copy); DeepSpeed's FusedAdam allocates nothing."""
    from functools import partial

    from tunecost.simulate.step import AdamWTorch20, FusedAdamW

    def params(*specs) -> list[torch.nn.Parameter]:
        return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n, dtype in specs]

    # a CPU foreach op with a Python scalar allocates a small wrapped scalar beside its outputs (not on CUDA)
    ones = [torch.ones(8)]
    scalar, _ = allocation_peak_bytes(lambda: torch._foreach_mul_(ones, 0.9))
    assert 0 < scalar <= 16
    n32, n16 = 3000, 5000  # elements in fp32 (the LoRA factors), in bf16 (trained embedding copies)
    assert _step_peak_bytes(AdamWTorch20, params((n32, torch.float32))) == 2 * 4 * n32 + scalar
    installed = partial(torch.optim.AdamW, foreach=True, weight_decay=0.0)
    assert 4 * n32 <= _step_peak_bytes(installed, params((n32, torch.float32))) <= 4 * n32 + 4 * scalar
    # fp32 group: sqrt + denom (+ the scalar of the add); then the bf16 group's sqrt while both fp32 temporaries
    # live, and its denom while the fp32 denom lives (+ the scalar)
    mixed = params((n32, torch.float32), (n16, torch.bfloat16))
    want = max(8 * n32 + scalar, 8 * n32 + 2 * n16, 4 * n32 + 4 * n16 + scalar)
    assert _step_peak_bytes(AdamWTorch20, mixed) == want
    assert _step_peak_bytes(FusedAdamW, mixed) == 0
    with pytest.raises(TunecostError, match="AdamW"):
        StackBehaviour(adamw_impl="adam-2015")
