"""Activation bytes per decoder layer of meta-llama/Llama-2-70b-hf (full fine-tune, bf16, micro-batch 1, 4096
tokens, flash attention): Korthikanti et al. 2022's GPT form, the same count adapted to the Llama block, and
tunecost's traced step (the single-GPU step at tp 1; at tp 8 the DTensor TP trace, `tp_single_gpu_step`, as traced
and with Megatron's sequence parallelism, `megatron_sp_step`). Numbers in docs/multi-gpu.md, "Activation memory per
layer vs Korthikanti et al. 2022".

Run: PYTHONPATH=src .venv/bin/python benchmarks/korthikanti_activations.py
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from tunecost.distributed.activation_formulas import (
    korthikanti_layer_activation_bytes,
    llama_layer_terms_bytes,
    traced_layer_activation_bytes,
)
from tunecost.distributed.megatron_sp import megatron_sp_step
from tunecost.distributed.model_parallel_comm import model_parallel_collectives
from tunecost.distributed.single_step import single_gpu_step
from tunecost.distributed.tensor_parallel import simulate_tp_rank
from tunecost.distributed.tp_single_step import tp_single_gpu_step
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import ModelParallel, ParallelPlan

MODEL, SEQ, BATCH = "meta-llama/Llama-2-70b-hf", 4096, 1
MIB = 2**20


def _job(recompute: str) -> FineTuneJob:
    return FineTuneJob(
        model=MODEL,
        method="full",
        compute_dtype="bf16",
        batch_size=BATCH,
        seq_len=SEQ,
        gradient_checkpointing=recompute == "full",
        selective_recompute=recompute == "selective",
    )


def _traced(tp: int, sequence_parallel: bool, recompute: str) -> tuple[float, float]:
    """MiB per layer per rank of the traced step: as traced (DTensor's TP at tp > 1) and with Megatron's SP."""
    job = _job(recompute)
    if tp == 1:
        step = single_gpu_step(job)
        return (traced_layer_activation_bytes(step.segments, step.num_layers) / MIB,) * 2
    step = tp_single_gpu_step(job, tp=tp, sequence_parallel=sequence_parallel)
    plan = ModelParallel(tp=tp, sequence_parallel=sequence_parallel, tp_impl="megatron")
    megatron = megatron_sp_step(step, job, plan)
    return tuple(traced_layer_activation_bytes(s.segments, s.num_layers) / MIB for s in (step, megatron))


TINY_VOCAB = 256
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}


def tiny_tp_check(tp: int = 2) -> None:
    """A tiny Llama (2 and 1 layers; seq 64, batch 2, bf16) under DTensor TP on a fake process group
    (`tensor_parallel.simulate_tp_rank`): the peak's activations grow by one layer's from 1 to 2 layers; and the
    2-layer step's recorded collectives against `model_parallel_collectives`."""
    print(f"\ntiny Llama {TINY}, tp {tp}, bf16, seq 64, batch 2: bytes per layer per rank")
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": TINY_VOCAB, **TINY}
    config |= {"max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    dims = dict(h=64, a=4, kv=2, f=128, tp=tp)
    with tempfile.TemporaryDirectory() as tmp:
        for sp in (False, True):
            peaks = []
            for layers in (1, 2):
                path = Path(tmp) / f"tiny-{layers}.json"
                path.write_text(json.dumps({**config, "num_hidden_layers": layers}))
                job = FineTuneJob(
                    model=str(path), method="full", batch_size=2, seq_len=64, gradient_checkpointing=False
                )
                step = simulate_tp_rank(job, tp=tp, sequence_parallel=sp, granule_bytes=1)
                peaks.append(step.breakdown_bytes.get("activations", 0))
            for recompute in (False, True):
                job = FineTuneJob(
                    model=str(path), method="full", batch_size=2, seq_len=64, gradient_checkpointing=recompute
                )
                _compare_collectives(simulate_tp_rank(job, tp=tp, sequence_parallel=sp), tp, sp, recompute)
            megatron = sum(llama_layer_terms_bytes(64, 2, sequence_parallel=sp, **dims).values())
            dtensor = sum(
                llama_layer_terms_bytes(64, 2, sequence_parallel=sp, keeps_gathered_inputs=True, **dims).values()
            )
            print(
                f"  {'TP+SP' if sp else 'TP':<6} traced {peaks[1] - peaks[0]}, Llama form {megatron:.0f}, "
                f"with DTensor's gathered inputs {dtensor:.0f}"
            )


def _compare_collectives(step, tp: int, sp: bool, recompute: bool) -> None:
    """The collectives DTensor TP recorded against `model_parallel_collectives` (recompute counted as backward)."""
    recorded: Counter = Counter()
    for c in step.collectives:
        recorded[c.op, "backward" if c.phase == "recompute" else c.phase, c.nbytes] += 1
    plan = ParallelPlan(num_gpus=tp, strategy="single", tp=tp, sequence_parallel=sp)
    derived: Counter = Counter()
    for c in model_parallel_collectives(
        plan,
        batch=2,
        seq_len=64,
        hidden=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        bytes_per_element=2,
        recompute=recompute,
    ):
        derived[c.op, c.phase, c.nbytes] += c.count
    label = ("TP+SP" if sp else "TP") + (", recompute" if recompute else "")
    print(f"  {label:<16} collectives (op, phase, bytes: calls) recorded == derived: {recorded == derived}")
    if recorded != derived:
        print(f"    recorded {sorted(recorded.items())}\n    derived  {sorted(derived.items())}")


def main() -> None:
    spec = resolve_model(MODEL)
    c = spec.config
    h, a, kv, f = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    dims = dict(h=h, a=a, kv=kv, f=f, d=2)
    sbh = SEQ * BATCH * h
    print(f"{MODEL}: h {h}, heads {a}, kv heads {kv}, MLP {f}; s {SEQ}, b {BATCH}, bf16; MiB per layer per rank")
    print(
        f"{'tp':>3} {'layout':<22} {'GPT form':>10} {'Llama form':>10} {'(DTensor SP)':>12} {'traced':>10} "
        f"{'megatron':>10}"
    )
    rows = [
        (1, False, "none"),
        (1, False, "selective"),
        (1, False, "full"),
        (8, False, "none"),
        (8, True, "none"),
        (8, False, "selective"),
        (8, True, "selective"),
        (8, True, "full"),
    ]
    for tp, sp, recompute in rows:
        gpt = korthikanti_layer_activation_bytes(SEQ, BATCH, h, a, tp=tp, sequence_parallel=sp, recompute=recompute)
        kw = dict(tp=tp, sequence_parallel=sp, recompute=recompute, **dims)
        llama = sum(llama_layer_terms_bytes(SEQ, BATCH, **kw).values())
        dtensor = sum(llama_layer_terms_bytes(SEQ, BATCH, keeps_gathered_inputs=True, **kw).values()) if sp else llama
        traced, megatron = _traced(tp, sp, recompute)
        layout = ("TP+SP" if sp else "TP" if tp > 1 else "one GPU") + ("" if recompute == "none" else f", {recompute}")
        print(
            f"{tp:>3} {layout:<22} {gpt / MIB:10.1f} {llama / MIB:10.1f} {dtensor / MIB:12.1f} {traced:10.1f} "
            f"{megatron:10.1f}"
        )
    print("\nLlama terms in sbh units (tp 1 | tp 8 + SP, Megatron's sharded inputs):")
    one = llama_layer_terms_bytes(SEQ, BATCH, **dims)
    eight = llama_layer_terms_bytes(SEQ, BATCH, tp=8, sequence_parallel=True, **dims)
    for name, value in one.items():
        print(f"  {name:<34} {value / sbh:8.4f} | {eight[name] / sbh:8.4f}")
    print(f"  {'total':<34} {sum(one.values()) / sbh:8.4f} | {sum(eight.values()) / sbh:8.4f}")
    print(f"GPT form at tp 1: 34 + 5as/h = {34 + 5 * a * SEQ / h:.1f} sbh")
    tiny_tp_check()


if __name__ == "__main__":
    main()
