#!/usr/bin/env bash
# Every GPU check tunecost has, in one command per device call (each part ends well inside 10 minutes).
#
# On this machine, once:   bash benchmarks/gpu_wheels.sh        # wheels the GPU image lacks, into .whl/ (ignored)
# On the GPU machine:      bash benchmarks/gpu_batch.sh PART     # PART: env | tests | profile | memory | moe |
#                                                               #       counters | calibrate | throughput | ranks | gptq |
#                                                               #       compile | all
# Output goes to $OUT (the device tool's folder) or runs/gpu-batch/; paste the tables into docs/gpu-measurements.md
# with the date, device and versions the `env` part prints.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:-all}
OUT=${OUT:-runs/gpu-batch}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# A venv when there is one (a user's GPU machine); else the image's python3 with the carried wheels and src/.
if [[ -x .venv/bin/python ]]; then
  PY=.venv/bin/python
else
  PY=python3
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "gpu_batch: wheel install failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD/src
  else
    export PYTHONPATH=$PWD/src
  fi
fi
TC=("$PY" -m tunecost.cli.main)

run() {  # run NAME CMD...: log to $OUT/NAME.log, keep going on failure, print the exit code
  local name=$1; shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}

part_env() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  "$PY" - <<'PY'
import importlib
import torch
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA DEVICE"
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", device)
try:  # the host CPU: its single-thread speed scales the host time of an eager step (catalog/data/host_cpus.csv)
    with open("/proc/cpuinfo") as cpuinfo:
        print("host cpu", next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")))
except (OSError, StopIteration) as exc:
    print("host cpu NOT READ:", exc)
for name in ("transformers", "peft", "bitsandbytes", "accelerate"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # report, do not stop the batch
        print(name, "NOT IMPORTABLE:", exc)
PY
}
part_tests() { run pytest-gpu "$PY" -m pytest -q -m gpu -p no:cacheprovider tests; }
part_profile() { QUICK=1 TC="${TC[*]}" PY="$PY" run profile bash benchmarks/gpu_profile_check.sh; }
part_memory() { run memory "$PY" benchmarks/gpu_memory_check.py; }
part_moe() {
  run moe-cli "${TC[@]}" bench moe --device cuda --tokens 2048
  run moe-bench "$PY" benchmarks/bench_moe.py --device cuda
}
part_counters() { run counters "${TC[@]}" gpu-counters --model tiny-mixtral --batch-sizes 1,4 --out "$OUT/counters"; }
part_calibrate() { run calibrate "${TC[@]}" calibrate-gpu --device cuda --out "$OUT/gpu-profile.json" --force; }
part_ranks() {  # one-rank FSDP2 and DDP through the elastic launcher on NCCL (several ranks need several GPUs)
  for strategy in fsdp2 ddp; do
    run "ranks-$strategy" "${TC[@]}" profile --out "$OUT/ranks" --model tiny-mixtral --method lora --random-weights \
      --device cuda --nproc-per-node 1 --strategy "$strategy" --batch-sizes 4 --seq-len 128 --steps 3
  done
}
part_gptq() { run gptq "$PY" benchmarks/bench_gptq_dequant.py --device cuda; }
part_throughput() { run throughput "$PY" benchmarks/gpu_throughput_check.py --model mixtral-8x7b --batch-sizes 1,2,4,8 --seq-len 128; }
part_compile() { run compile "$PY" benchmarks/gpu_compile_check.py --model llama-3.2-1b --batch 4 --seq-len 2048 --json "$OUT/compile.json"; }

case "$PART" in
  env|tests|profile|memory|moe|counters|calibrate|throughput|ranks|gptq|compile) part_env; "part_$PART" ;;
  all) part_env; for p in tests profile memory moe counters calibrate throughput ranks gptq compile; do "part_$p"; done ;;
  *) echo "gpu_batch: unknown part '$PART'" >&2; exit 2 ;;
esac
