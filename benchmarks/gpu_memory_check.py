"""Simulated peak vs `torch.cuda.max_memory_allocated` on a CUDA GPU (target: within 5 %).

For each configuration: build the model with random weights on the GPU through the same code the simulator uses
(tunecost.simulate.prepare: the same LoRA / 4-bit modules, bitsandbytes quantizing the weights), run one warm-up
training step, reset the peak counter, run one more step and read `torch.cuda.max_memory_allocated()`. The
simulation of the same job (full depth, 512-byte granules, no device overhead) is printed beside it, and so are
`torch.cuda.max_memory_reserved` beside the simulator's replay of the caching allocator (`peak_reserved_bytes`),
and the whole-device use from `torch.cuda.mem_get_info` beside that replay plus the assumed CUDA context.

Run on a GPU machine: .venv/bin/python benchmarks/gpu_memory_check.py [--configs all|NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures" / "simulate"
GIB = 2**30

# A mid-size Mixtral-like model (4 layers of Mixtral-8x7B's width with smaller experts): ~1.6 B parameters.
MID_MIXTRAL = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 3584,
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


# A mid-size Llama-3-like dense model (4 layers of Llama-3-8B's width and its 128256-token vocabulary, so the logits
# weigh as in the real model): ~1.9 B parameters, for the torchtune stack.
MID_LLAMA = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}

# Qwen3.5 at its 9B-style width (transformers 5.23's Qwen3_5TextConfig defaults), 4 layers: three gated DeltaNet
# layers (fla's chunked delta rule, which `gpu_wheels.sh` carries) and one gated attention layer.
MID_QWEN3_5 = {"model_type": "qwen3_5_text", "num_hidden_layers": 4, "tie_word_embeddings": False}

MID = "mid-mixtral"  # MID_MIXTRAL, written to a temporary config file for the run
MID_DENSE = "mid-llama"  # MID_LLAMA, likewise
MID_HYBRID = "mid-qwen3_5"  # MID_QWEN3_5, likewise
# One configuration a row: its name, then the FineTuneJob fields named in FIELDS.
FIELDS = ("model", "method", "experts_per_token", "batch_size", "seq_len", "gradient_checkpointing")
CASES = [
    ("tiny-qlora-top2", "tiny-mixtral", "qlora", 2, 8, 256, True),
    ("small-full-top8", str(CONFIGS / "small-mixtral.json"), "full", 8, 8, 256, False),
    ("mid-qlora-top2", MID, "qlora", 2, 4, 512, True),
    ("mid-lora-dense-nockpt", MID, "lora", 8, 2, 256, False),
    ("olmoe-like-qlora", str(CONFIGS / "tiny-olmoe.json"), "qlora", 4, 16, 256, True),
    ("tt-mid-llama-full", MID_DENSE, "full", None, 2, 2048, True),
    ("tt-mid-llama-full-chunked-optbwd", MID_DENSE, "full", None, 2, 2048, True),
    ("tt-mid-llama-qlora-chunked", MID_DENSE, "qlora", None, 4, 2048, True),
    ("mid-llama-int8-lora", MID_DENSE, "qlora", None, 4, 1024, True),
    ("mid-llama-int8-lora-reentrant", MID_DENSE, "qlora", None, 4, 1024, True),
    ("mid-llama-liger-lora", MID_DENSE, "lora", None, 4, 2048, True),
    ("mid-llama-liger-full", MID_DENSE, "full", None, 2, 2048, True),
    ("mid-llama-trl-chunked-lora", MID_DENSE, "lora", None, 4, 2048, True),
    ("mid-qwen3_5-lora", MID_HYBRID, "lora", None, 4, 2048, True),
]
# FineTuneJob fields beyond FIELDS. The 8-bit cases run bitsandbytes' own MatMul8bitLt on the simulator's int8
# codes (`_bitsandbytes_int8`): its CUDA kernels, not tunecost's model of them, set the measured peak.
# The Liger cases run liger-kernel's own Triton kernels, bound by `_apply_liger_kernel_to_instance` as the HF Trainer
# binds them (`_real_liger`), against the simulator's functions that keep what they keep.
JOB_EXTRAS = {
    "mid-llama-int8-lora": {"quant_type": "int8", "lora": ("attention", "mlp")},
    "mid-llama-int8-lora-reentrant": {"quant_type": "int8", "lora": ("attention", "mlp")},
    "mid-llama-liger-lora": {"liger_kernel": True, "lora": ("attention", "mlp")},
    "mid-llama-liger-full": {"liger_kernel": True, "lora": ("attention", "mlp")},
    "mid-llama-trl-chunked-lora": {"lora": ("attention", "mlp")},
    # measured with fla's kernel and transformers' PyTorch convolution, simulated with causal-conv1d's (which keeps
    # less: its input only): the simulated peak may fall below the measured one by a layer's saved conv output
    "mid-qwen3_5-lora": {"lora": ("attention", "mlp")},
}
# The software stack of a configuration (default: tunecost's own) and its recipe options (`StackBehaviour` fields).
STACKS = {
    "tt-mid-llama-full": ("torchtune", {}),
    "tt-mid-llama-full-chunked-optbwd": (
        "torchtune",
        {"loss_code": "torchtune-chunked", "optimizer_in_backward": True},
    ),
    "tt-mid-llama-qlora-chunked": ("torchtune", {"loss_code": "torchtune-chunked"}),
    "mid-llama-int8-lora-reentrant": ("hf-peft", {}),
    # TRL's chunked_nll: measured on TRL's own patched forward (`_real_trl_chunked`)
    "mid-llama-trl-chunked-lora": ("hf-peft", {"loss_code": "trl-chunked-nll"}),
}


def _configs(paths: dict[str, str]) -> dict[str, dict]:
    return {name: dict(zip(FIELDS, (paths.get(model, model), *fields), strict=True)) for name, model, *fields in CASES}


def _bitsandbytes_int8(model) -> int:
    """Route every int8 linear of a prepared model through `bitsandbytes.matmul` (MatMul8bitLt on CUDA, threshold
    6 as transformers' load_in_8bit) on the same codes. Returns how many linears."""
    import types

    import bitsandbytes as bnb
    from bitsandbytes.autograd._functions import MatmulLtState

    from tunecost.simulate.modules import SimLinear

    def base(self, x):
        state = MatmulLtState()
        state.CB, state.SCB = self.qweight.CB[0], self.qweight.SCB[0]
        state.threshold, state.has_fp16_weights, state.is_training = 6.0, False, True
        return bnb.matmul(x, self.qweight.CB[0], state=state, threshold=6.0, bias=self.bias)

    linears = [m for m in model.modules() if isinstance(m, SimLinear) and m.qweight is not None]
    for m in linears:
        m._base = types.MethodType(base, m)
    return len(linears)


def _real_liger(model) -> None:
    """Liger's kernels on the model as `Trainer(use_liger_kernel=True)` applies them (liger-kernel must be installed:
    benchmarks/gpu_wheels.sh carries its wheel)."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=model)


def _real_trl_chunked(model) -> None:
    """TRL's chunked_nll as SFTTrainer patches it into the model's forward (trl must be installed)."""
    from trl.trainer.sft_trainer import _CHUNKED_LM_HEAD_CHUNK_SIZE, _patch_chunked_ce_lm_head

    _patch_chunked_ce_lm_head(model, chunk_size=_CHUNKED_LM_HEAD_CHUNK_SIZE)


def measure_cuda(job, stack: str = "tunecost", behaviour=None) -> dict:
    import torch

    from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR
    from tunecost.simulate.prepare import build_prepared
    from tunecost.simulate.step import make_batch, run_step

    torch.cuda.empty_cache()
    behaviour = behaviour or DEFAULT_BEHAVIOUR
    liger = job.liger_kernel  # the real kernels instead of the simulator's: the model's forward is Liger's
    job = job.with_(liger_kernel=False) if liger else job
    trl = behaviour.loss_code == "trl-chunked-nll"  # TRL's own forward instead of the simulator's copy
    behaviour = DEFAULT_BEHAVIOUR if trl else behaviour
    prepared = build_prepared(job.with_(stack=stack), num_units=None, behaviour=behaviour, real=True, device="cuda")
    if trl:
        _real_trl_chunked(prepared.model)
    if job.method == "qlora" and job.quant_type == "int8":
        _bitsandbytes_int8(prepared.model)
    if liger:
        _real_liger(prepared.model)
    batch = make_batch(
        int(prepared.model.config.vocab_size), job.batch_size, job.worst_case_seq_len, None, device="cuda"
    )
    run_step(prepared, batch)  # warm-up (cuBLAS handles, lazy buffers)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run_step(prepared, batch)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    out = {
        "max_allocated": torch.cuda.max_memory_allocated(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "device_used": total - free,
    }
    del prepared, batch
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="all")
    parser.add_argument("--json", dest="json_out", help="also write the rows to this JSON file")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from tunecost.simulate import simulate_step
    from tunecost.simulate.behaviour import StackBehaviour
    from tunecost.workload.job import FineTuneJob, LoraConfig

    with tempfile.TemporaryDirectory() as tmp:
        models = {MID: MID_MIXTRAL, MID_DENSE: MID_LLAMA, MID_HYBRID: MID_QWEN3_5}
        paths = {name: os.path.join(tmp, f"{name}.json") for name in models}
        for name, config in models.items():
            Path(paths[name]).write_text(json.dumps(config))
        configs = _configs(paths)
        names = list(configs) if args.configs == "all" else args.configs.split(",")
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        print(
            f"{'config':24} {'simulated GiB':>14} {'max_alloc GiB':>14} {'error':>8} {'replayed res GiB':>17} "
            f"{'max_reserved GiB':>17} {'sim device GiB':>15} {'device used GiB':>16}"
        )
        rows = []
        for name in names:
            spec = configs[name]
            stack, options = STACKS.get(name, ("tunecost", {}))
            behaviour = StackBehaviour(**options)
            extras = dict(JOB_EXTRAS.get(name, {}))
            dense = stack == "torchtune" or "lora" in extras
            targets = extras.pop("lora", ("attention", "mlp"))
            lora = LoraConfig(rank=16, targets=targets) if dense else LoraConfig(rank=16)
            job = FineTuneJob(compute_dtype="bf16", lora=lora, **spec, **extras)
            sim = simulate_step(job.with_(stack=stack), num_layers_to_trace=999, behaviour=behaviour, use_cache=False)
            real = measure_cuda(job, stack, behaviour)
            err = sim.peak_bytes / real["max_allocated"] - 1
            device = sim.peak_reserved_bytes + sim.device_overhead_bytes
            rows.append(
                {
                    "config": name,
                    "stack": stack,
                    **options,
                    **spec,
                    "simulated": sim.peak_bytes,
                    **real,
                    "error": err,
                    "simulated_reserved": sim.peak_reserved_bytes,
                    "reserved_error": sim.peak_reserved_bytes / real["max_reserved"] - 1,
                    "simulated_device": device,
                }
            )
            print(
                f"{name:24} {sim.peak_bytes / GIB:14.3f} {real['max_allocated'] / GIB:14.3f} {100 * err:7.2f}% "
                f"{sim.peak_reserved_bytes / GIB:17.3f} {real['max_reserved'] / GIB:17.3f} "
                f"{device / GIB:15.3f} {real['device_used'] / GIB:16.3f}",
                flush=True,
            )
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
