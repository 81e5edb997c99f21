#!/usr/bin/env bash
# Wheels that a bare GPU image (Python 3.12, its own CUDA torch, transformers, peft, accelerate) lacks or has at
# other versions than constraints.txt, downloaded here into .whl/ (git-ignored) so they can travel with the tree:
#   bash benchmarks/gpu_wheels.sh && bash benchmarks/gpu_batch.sh PART   (on the GPU machine, with .whl carried)
# About 61 MB: bitsandbytes is 43 MB of it, liger-kernel, trl and fla-core (pure Python) about 1 MB each.
# mistral-common (the offline Mixtral tokenizer, 6.5 MB) is left out to stay under a 64 MiB transfer; the GPU checks
# use random token ids and need no tokenizer. causal-conv1d has no wheel on PyPI (a CUDA build), so the Qwen3.5 case
# runs transformers' PyTorch convolution.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pins=()
for name in bitsandbytes transformers peft typer rich liger-kernel trl fla-core einops; do
  pins+=("$(grep -i "^${name}==" constraints.txt)")
done
platforms=()
for n in 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
ls -la .whl
