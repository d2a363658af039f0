#!/usr/bin/env bash
# `specdec serve --device cuda` under load, for a second lent GPU session (scripts/gpu_run.sh is the
# first): random weights in Qwen2.5-Coder-1.5B's and 0.5B's shapes (scripts/random_models.py), so drafts
# are almost never accepted, and the check is that the adaptive policy turns drafting off and costs at most
# 3% against speculation off, at concurrency 1, 4 and 16, with CUDA graphs and the Triton layer loop;
# in fp32 (greedy exactness is bench's, cuda_check.sh's fp32 step) and in bf16. Each step under its own
# cap, written under $OUT as it ends, under 7 minutes in all.
#   python3 scripts/random_models.py --export-tokenizer qwen2.5-coder-1.5b-instruct gpu-tokenizer   # here first
#   OUT=DIR bash scripts/gpu_serve.sh gpu-tokenizer        # there (the serve needs fastapi, uvicorn, gguf:
#                                                           # scripts/cuda_check.sh's header says how)
set -u
[ $# -ge 1 ] && [ -d "$1" ] || { echo "usage: OUT=DIR scripts/gpu_serve.sh TOKENIZER_DIR" >&2; exit 2; }
OUT=${OUT:?"set OUT to a folder for the results"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD SPECDEC_HOME=${SPECDEC_HOME:-/tmp/specdec-home}
. scripts/gpu_step.sh
M=/tmp/gpu-serve-models
step models 90 python3 scripts/random_models.py "$M" --tokenizer "$1"
for dtype in float32 bfloat16; do
  step "loadtest-$dtype" 150 python3 -m specdec.cli loadtest --model "$M/q15" --draft "$M/q05" --device cuda \
    --dtype "$dtype" --cuda-graphs --gpu-kernels --modes off,policy --concurrency 1,4,16 --max-tokens 64 \
    --completions --dataset docs/results/prompts/specbench36.jsonl --out "$OUT/loadtest-$dtype"
done
