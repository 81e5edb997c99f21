"""benchmarks/gpu_compile_check.py on a CPU: a tiny Llama's full fine-tune step eager and under torch.compile
(dynamo's eager backend: no C++ build), beside the counts' predicted speed-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128}
TINY |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}
TINY |= {"max_position_embeddings": 512, "tie_word_embeddings": False}


@pytest.mark.long  # CI runs it (7-15 s of work no other test shares)
def test_the_check_prints_predicted_and_measured_speed_ups(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "compile.json"
    args = ["--model", str(config), "--device", "cpu", "--backend", "eager", "--gpu", "A100-80GB"]
    args += ["--batch", "2", "--seq-len", "32", "--steps", "1", "--warmup", "1", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_compile_check.py"), *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src"), **__import__("os").environ},
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    predicted, measured = figures["predicted"], figures["measured"]
    assert predicted["compiled"] < predicted["eager"]  # the fused element-wise chains
    assert all(s > 0 for s in measured.values())
    assert "predicted" in done.stdout and "measured" in done.stdout and "speed-up" in done.stdout
