#!/usr/bin/env bash
# Our kernels and llama.cpp built for the same instruction-set target, side by side on this host, for each
# target in turn (default: x86-64-v3, x86-64-v3+avxvnni and native): `specdec profile` (what a verified row
# and a draft token cost), `specdec bench` on the shipped code prompts and on Spec-Bench (3 a category)
# with plain decoding, the defaults and llama.cpp's plain decoding interleaved prompt by prompt, and the
# prefill against llama.cpp at 128, 512 and 2048 tokens. Results under runs/targets/TARGET/; a finished
# step is not run again (delete its output to rerun it).
#
#   scripts/targets_bench.sh [TARGET ...]        after scripts/llama_cpp.sh build TARGET for each
#   METHODS=plain,draft STEPS=specbench scripts/targets_bench.sh native   (where llama.cpp's build cannot run)
set -euo pipefail
cd "$(dirname "$0")/.."
export SPECDEC_HOME="${SPECDEC_HOME:-$HOME/.cache/specdec}"
MODEL="${MODEL:-qwen2.5-coder-1.5b-instruct}"
DRAFT="${DRAFT:-qwen2.5-coder-0.5b-instruct}"
STEPS="${STEPS:-profile code specbench prefill}"
METHODS="${METHODS:-plain,draft,llama}"
OUT="${OUT:-runs/targets}"
LLAMA="$SPECDEC_HOME/llama.cpp/src"
[ $# -gt 0 ] || set -- x86-64-v3 x86-64-v3+avxvnni native
for target in "$@"; do
    bin="$LLAMA/build-$target/bin"
    [ "$target" = native ] && bin="$LLAMA/build/bin"
    [[ "$METHODS" != *llama* ]] || [ -x "$bin/llama-server" ] || { echo "no llama-server for $target: scripts/llama_cpp.sh build $target" >&2; exit 2; }
    dir="$OUT/$target"
    mkdir -p "$dir"
    export SPECDEC_CPU_TARGET="$target"
    for step in $STEPS; do
        case "$step" in
        profile) [ -f "$dir/profile.json" ] || .venv/bin/specdec profile --model "$MODEL" --draft "$DRAFT" \
                      --out "$dir/profile.json" ;;
        code) [ -f "$dir/code/summary.json" ] || .venv/bin/specdec bench --model "$MODEL" --draft "$DRAFT" \
                      --methods "$METHODS" --k auto --llama-bin "$bin" --max-new-tokens 128 --no-plots \
                      --out "$dir/code" ;;
        specbench) [ -f "$dir/specbench/summary.json" ] || .venv/bin/specdec bench --model "$MODEL" \
                      --draft "$DRAFT" --dataset docs/results/prompts/specbench18.jsonl --methods "$METHODS" \
                      --k auto --llama-bin "$bin" --max-new-tokens 128 --no-plots --out "$dir/specbench" ;;
        prefill) [ -f "$dir/prefill.json" ] || .venv/bin/python scripts/prefill_vs_llama.py --model "$MODEL" \
                      --lengths 128,512,2048 --rounds 3 --llama-bin "$bin" > "$dir/prefill.json.part" \
                      && mv "$dir/prefill.json.part" "$dir/prefill.json" ;;
        *) echo "unknown step $step (profile, code, specbench, prefill)" >&2; exit 2 ;;
        esac
    done
done
