#!/usr/bin/env bash
# per-position acceptance at fixed k (acceptance only: speed is not read from these runs)
cd /work/main
export SPECDEC_HOME=/work/home
M="plain,draft:8,ngram:8,suffix:8,hybrid:8,eagle:8,tree:16,eagle-tree:16"
[ -f runs/gpu-accept/code/summary.json ] || .venv/bin/specdec bench --methods $M --head auto --max-new-tokens 128 --no-plots --out runs/gpu-accept/code
[ -f runs/gpu-accept/specbench/summary.json ] || .venv/bin/specdec bench --methods $M --head auto --dataset docs/results/prompts/specbench18.jsonl --max-new-tokens 128 --no-plots --out runs/gpu-accept/specbench
