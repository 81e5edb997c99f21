"""GPTQ int4 weights (auto-gptq's QuantLinear layout) and PEFT modules_to_save in the step simulator: buffer sizes
from the shapes auto-gptq registers, a round trip through the packed layout, what each kernel keeps, and the exact
bytes a trained copy of the embedding and output head adds."""

from __future__ import annotations

import json

import pytest
import torch

from tunecost.errors import TunecostError
from tunecost.simulate import gptq, simulate_step
from tunecost.simulate.quant4bit import Quantized4bit, QuantSpec, matmul_4bit
from tunecost.workload.job import FineTuneJob, LoraConfig

HIDDEN, INTER, LAYERS, VOCAB = 64, 96, 3, 200


def _tiny(tmp_path) -> str:
    config = {
        "model_type": "qwen2",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": VOCAB,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def test_buffer_bytes_follow_auto_gptq_shapes() -> None:
    # auto-gptq QuantLinear (4 bits), in=4096, out=11008, group 128: qweight int32 (4096/8, 11008), qzeros int32
    # (32, 11008/8), scales fp16 (32, 11008), g_idx int32 (4096,)
    expected = 4 * 512 * 11008 + 4 * 32 * 1376 + 2 * 32 * 11008 + 4 * 4096
    assert gptq.storage_bytes(11008, 4096, 128) == expected
    # group size -1: one group
    assert gptq.storage_bytes(11008, 4096, -1) == 4 * 512 * 11008 + 4 * 1376 + 2 * 11008 + 4 * 4096
    with torch.device("meta"):
        q = Quantized4bit(3, 48, 64, QuantSpec("gptq", group_size=32))
    assert q.qweight.shape == (3, 8, 48) and q.qzeros.shape == (3, 2, 6)
    assert q.scales.shape == (3, 2, 48) and q.scales.dtype == torch.float16 and q.g_idx.shape == (3, 64)
    packed, const = q.storage_bytes()
    assert packed == 3 * 4 * 8 * 48 and packed + const == 3 * gptq.storage_bytes(48, 64, 32)


def test_shapes_auto_gptq_cannot_pack_are_errors() -> None:
    with pytest.raises(TunecostError, match="multiples of 8"):
        gptq.check_shape(50, 64, 32)
    with pytest.raises(TunecostError, match="does not divide"):
        gptq.check_shape(48, 64, 48)


def test_round_trip_through_the_packed_layout() -> None:
    torch.manual_seed(0)
    w = torch.randn(2, 48, 64)
    q = Quantized4bit(2, 48, 64, QuantSpec("gptq", group_size=32))
    q.load_from(w)
    for i in range(2):
        got = q.dequantize(i, torch.float16).float()
        assert got.shape == (48, 64)
        # round to nearest: within one quantization step (the group's range / 15) of the original
        step = (w[i].reshape(48, 2, 32).amax(-1) - w[i].reshape(48, 2, 32).amin(-1).clamp(max=0)) / 15
        assert ((got - w[i]).abs().reshape(48, 2, 32) <= step[..., None] + 1e-3).all()


@pytest.mark.parametrize("kernel", ["triton-v2", "torch"])
def test_matmul_gradient_flows_to_input_only(kernel) -> None:
    torch.manual_seed(0)
    q = Quantized4bit(1, 48, 64, QuantSpec("gptq", group_size=32, kernel=kernel))
    q.load_from(torch.randn(1, 48, 64))
    x = torch.randn(5, 64, dtype=torch.float16, requires_grad=True)
    y = matmul_4bit(x, q)
    y.float().sum().backward()
    dense = q.dequantize(0, torch.float16)
    torch.testing.assert_close(y, x.detach() @ dense.t())
    torch.testing.assert_close(x.grad, torch.ones(5, 48, dtype=torch.float16) @ dense)


def _saved_for_backward(kernel: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    q = Quantized4bit(1, 48, 64, QuantSpec("gptq", group_size=32, kernel=kernel))
    q.load_from(torch.randn(1, 48, 64))
    saved: list[torch.Tensor] = []
    x = torch.randn(5, 64, dtype=torch.float16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        matmul_4bit(x, q)
    return saved


def test_torch_kernel_keeps_its_weight_and_triton_does_not() -> None:
    """auto-gptq's torch path hands the fp16 weight to an autograd matmul (kept for backward); the triton v2
    function saves only the packed buffers."""
    for kernel, kept in (("torch", True), ("triton-v2", False)):
        weights = [t for t in _saved_for_backward(kernel) if t.dtype == torch.float16 and t.numel() == 48 * 64]
        assert bool(weights) == kept, kernel


def _stored(sim, category: str) -> int:
    """Bytes stored in one category, over every module group."""
    return sum(v for k, v in sim.weight_bytes.items() if k.endswith("/" + category))


def _simulate(job: FineTuneJob):
    return simulate_step(job.with_(stack="hf-peft"), num_layers_to_trace=99, use_cache=False, granule_bytes=1)


def _job(tmp_path, **kw) -> FineTuneJob:
    return FineTuneJob(
        model=_tiny(tmp_path),
        lora=LoraConfig(rank=4, alpha=8, targets=("attention", "mlp")),
        batch_size=2,
        seq_len=32,
        **kw,
    )


def test_simulated_gptq_storage_is_the_quantlinear_buffers(tmp_path) -> None:
    job = _job(tmp_path, method="qlora", quant_type="gptq", gptq_group_size=32, compute_dtype="fp16")
    sim = _simulate(job)
    # per layer: q, k, v, o (64 x 64), gate, up (96 x 64), down (64 x 96), as (out, in)
    mats = [(HIDDEN, HIDDEN)] * 4 + [(INTER, HIDDEN)] * 2 + [(HIDDEN, INTER)]
    codes = LAYERS * sum(4 * (i // 8) * o for o, i in mats)
    consts = LAYERS * sum(gptq.storage_bytes(o, i, 32) - 4 * (i // 8) * o for o, i in mats)
    assert _stored(sim, "weights_4bit") == codes
    assert _stored(sim, "quant_constants") == consts


def test_gptq_needs_fp16_compute(tmp_path) -> None:
    with pytest.raises(TunecostError, match="fp16"):
        _job(tmp_path, method="qlora", quant_type="gptq", compute_dtype="bf16")


def test_torch_kernel_costs_more_than_triton(tmp_path) -> None:
    """The kept fp16 weights of the recomputed layer (and the int32 unpack) make the torch path's peak higher."""
    base = _job(tmp_path, method="qlora", quant_type="gptq", gptq_group_size=32, compute_dtype="fp16")
    triton = _simulate(base)
    torch_path = _simulate(base.with_(gptq_kernel="torch"))
    assert torch_path.peak_bytes > triton.peak_bytes


def test_modules_to_save_adds_copy_grad_and_two_adamw_states(tmp_path) -> None:
    """PEFT's ModulesToSaveWrapper keeps the frozen original and trains a copy: the copy (bf16), its gradient and
    AdamW's exp_avg and exp_avg_sq (bf16, torch AdamW's states take the parameter's dtype)."""
    job = _job(tmp_path, method="lora")
    plain = _simulate(job)
    saved = _simulate(job.with_(modules_to_save=("embed_tokens", "lm_head")))
    copy_bytes = 2 * VOCAB * HIDDEN * 2  # embed_tokens and lm_head, bf16
    assert _stored(saved, "trainable_params") - _stored(plain, "trainable_params") == copy_bytes
    states = saved.breakdown_bytes["optimizer_states"] - plain.breakdown_bytes["optimizer_states"]  # alive all step
    assert states == 2 * copy_bytes
    assert _stored(saved, "frozen_weights") == _stored(plain, "frozen_weights")  # the originals stay
    # at the peak (in backward): the copy and both states, and the copies' gradients once their backward has run
    assert saved.peak_bytes - plain.peak_bytes >= 3 * copy_bytes
    assert saved.peak_bytes - plain.peak_bytes <= 4 * copy_bytes + 2 * VOCAB * HIDDEN * 2


def test_modules_to_save_must_name_modules(tmp_path) -> None:
    with pytest.raises(TunecostError, match="no module named wte"):
        simulate_step(_job(tmp_path, method="lora", modules_to_save=("wte",)).with_(stack="hf-peft"), use_cache=False)
    with pytest.raises(TunecostError, match="beside LoRA"):
        _job(tmp_path, method="full", modules_to_save=("lm_head",))
