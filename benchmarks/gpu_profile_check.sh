#!/usr/bin/env bash
# GPU checks of `tunecost profile` / `tunecost max-batch`. Run from the repository root on
# a machine with a CUDA GPU (an 80 GB H100/A100 for the full-size part). Nothing is downloaded: the full-size
# Mixtral-8x7B is built from its catalog config with random weights, its experts and attention quantized to nf4
# layer by layer on the GPU (about 25 GB), LoRA r16 on the experts and the router: the paper's QLoRA stack.
#
#   bash benchmarks/gpu_profile_check.sh            # everything (roughly 20-40 minutes on an H100)
#   QUICK=1 bash benchmarks/gpu_profile_check.sh    # tiny model + 4-layer Mixtral-8x7B cut only (a few minutes)
#
# After step 2 the wall vs GPU-busy time per step of the profiled points is printed (the GPU profile itself:
# `bash benchmarks/gpu_batch.sh calibrate`).
# Record the printed tables with the device, date and command in docs/gpu-measurements.md.
set -euo pipefail

TC=${TC:-.venv/bin/tunecost}
OUT=${OUT:-runs/gpu-profile-check}
SEQ=${SEQ:-128}            # the paper's latency / kernel runs used random ids at sequence length 128
DATASET=${DATASET:-}       # e.g. commonsense_15k (needs $TUNECOST_DATA_DIR): the CS sweep on real lengths
mkdir -p "$OUT"

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
${PY:-.venv/bin/python} - <<'PY'
import torch, transformers, peft, bitsandbytes
print("torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__,
      "| peft", peft.__version__, "| bitsandbytes", bitsandbytes.__version__)
assert torch.cuda.is_available(), "no CUDA device"
PY
date -u +"date: %Y-%m-%dT%H:%M:%SZ"

input_args=(--seq-len "$SEQ")
if [[ -n "$DATASET" ]]; then input_args=(--dataset "$DATASET"); fi

echo "== 1. tiny-mixtral QLoRA on CUDA: every record kind (CUDA events, CUDA kernel classes, measured-cuda memory)"
$TC profile --model tiny-mixtral --method qlora --experts-per-token 2,8 --batch-sizes 1,2,4 --steps 3 \
  --device cuda --out "$OUT/tiny-mixtral-qlora"

echo "== 2. Mixtral-8x7B (random weights) QLoRA, first 4 layers: the per-layer / kernel breakdown path at full width"
$TC profile --model mixtral-8x7b --random-weights --method qlora --num-layers 4 --experts-per-token 2,8 \
  --batch-sizes 1,10 "${input_args[@]}" --steps 3 --device cuda --out "$OUT/mixtral-8x7b-4layers-qlora"

echo "== host vs GPU time per step (wall_step_seconds vs gpu_busy_step_seconds in throughput.jsonl)"
${PY:-.venv/bin/python} - "$OUT/tiny-mixtral-qlora" "$OUT/mixtral-8x7b-4layers-qlora" <<'PY'
import sys
from tunecost.estimate.throughput.measured_split import read_measured_split
for run in sys.argv[1:]:
    for s in read_measured_split(run):
        busy = s.gpu_busy_step_seconds
        print(f"{s.model} {s.method} top-{s.experts_per_token} batch {s.batch_size} on {s.gpu}: wall {s.wall_step_seconds*1e3:.1f} ms, "
              f"GPU-busy {'-' if busy is None else f'{busy*1e3:.1f} ms'} ({'-' if busy is None else f'{busy/s.wall_step_seconds:.0%}'})")
PY

if [[ -n "${QUICK:-}" ]]; then exit 0; fi

echo "== 3. The paper's Mixtral-CS sparse batch-size sweep shape: full-size Mixtral-8x7B QLoRA, top-2"
# Paper Fig. 8 / Table III: sparse Mixtral on CS ran at batch 1..8 on an A40 (48 GB); an 80 GB GPU fits more.
$TC profile --model mixtral-8x7b --random-weights --method qlora --experts-per-token 2 \
  --batch-sizes 1,2,4,8,10,16,32 "${input_args[@]}" --steps 3 --device cuda --out "$OUT/mixtral-8x7b-sparse"

echo "== 4. Dense (top-8) at the paper's dense batch sizes"
$TC profile --model mixtral-8x7b --random-weights --method qlora --experts-per-token 8 --batch-sizes 1,2,10 \
  "${input_args[@]}" --steps 3 --device cuda --out "$OUT/mixtral-8x7b-dense"

echo "== 5. Max batch size, measured with OOM caught, within an A40's 48 GB (Table III) at the paper's cutoff 1024"
for k in 2 8; do
  $TC max-batch --model mixtral-8x7b --random-weights --method qlora --experts-per-token "$k" --seq-len 1024 \
    --gpu A40 --device cuda --out "$OUT/max-batch"
done

echo "records under $OUT (overhead.jsonl: layer-hooks ratio, target <= 1.03 on GPU)"
