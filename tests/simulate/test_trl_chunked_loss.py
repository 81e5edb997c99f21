"""TRL's chunked_nll (SFTConfig's default loss_type since TRL 1.7) in the step simulator: the same loss and
gradients as the full-logits cross-entropy, a simulated peak that matches the CPU allocator's, no logits kept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_models import write_llama_config
from torch import nn

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.simulate.behaviour import LOSS_TRL_CHUNKED, TRL_CHUNK_TOKENS, StackBehaviour, trl_chunked_loss
from tunecost.simulate.measure import measure_step_peak
from tunecost.workload.job import FineTuneJob, LoraConfig

TRL = StackBehaviour(loss_code=LOSS_TRL_CHUNKED)
TINY = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2}
TINY |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 3000}


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_chunked_loss_equals_the_full_logits_cross_entropy(softcap) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(2, 300, 16, requires_grad=True)  # 598 shifted tokens: three chunks, the last partial
    head = nn.Linear(16, 50, bias=False)
    labels = torch.randint(0, 50, (2, 300))
    labels[0, :40] = -100
    loss = trl_chunked_loss(hidden, head, labels, SimpleNamespace(final_logit_softcapping=softcap))
    loss.backward()
    ref_hidden = hidden.detach().clone().requires_grad_(True)
    logits = head(ref_hidden)[:, :-1].float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    ref = nn.functional.cross_entropy(logits.reshape(-1, 50), labels[:, 1:].reshape(-1))
    ref.backward()
    assert 2 * TRL_CHUNK_TOKENS < 2 * 299  # more than two chunks
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(hidden.grad, ref_hidden.grad)


@pytest.fixture
def tiny_llama(tmp_path):
    return write_llama_config(tmp_path / "llama.json", **TINY)


def _job(path, **changes) -> FineTuneJob:
    base = dict(model=str(path), method="lora", compute_dtype="fp32", batch_size=2, seq_len=300, stack="hf-peft",
                gradient_checkpointing=True, lora=LoraConfig(rank=8, targets=("attention",)))  # fmt: skip
    return FineTuneJob(**(base | changes))


@pytest.mark.parametrize("options", [dict(), dict(gradient_checkpointing=False), dict(method="full")])
def test_simulated_peak_matches_cpu_allocator_and_drops_the_logits(tiny_llama, options) -> None:
    job = _job(tiny_llama, **options)
    simulated = simulate_step(job.with_(stack="hf-peft"), behaviour=TRL, num_layers_to_trace=99, granule_bytes=1)
    measured = measure_step_peak(job.with_(stack="hf-peft"), behaviour=TRL)
    assert abs(simulated.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes
    full = simulate_step(job.with_(stack="hf-peft"), num_layers_to_trace=99, granule_bytes=1)
    fp32_logits = 2 * 300 * TINY["vocab_size"] * 4
    assert full.peak_bytes - simulated.peak_bytes > fp32_logits
    assert any(a.startswith("loss of trl-chunked-nll") for a in simulated.assumptions)


@pytest.mark.parametrize(
    ("changes", "stack", "message"),
    [
        (dict(stack="torchtune"), "torchtune", "runs under stack hf-peft without Liger"),
        (dict(liger_kernel=True), "hf-peft", "runs under stack hf-peft without Liger"),
        (dict(modules_to_save=("lm_head",)), "hf-peft", "lm_head in modules_to_save"),
    ],
)
def test_where_trl_would_not_run_it_is_an_error(tiny_llama, changes, stack, message) -> None:
    with pytest.raises(TunecostError, match=message):
        simulate_step(_job(tiny_llama, **changes).with_(stack=stack), behaviour=TRL, use_cache=False)


def test_trls_own_chunked_loss_matches_the_simulated_one(tiny_llama) -> None:
    """TRL's own code (trl.trainer.sft_trainer, the forward SFTTrainer patches in) on real CPU tensors: the same loss
    as tunecost's function, and the CPU allocator's peak of its step within 3 % of the simulated step's."""
    pytest.importorskip("trl")
    from trl.trainer.sft_trainer import (
        _CHUNKED_LM_HEAD_CHUNK_SIZE,
        _chunked_cross_entropy_loss,
        _patch_chunked_ce_lm_head,
    )

    from tunecost.simulate.measure import profile_step_peak
    from tunecost.simulate.prepare import build_prepared
    from tunecost.simulate.step import make_batch, run_step

    assert _CHUNKED_LM_HEAD_CHUNK_SIZE == TRL_CHUNK_TOKENS
    hidden, head = torch.randn(2, 300, 16), nn.Linear(16, 50, bias=False)
    labels = torch.randint(0, 50, (2, 300))
    theirs = _chunked_cross_entropy_loss(hidden, head.weight, TRL_CHUNK_TOKENS, labels=labels)[0]
    torch.testing.assert_close(trl_chunked_loss(hidden, head, labels, SimpleNamespace()), theirs)

    job = _job(tiny_llama)
    prepared = build_prepared(job.with_(stack="hf-peft"), num_units=None, real=True)
    _patch_chunked_ce_lm_head(prepared.model, chunk_size=_CHUNKED_LM_HEAD_CHUNK_SIZE)
    batch = make_batch(TINY["vocab_size"], job.batch_size, job.worst_case_seq_len, None, 0)
    run_step(prepared, batch)  # warm-up
    measured = profile_step_peak(prepared, batch)
    simulated = simulate_step(job.with_(stack="hf-peft"), behaviour=TRL, num_layers_to_trace=99, granule_bytes=1)
    assert abs(simulated.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes


@pytest.mark.parametrize("loss_code", [LOSS_TRL_CHUNKED, StackBehaviour().loss_code])
def test_trls_activation_offloading_moves_what_forward_and_loss_save(tiny_llama, loss_code) -> None:
    """SFTConfig's activation_offloading: TRL's port of torchtune's OffloadActivations around the whole step, the
    head kept on the device; simulated on fake tensors, it lowers the peak of both losses."""
    job = _job(tiny_llama, gradient_checkpointing=False)
    kept, offloaded = (
        simulate_step(
            job.with_(stack="hf-peft"),
            behaviour=StackBehaviour(loss_code=loss_code, activation_offload=on),
            num_layers_to_trace=99,
            use_cache=False,
        )
        for on in (False, True)
    )
    assert offloaded.peak_bytes < kept.peak_bytes
    assert any(a.startswith("activation offload") for a in offloaded.assumptions)
