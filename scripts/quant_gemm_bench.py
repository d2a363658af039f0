"""Our GEMMs on GGUF blocks alone, over every linear weight of a model's decode step (the GGUF file's
matrices, unfused), per format and per row count: quant_gemm.c (exact, fp32 arithmetic), quant_q8.c
(8-bit activations, integer dot products) and our fp32 kernel (skinny_gemm.c) on the same weights
dequantized. Prints JSON.

Usage: python scripts/quant_gemm_bench.py [--model qwen2.5-coder-1.5b-instruct] [--rows 1,2,3,5,9,16] \
    [--rounds 5] > runs/quant-gemm.json
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

from specdec.model import cpu_kernels
from specdec.model.registry import pull


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,5,9,16")
    ap.add_argument("--rounds", type=int, default=5, help="timed passes per measurement (median)")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 kernel (saves its 4 bytes a weight of memory)")
    args = ap.parse_args()
    import gguf
    if not cpu_kernels.available():
        raise SystemExit(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    lib = cpu_kernels._lib
    reader = gguf.GGUFReader(str(pull(args.model)))
    mats: dict[str, list] = {}
    for t in reader.tensors:  # every matrix a decode step reads (the input embedding is gathered, not read)
        if len(t.data.shape) != 2 or t.name == "token_embd.weight" and any(
                u.name == "output.weight" for u in reader.tensors) or t.tensor_type.name not in cpu_kernels.QUANT_TYPES:
            continue
        data = torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True))
        N, K = int(t.shape[1]), int(t.shape[0])
        qtype = int(t.tensor_type)
        w = None if args.no_fp32 else cpu_kernels.quant_dequantize(qtype, data, K)
        mats.setdefault(t.tensor_type.name, []).append((qtype, data, w, N, K))
    threads = torch.get_num_threads()

    def seconds(ms, n, kind):
        xs = {K: torch.randn(n, K) for *_, K in ms}
        ys = {N: torch.empty(n, N) for *_, N, _ in ms}

        def once():
            for qtype, data, w, N, K in ms:
                if kind != "fp32":
                    (lib.quant_gemm_q8 if kind == "q8" else lib.quant_gemm)(qtype, data.data_ptr(), xs[K].data_ptr(), None, ys[N].data_ptr(), N, K, n, K, N,
                                   threads)
                else:
                    lib.skinny_gemm(w.data_ptr(), xs[K].data_ptr(), None, ys[N].data_ptr(), N, K, n, K, N, threads)
        once()
        ts = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            once()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    out = {"model": args.model, "threads": threads, "rounds": args.rounds, "formats": {}, "all": {}}
    everything = [m for ms in mats.values() for m in ms]
    for name, ms in list(mats.items()) + [("all", everything)]:
        weights = sum(N * K for *_, N, K in ms)
        nbytes = sum(d.numel() for _, d, *_ in ms)
        entry = {"weights": weights, "block_bytes": nbytes, "rows": {}}
        for n in (int(r) for r in args.rows.split(",")):
            q = seconds(ms, n, "quant")
            q8 = seconds(ms, n, "q8")
            f = None if args.no_fp32 or n > cpu_kernels.MAX_ROWS * 2 else seconds(ms, n, "fp32")
            entry["rows"][str(n)] = {"quant_seconds": round(q, 4), "quant_block_gb_per_s": round(nbytes / q / 1e9, 2),
                                     "q8_seconds": round(q8, 4), "q8_block_gb_per_s": round(nbytes / q8 / 1e9, 2),
                                     "fp32_seconds": None if f is None else round(f, 4)}
        if name == "all":
            out["all"] = entry
        else:
            out["formats"][name] = entry
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
