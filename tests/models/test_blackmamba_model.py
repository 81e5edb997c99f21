"""The BlackMamba model: Zyphra's key layout, routing semantics, causality, checkpointing, and training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tunecost.errors import TunecostError
from tunecost.models.blackmamba import (
    BlackMambaConfig,
    BlackMambaRMSNorm,
    MambaMixer,
    MoEMixer,
    build_blackmamba,
    tiny_blackmamba_config,
)

VOCAB = 512  # a small vocabulary keeps the output layer cheap on CPU; everything else is the tiny preset


def _tiny(**overrides) -> BlackMambaConfig:
    return tiny_blackmamba_config(vocab_size=VOCAB, **overrides)


def _ids(batch=2, seqlen=24, seed=0):
    return torch.randint(0, VOCAB, (batch, seqlen), generator=torch.Generator().manual_seed(seed))


def _zyphra_keys(cfg: BlackMambaConfig) -> set[str]:
    """The state-dict keys of Zyphra's released checkpoints, written out from their layout."""
    keys = {"embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "decoder.final_layernorm.bias"}
    for i, kind in enumerate(cfg.mamba_moe_layers):
        p = f"decoder.layers.{i}."
        keys.add(p + "norm.weight")
        if kind == "r":
            keys |= {
                p + "mixer." + k
                for k in (
                    "in_proj.weight",
                    "conv1d.weight",
                    "conv1d.bias",
                    "x_proj.weight",
                    "dt_proj.weight",
                    "dt_proj.bias",
                    "A_log",
                    "D",
                    "out_proj.weight",
                )
            }
        else:
            keys |= {p + "mixer.router.weight", p + "mixer.router.bias"}
            keys |= {f"{p}mixer.local_experts.{e}.linear_fc{j}.weight" for e in range(int(kind)) for j in (1, 2)}
    return keys


def test_state_dict_keys_and_shapes_are_zyphras():
    cfg = _tiny()
    sd = build_blackmamba(cfg, device="meta").state_dict()
    assert set(sd) == _zyphra_keys(cfg)
    h, di, n, r = cfg.hidden_size, cfg.d_inner, cfg.state_size, cfg.dt_rank
    assert sd["decoder.layers.0.mixer.in_proj.weight"].shape == (2 * di, h)
    assert sd["decoder.layers.0.mixer.conv1d.weight"].shape == (di, 1, cfg.conv_dimension)
    assert sd["decoder.layers.0.mixer.x_proj.weight"].shape == (r + 2 * n, di)
    assert sd["decoder.layers.0.mixer.A_log"].shape == (di, n)
    assert sd["decoder.layers.1.mixer.local_experts.0.linear_fc1.weight"].shape == (2 * cfg.ffn_hidden_size, h)
    assert sd["decoder.layers.1.mixer.router.weight"].shape == (8, h)


def test_module_kinds_for_profilers():
    model = build_blackmamba(_tiny(), device="meta")
    kinds = [(type(layer.norm), type(layer.mixer), layer.layer_type) for layer in model.decoder.layers]
    assert kinds == [(BlackMambaRMSNorm, MambaMixer, "mamba"), (BlackMambaRMSNorm, MoEMixer, "moe")] * 2
    assert len(model.mamba_mixers()) == 2 and len(model.moe_mixers()) == 2


def test_loss_is_the_shifted_cross_entropy_and_output_is_tied():
    model = build_blackmamba(_tiny(), seed=0)
    ids = _ids()
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, 24, VOCAB)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert out[0] is out.loss and out["logits"] is out.logits  # indexable as trainers do
    assert "output_layer.weight" not in model.state_dict()
    masked = ids.clone()
    masked[:, 10:] = -100  # ignored positions (padding) do not count
    expected = F.cross_entropy(out.logits[:, :9].reshape(-1, VOCAB), ids[:, 1:10].reshape(-1))
    torch.testing.assert_close(model(ids, labels=masked).loss, expected)


def test_is_causal():
    model = build_blackmamba(_tiny(), seed=0).eval()
    ids = _ids(seqlen=20)
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 7) % VOCAB
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def _zyphra_switch_mlp(mixer: MoEMixer, x: torch.Tensor) -> torch.Tensor:
    """Zyphra's SwitchMLP.forward (switch_mlp.py), restated: sigmoid scores, top-1, output times its score."""
    flat = x.reshape(-1, x.shape[-1])
    max_prob, max_ind = torch.sigmoid(mixer.router(flat)).max(dim=1)
    out = torch.zeros_like(flat)
    for e, expert in enumerate(mixer.local_experts):
        idx = (max_ind == e).nonzero().squeeze(-1)
        out[idx] = expert(flat[idx])
    return (out * max_prob.unsqueeze(1)).reshape(x.shape)


def _dense_reference(mixer: MoEMixer, x: torch.Tensor) -> torch.Tensor:
    scores = torch.sigmoid(mixer.router(x))
    return sum(scores[..., e : e + 1] * expert(x) for e, expert in enumerate(mixer.local_experts))


def test_moe_routing_top1_is_zyphras_and_top8_is_the_score_weighted_sum():
    torch.manual_seed(0)
    model = build_blackmamba(_tiny(), seed=0)
    mixer = model.moe_mixers()[0]
    x = torch.randn(2, 10, 128)
    with torch.no_grad():
        model.set_experts_per_token(1)
        torch.testing.assert_close(mixer(x), _zyphra_switch_mlp(mixer, x))
        model.set_experts_per_token(8)
        torch.testing.assert_close(mixer(x), _dense_reference(mixer, x), rtol=1e-5, atol=1e-6)
    assert model.config.experts_per_token == 8
    with pytest.raises(TunecostError):
        model.set_experts_per_token(9)


def test_top_k_alias_for_generic_routers():
    model = build_blackmamba(_tiny(experts_per_token=2), seed=0)
    for module in model.modules():  # what code written for transformers' MoE blocks does
        if isinstance(getattr(module, "top_k", None), int):
            module.top_k = 8
    assert [m.experts_per_token for m in model.moe_mixers()] == [8, 8]


def test_router_logits_and_token_counts():
    model = build_blackmamba(_tiny(experts_per_token=2), seed=0)
    out = model(_ids(batch=2, seqlen=24), output_router_logits=True)
    assert len(out.router_logits) == len(out.tokens_per_expert) == 2  # one per MoE layer
    for logits, counts in zip(out.router_logits, out.tokens_per_expert):
        assert logits.shape == (48, 8) and counts.shape == (8,)
        assert int(counts.sum()) == 48 * 2
        chosen = torch.sigmoid(logits).topk(2, dim=-1).indices
        assert torch.equal(counts, torch.bincount(chosen.flatten(), minlength=8))
    plain = model(_ids(batch=2, seqlen=24))
    assert plain.router_logits is None
    torch.testing.assert_close(plain.logits, out.logits)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(reentrant):
    ids = _ids()
    grads = []
    for checkpointing in (False, True):
        model = build_blackmamba(_tiny(), seed=0).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            model.enable_input_require_grads()
        loss = model(ids, labels=ids, output_router_logits=True).loss
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b)


def test_residual_stream_is_fp32_under_bf16():
    model = build_blackmamba(_tiny(), seed=0, dtype=torch.bfloat16)
    hidden = model.embedding(_ids(seqlen=8))
    out, residual, _ = model.decoder.layers[0](hidden)
    assert hidden.dtype == torch.bfloat16 and out.dtype == torch.bfloat16 and residual.dtype == torch.float32
    assert model(_ids(seqlen=8)).logits.dtype == torch.bfloat16


def test_full_size_model_builds_on_meta_without_memory():
    from tunecost.models.blackmamba.config import config_from_spec
    from tunecost.models.catalog import model_catalog

    cfg = config_from_spec(model_catalog()["blackmamba-2.8b"])  # Zyphra's 2.8B config.json
    assert cfg.num_layers == 36 and cfg.hidden_size == 1472 and cfg.mamba_moe_layers == ("r", "8") * 18
    model = build_blackmamba(cfg, device="meta", dtype=torch.bfloat16)
    p = next(model.parameters())
    assert p.is_meta and p.dtype == torch.bfloat16
    with torch.device("meta"):  # an enclosing device context is honoured when no device is given
        assert all(p.is_meta for p in build_blackmamba(cfg).parameters())


@pytest.mark.parametrize("top_k", [2, 8])
def test_training_loss_decreases_over_20_adamw_steps(top_k):
    torch.manual_seed(0)
    model = build_blackmamba(_tiny(experts_per_token=top_k), seed=0).train()
    ids = _ids(batch=2, seqlen=32, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, torch.tensor(losses)))
    # Memorising one fixed batch from ln(512) = 6.2: measured 6.23 -> 0.21 (top-2) and 6.23 -> 0.16 (top-8).
    assert losses[-1] < 0.5 * losses[0] and losses[-1] == min(losses), losses
