"""BlackMamba for causal language modelling (Anthony et al., 2024, arXiv:2402.01771), in plain PyTorch.

Sources and derivations: docs/models.md, section `tunecost.models.blackmamba.model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tunecost.errors import TunecostError
from tunecost.models.blackmamba.config import BlackMambaConfig
from tunecost.models.blackmamba.layers import BlackMambaBlock, MambaMixer, MoEMixer, RouterInfo


@dataclass
class BlackMambaOutput:
    """Like transformers' MoeCausalLMOutput: `router_logits` and `tokens_per_expert` hold one entry per MoE
    layer ((tokens, E) logits before the sigmoid; (E,) counts of routed tokens) when asked for."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    router_logits: tuple[torch.Tensor, ...] | None = None
    tokens_per_expert: tuple[torch.Tensor, ...] | None = None

    def to_tuple(self) -> tuple:
        """The fields that are set, loss first, as transformers' ModelOutput.to_tuple orders them."""
        fields = (self.loss, self.logits, self.router_logits, self.tokens_per_expert)
        return tuple(f for f in fields if f is not None)

    def __getitem__(self, key: int | str):
        """out["loss"] or out[0] (the loss when labels were given), as trainers index model outputs."""
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]


class BlackMambaEmbedding(nn.Module):
    def __init__(self, config: BlackMambaConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(input_ids)


class TiedOutputLayer(nn.Module):
    """logits = hidden @ embedding^T. Holds no parameter (so no extra state-dict key); a module to hook."""

    def forward(self, hidden_states: torch.Tensor, embedding_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, embedding_weight)


class BlackMambaDecoder(nn.Module):
    def __init__(self, config: BlackMambaConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(BlackMambaBlock(config, i) for i in range(config.num_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon, bias=True)
        self.gradient_checkpointing = False
        self.checkpoint_use_reentrant = False

    def forward(
        self, hidden_states: torch.Tensor, output_router_logits: bool = False
    ) -> tuple[torch.Tensor, list[RouterInfo]]:
        residual = None
        infos: list[RouterInfo] = []
        for layer in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hidden_states, residual, info = checkpoint(
                    layer, hidden_states, residual, output_router_logits, use_reentrant=self.checkpoint_use_reentrant
                )
            else:
                hidden_states, residual, info = layer(hidden_states, residual, output_router_logits)
            if info is not None:
                infos.append(info)
        residual = hidden_states if residual is None else hidden_states + residual
        return self.final_layernorm(residual.to(self.final_layernorm.weight.dtype)), infos


class BlackMambaForCausalLM(nn.Module):
    """BlackMamba with its tied LM head. `forward(input_ids, labels=None)` -> `BlackMambaOutput`."""

    def __init__(self, config: BlackMambaConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = BlackMambaEmbedding(config)
        self.decoder = BlackMambaDecoder(config)
        self.output_layer = TiedOutputLayer()

    @property
    def layer_types(self) -> tuple[str, ...]:
        return self.config.layer_types

    def mamba_mixers(self) -> list[MambaMixer]:
        return [layer.mixer for layer in self.decoder.layers if isinstance(layer.mixer, MambaMixer)]

    def moe_mixers(self) -> list[MoEMixer]:
        return [layer.mixer for layer in self.decoder.layers if isinstance(layer.mixer, MoEMixer)]

    def set_experts_per_token(self, k: int) -> None:
        """Route top-k from now on (sparse k=2, dense k=num_experts in the paper); updates `config` too."""
        self.config = self.config.with_experts_per_token(k)  # validates k
        for mixer in self.moe_mixers():
            mixer.experts_per_token = k

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each block in the backward instead of keeping its activations (training mode only).
        Non-reentrant unless `gradient_checkpointing_kwargs={"use_reentrant": True}` (transformers' API; the
        reentrant kind needs an input that requires grad: see `enable_input_require_grads`)."""
        self.decoder.gradient_checkpointing = True
        self.decoder.checkpoint_use_reentrant = bool((gradient_checkpointing_kwargs or {}).get("use_reentrant"))

    def gradient_checkpointing_disable(self) -> None:
        self.decoder.gradient_checkpointing = False

    def enable_input_require_grads(self) -> None:
        """Make the embedding output require grad (transformers' API), for reentrant checkpointing with frozen
        embeddings (LoRA)."""
        if getattr(self, "_input_grads_hook", None) is not None:
            return

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            output.requires_grad_(True)

        self._input_grads_hook = self.embedding.register_forward_hook(hook)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_router_logits: bool = False,
    ) -> BlackMambaOutput:
        """`labels` are shifted inside (predict token t+1 from tokens <= t); -100 is ignored. There is no
        attention: `attention_mask` is accepted for trainer compatibility and unused (pad on the right and
        mask the padding with -100 labels)."""
        del attention_mask
        hidden = self.embedding(input_ids)
        hidden, infos = self.decoder(hidden, output_router_logits)
        logits = self.output_layer(hidden, self.embedding.word_embeddings.weight)
        loss = None
        if labels is not None:  # shift the labels, not the logits: slicing logits copies them twice in backward
            targets = F.pad(labels[:, 1:], (0, 1), value=-100)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        if not output_router_logits:
            return BlackMambaOutput(logits=logits, loss=loss)
        return BlackMambaOutput(
            logits=logits,
            loss=loss,
            router_logits=tuple(i[0] for i in infos),
            tokens_per_expert=tuple(i[1] for i in infos),
        )


@torch.no_grad()
def init_blackmamba_weights(model: BlackMambaForCausalLM, initializer_range: float = 0.02) -> None:
    """Zyphra's random init (`mamba_model.py::_init_weights` and `MambaLayer.__init__`): PyTorch default
    Linear/Conv init with zero biases (dt_proj's excepted), embedding N(0, 0.02), the Mamba SSM init, and
    out_proj rescaled by 1/sqrt(num_layers) (GPT-2's residual scaling)."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, initializer_range)
    for mixer in model.mamba_mixers():
        mixer.reset_ssm_parameters()
        nn.init.kaiming_uniform_(mixer.out_proj.weight, a=math.sqrt(5))
        mixer.out_proj.weight /= math.sqrt(model.config.num_layers)


def build_blackmamba(
    config: BlackMambaConfig,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    seed: int | None = None,
) -> BlackMambaForCausalLM:
    """A randomly initialised BlackMamba on `device` (None: the ambient default device, so an enclosing
    `with torch.device("meta"):` is honoured). On the meta device nothing is allocated or initialised: shapes
    only, for parameter counts, memory estimates, or loading a checkpoint with `assign=True`."""
    if not isinstance(config, BlackMambaConfig):
        raise TunecostError(f"build_blackmamba needs a BlackMambaConfig, got {type(config).__name__}")
    if seed is not None:
        torch.manual_seed(seed)
    if device is None:
        model = BlackMambaForCausalLM(config)
    else:
        with torch.device(device):
            model = BlackMambaForCausalLM(config)
    if not model.embedding.word_embeddings.weight.is_meta:
        init_blackmamba_weights(model)
    if dtype is not None:
        model.to(dtype=dtype)
    return model
