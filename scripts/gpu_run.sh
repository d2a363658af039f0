#!/usr/bin/env bash
# One GPU session's measurements of the CUDA path, in order of value: each step under its own timeout,
# its log and JSON written under $OUT as it ends, the whole under 7.5 minutes (caps sum to 445 s; the
# first step compiles every kernel variant). For the device tool, which
# sets $OUT and runs in the repository root (the GPU machine's own torch, Triton and transformers):
#   bash scripts/gpu_run.sh
# 1. the Triton kernels compiled for the GPU against the torch path, and greedy output through them
#    inside CUDA graphs (batched too), fp32 and bf16;
# 2. scripts/cuda_bench.py on the 1.5B/0.5B shapes: the layer loop on Triton with graphs, then graphs
#    alone (roofline share, v(n), the draft's and a head's c, the device chain's c, oracle speedups);
# 3. eager with HF transformers' eager decode beside it, and the Triton loop without graphs;
# 4. Inductor's compiled plain step (torch.compile), the well-kept way to fuse, against ours;
# 5. the other CUDA tests;
# 6. scripts/gpu_profile.py: a step's kernels by device time, torch path and Triton loop, and the
#    attention's key split swept (what to cut next toward the roofline);
# 7. HF transformers' static cache with its compiled forward (context; its compile may not finish in the cap).
set -u
OUT=${OUT:?"set OUT to a folder for the results"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. scripts/gpu_step.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
step kernel-tests 110 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_gpu_kernels.py
step bench-kernels-graphs 140 python3 scripts/cuda_bench.py --modes kernels+graphs,graphs --no-hf --repeats 3 \
  --profile-repeats 10 --out "$OUT/cuda-bench-graphs.json"
step bench-eager 60 python3 scripts/cuda_bench.py --modes eager,kernels --repeats 2 --profile-repeats 5 \
  --alphas 0.8 --out "$OUT/cuda-bench-eager.json"
step inductor 50 python3 scripts/cuda_bench.py --modes none --compile reduce-overhead --out "$OUT/cuda-bench-inductor.json"
step cuda-tests 40 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_cuda_graphs.py tests/test_device_chain.py \
  tests/test_eagle.py::test_the_heads_graphed_drafts_equal_its_eager_ones_on_cuda \
  tests/test_eagle.py::test_a_pools_graphed_head_chains_equal_its_eager_ones_on_cuda \
  tests/test_synthetic_bench.py::test_successor_models_on_cuda_with_graphs
step profile 30 python3 scripts/gpu_profile.py --out "$OUT/gpu-profile.json"
step hf-compiled 15 python3 scripts/cuda_bench.py --modes none --hf-compile --repeats 2 --out "$OUT/cuda-bench-hf.json"
