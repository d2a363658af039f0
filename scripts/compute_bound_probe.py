"""Is a gguf-q8 step bound by memory or by arithmetic? A few of layer 0's matrices (attention and the
gate projection, about 11 MB: they stay in the 32 MB L3) run again and again, against all layers'
matrices streamed once, at 1, 2 and 5 rows (medians of 5 rounds), as GB/s of blocks. If the cached
rate is no higher than the streamed one, the arithmetic binds, not memory.

Usage: python scripts/compute_bound_probe.py [--model qwen2.5-coder-1.5b-instruct] > runs/compute-bound.txt
"""

import argparse
import statistics
import time

import numpy as np
import torch

from specdec.model import cpu_kernels
from specdec.model.registry import pull


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    args = ap.parse_args()
    import gguf
    if not cpu_kernels.available():
        raise SystemExit(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    lib = cpu_kernels.load()
    reader = gguf.GGUFReader(str(pull(args.model)))

    def mats(prefix):
        return [(int(t.tensor_type), torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True)), int(t.shape[1]),
                 int(t.shape[0])) for t in reader.tensors if t.name.startswith(prefix) and len(t.data.shape) == 2]
    layer0 = [m for m in mats("blk.0.") if m[1].numel() < 9e6]  # not ffn_up, ffn_down (9-11 MB each at 4-6 bits)
    layers = mats("blk.")
    reps = max(1, round(sum(d.numel() for _, d, _, _ in layers) / sum(d.numel() for _, d, _, _ in layer0)))
    threads = torch.get_num_threads()

    def seconds(ms, n, reps):
        xs = {K: torch.randn(n, K) for *_, K in ms}
        ys = {N: torch.empty(n, N) for _, _, N, _ in ms}

        def once():
            for qt, data, N, K in ms:
                lib.quant_gemm_q8(qt, data.data_ptr(), xs[K].data_ptr(), None, ys[N].data_ptr(), N, K, n, K, N, threads)
        once()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                once()
            ts.append((time.perf_counter() - t0) / reps)
        return statistics.median(ts)
    b0, ball = (sum(d.numel() for _, d, _, _ in ms) for ms in (layer0, layers))
    print(f"model {args.model}: cached set {b0 / 1e6:.1f} MB ({len(layer0)} matrices), all layers {ball / 1e6:.0f} MB, "
          f"{threads} threads")
    for n in (1, 2, 5):
        cached = seconds(layer0, n, reps)
        streamed = seconds(layers, n, 1)
        print(f"rows {n}: cached {b0 / cached / 1e9:.1f} GB/s ({cached * reps * 1e3:.1f} ms for the step's bytes); "
              f"streamed {ball / streamed / 1e9:.1f} GB/s ({streamed * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
