#!/usr/bin/env bash
# The CUDA path on a GPU machine, in one go: the CUDA tests, scripts/cuda_bench.py, and `bench` on
# random-weight models of Qwen2.5-Coder-1.5B's and 0.5B's shapes (only the tokenizer comes from a real
# model, so acceptance says nothing; fp32 greedy tokens must equal plain decoding's; bf16 gives speeds).
#   scripts/cuda_check.sh TOKENIZER_DIR OUT_DIR [SCALE]
# TOKENIZER_DIR: a byte-level BPE tokenizer saved as an HF directory (SmolLM2's: tests/test_families.py's
# byte_level_tokenizer shows how); the random models take its vocabulary. SCALE < 1 shrinks the models (a
# dry run on a CPU). With $CONVERTER_DIR (llama.cpp's convert_hf_to_gguf.py, conversion/ and gguf-py/,
# copied from $SPECDEC_HOME/llama.cpp/src) the model families' CUDA test runs too. Writes cuda-tests.log,
# cuda-bench.json, bench-fp32-kernels/, bench-fp32/, bench-kernels/ and bench/ under OUT_DIR.
# On a GPU machine without network whose Python lacks some of the package's needs: bring their wheels
# (gguf, fastapi, starlette, pydantic, pydantic-core, uvicorn, typing-inspection, annotated-types) and run
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site WHEELS/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   CONVERTER_DIR=DIR bash scripts/cuda_check.sh TOKENIZER_DIR OUT     (about 8 minutes on an H200)
set -u
[ $# -ge 2 ] && [ -d "$1" ] || { echo "usage: scripts/cuda_check.sh TOKENIZER_DIR OUT_DIR [SCALE] (TOKENIZER_DIR: a directory)" >&2; exit 2; }
TOK=$1 OUT=$2 SCALE=${3:-1}
DEV=$(python3 -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECDEC_HOME=${SPECDEC_HOME:-/tmp/specdec-home}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"
STEPS=${STEPS:-"tests cudabench fp32 bf16 families"}  # in order of value; a subset reruns part of it
want() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
CUDA_TESTS=${CUDA_TESTS:-"tests/test_gpu_kernels.py tests/test_eagle.py::test_the_heads_graphed_drafts_equal_its_eager_ones_on_cuda tests/test_cuda.py tests/test_cuda_graphs.py tests/test_device_chain.py tests/test_synthetic_bench.py tests/test_sampling.py::test_cuda_matches_cpu_processing_and_runs tests/test_tree.py::test_cuda_runs_and_matches_cpu_greedy"}
: >"$OUT/cuda-tests.log"
if [ "$DEV" = cuda ] && want tests; then
  timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider --timeout 90 $CUDA_TESTS >>"$OUT/cuda-tests.log" 2>&1
  echo "cuda tests rc=$?"; tail -25 "$OUT/cuda-tests.log"
fi
if [ "$DEV" = cuda ] && want families && [ -n "${CONVERTER_DIR:-}" ]; then
  mkdir -p "$SPECDEC_HOME/llama.cpp" && cp -r "$CONVERTER_DIR" "$SPECDEC_HOME/llama.cpp/src"
  SPECDEC_TEST_TOKENIZER=$(realpath "$TOK") timeout 180 python3 -m pytest -q -rfEs -p no:cacheprovider \
    tests/test_families.py -k cuda >>"$OUT/cuda-tests.log" 2>&1
  echo "family cuda tests rc=$?"; tail -8 "$OUT/cuda-tests.log"
fi
{ want fp32 || want bf16; } && python3 scripts/random_models.py /tmp/cuda-check-models --tokenizer "$TOK" --scale "$SCALE" \
  --device "$DEV"
M=/tmp/cuda-check-models
# roofline, plain step, v(n), c and decode speed, the Triton layer loop with graphs, graphs alone and eager (in
# that order), an oracle drafter at known acceptance
# (Inductor's compile of the plain step last, cut at 8 minutes in all; the JSON keeps each finished mode)
[ "$DEV" = cuda ] && want cudabench && timeout 480 python3 scripts/cuda_bench.py --out "$OUT/cuda-bench.json" \
  --compile "${COMPILE:-reduce-overhead}" 2>&1 | tail -15
# exactness: in fp32 every method's greedy tokens equal plain decoding's (bf16 may break near-ties,
# which random weights are full of); then speed: bf16 with CUDA graphs
G=$([ "$DEV" = cuda ] && echo --cuda-graphs)
# (--gpu-kernels: the Triton layer loop, gpu_forward.py, with the graphs; the plain torch path's runs keep
# their old names)
K=$([ "$DEV" = cuda ] && echo --gpu-kernels)
want fp32 && python3 -m specdec.cli bench --model $M/q15 --draft $M/q05 --device $DEV --dtype float32 $G $K \
  --methods plain,draft,ngram,suffix --k 4 --limit 2 --max-new-tokens 64 --ignore-eos --no-plots \
  --out "$OUT/bench-fp32-kernels" 2>&1 | grep -A8 "^## All prompts"
want fp32 && python3 -m specdec.cli bench --model $M/q15 --draft $M/q05 --device $DEV --dtype float32 --methods plain,draft,ngram,suffix \
  --k 4 --limit 2 --max-new-tokens 64 --ignore-eos --no-plots --out "$OUT/bench-fp32" 2>&1 | grep -A8 "^## All prompts"
want bf16 && python3 -m specdec.cli bench --model $M/q15 --draft $M/q05 --device $DEV $G $K --methods plain,draft,ngram,suffix \
  --k 4 --limit 4 --max-new-tokens 128 --ignore-eos --no-plots --out "$OUT/bench-kernels" 2>&1 | grep -A8 "^## All prompts"
want bf16 && python3 -m specdec.cli bench --model $M/q15 --draft $M/q05 --device $DEV $G --methods plain,draft,ngram,suffix \
  --k 4 --limit 4 --max-new-tokens 128 --ignore-eos --no-plots --out "$OUT/bench" 2>&1 | grep -A8 "^## All prompts"
