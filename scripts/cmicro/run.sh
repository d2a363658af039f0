#!/bin/bash
# Ad-hoc C microbenchmarks behind perf.md session 13 (AVX-512 only; 2 threads; the weights of a
# step's linear layers, Qwen2.5-1.5B shapes, as distinct matrices, medians of 7 rounds).
# Usage: scripts/cmicro/run.sh > docs/results/cmicro-s13.txt
set -e
cd "$(dirname "$0")"
out=$(mktemp -d)
for f in bf16_widen bf16_dpbf16 packed_layout; do gcc -O3 -march=native -fopenmp $f.c -o "$out/$f"; done
echo "== bf16 widened (ours) vs vdpbf16ps, 28 layers, alternated twice"
for i in 1 2; do "$out/bf16_widen" 28; "$out/bf16_dpbf16" 28; done
echo "== in cache (one 1536x1536 matrix repeated): bf16 widened, fp32 row-major / packed"
"$out/bf16_widen" 28 small
"$out/packed_layout" 12 256 small
echo "== fp32 row-major vs packed panels (12 layers), prefetch 0 and 512 floats"
"$out/packed_layout" 12 0
"$out/packed_layout" 12 512
