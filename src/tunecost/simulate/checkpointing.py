"""Gradient checkpointing as each stack runs it: re-entrant (transformers' default when the Trainer passes no
gradient_checkpointing_kwargs, and LLaMA-Factory's in 2024) or not (torchtune's `checkpoint_wrapper` per layer)."""

from __future__ import annotations

from typing import Any

from tunecost.models.catalog import ModelSpec, resolve_model
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.workload.job import FineTuneJob


def reentrant_checkpointing(job: FineTuneJob, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR) -> bool:
    """True when the job's decoder layers are recomputed by re-entrant torch.utils.checkpoint: the behaviour's
    choice where it makes one (a Trainer passing `gradient_checkpointing_kwargs={"use_reentrant": ...}`), else the
    stack's (transformers' default, and the paper's LLaMA-Factory: re-entrant); BlackMamba checkpoints its blocks
    non-re-entrantly."""
    if not job.gradient_checkpointing or resolve_model(job.model).family == "blackmamba":
        return False
    if behaviour.reentrant_checkpointing is not None:
        return behaviour.reentrant_checkpointing
    return job.stack_spec.reentrant_checkpointing


def enable_checkpointing(model: Any, job: FineTuneJob, spec: ModelSpec, behaviour: StackBehaviour) -> None:
    """Gradient checkpointing per decoder layer, re-entrant or not as the stack runs it."""
    reentrant = reentrant_checkpointing(job, behaviour)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if spec.family == "blackmamba":
        model.gradient_checkpointing_enable()  # its own: non-reentrant per block
    elif enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant and job.method != "full":
        model.enable_input_require_grads()
