"""Our GEMM on GGUF blocks against 8-bit activations (quant_q8.c) alone, over every matrix a model's
decode step reads (the file's matrices, unfused), per block format and per row count; with
--reencode, each Q5_0 matrix also re-encoded as Q8_0 (the same weights, 1.55x the bytes), and with
--repacked each matrix also in the tiles it is repacked into at load
(quant_rp.h), timed side by side in the same rounds. Prints JSON.

Usage: python scripts/quant_gemm_bench.py [--model qwen2.5-coder-0.5b-instruct] [--rows 1,2,3,5,9,16] \
    [--rounds 5] [--reencode] [--repacked] > runs/quant-gemm.json
"""

import argparse
import json
import statistics
import time

import torch

from specdec.model import cpu_kernels
from specdec.model.gguf_file import GGUFFile
from specdec.model.loading import _tensor
from specdec.model.quant import reencode_q5_0_as_q8_0
from specdec.model.registry import pull

Q5_0, Q8_0 = cpu_kernels.QUANT_TYPES["Q5_0"], cpu_kernels.QUANT_TYPES["Q8_0"]


def step_matrices(f: GGUFFile) -> dict[str, list]:
    """Format name -> [(qtype, uint8 blocks, N, K)] of every matrix a decode step reads (the input
    embedding is gathered, not read, unless it is also the head)."""
    names = {v: k for k, v in cpu_kernels.QUANT_TYPES.items()}
    out: dict[str, list] = {}
    for info in f.tensors.values():
        if len(info.dims) != 2 or info.ggml_type not in names or (
                info.name == "token_embd.weight" and "output.weight" in f.tensors):
            continue
        out.setdefault(names[info.ggml_type], []).append((info.ggml_type, _tensor(f.tensor(info.name)), info.rows,
                                                          info.dims[0]))
    return out


def seconds(ms: list, n: int, rounds: int) -> float:
    lib, threads = cpu_kernels._lib, torch.get_num_threads()
    xs = {K: torch.randn(n, K) for *_, K in ms}
    ys = {N: torch.empty(n, N) for *_, N, _ in ms}

    def once():
        for qtype, data, N, K in ms:
            lib.quant_gemm_q8(qtype, data.data_ptr(), xs[K].data_ptr(), None, ys[N].data_ptr(), N, K, n, K, N, threads)
    once()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        once()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,5,9,16")
    ap.add_argument("--rounds", type=int, default=5, help="timed passes per measurement (median)")
    ap.add_argument("--reencode", action="store_true", help="also time each Q5_0 matrix re-encoded as Q8_0")
    ap.add_argument("--repacked", action="store_true", help="also time each repackable matrix in its repacked tiles")
    args = ap.parse_args()
    if not cpu_kernels.available():
        raise SystemExit(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    mats = step_matrices(GGUFFile(pull(args.model)))
    if args.reencode and "Q5_0" in mats:
        mats["Q5_0 as Q8_0"] = [(Q8_0, reencode_q5_0_as_q8_0(d), N, K) for _, d, N, K in mats["Q5_0"]]
    if args.repacked:
        for name in [n for n in mats if cpu_kernels.repacked_type(cpu_kernels.QUANT_TYPES.get(n, 0))]:
            mats[f"{name} repacked"] = [(*cpu_kernels.repack(q, d, K), N, K) for q, d, N, K in mats[name]]
    out = {"model": args.model, "threads": torch.get_num_threads(), "rounds": args.rounds, "formats": {}}
    for name, ms in mats.items():
        nbytes = sum(d.numel() for _, d, *_ in ms)
        out["formats"][name] = {"weights": sum(N * K for *_, N, K in ms), "block_bytes": nbytes, "rows": {}}
    for n in (int(r) for r in args.rows.split(",")):
        for name, ms in mats.items():  # the formats side by side, round by round
            t = seconds(ms, n, args.rounds)
            entry = out["formats"][name]
            entry["rows"][str(n)] = {"seconds": round(t, 5), "block_gb_per_s": round(entry["block_bytes"] / t / 1e9, 2),
                                     "gmacs_per_s": round(entry["weights"] * n / t / 1e9, 2)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
