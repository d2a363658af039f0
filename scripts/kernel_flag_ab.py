"""quant_q8.c's GEMMs built with other compile-time settings (-D flags) against the default build, on
every GGUF matrix of a model's step, alternated in rounds (medians), the outputs compared bit for bit.

Usage: python scripts/kernel_flag_ab.py --variant pf4k=-DQPF_BYTES=4096 [--variant NAME=FLAG,FLAG ...]
    [--model qwen2.5-coder-1.5b-instruct] [--rows 1,2,3,4] [--rounds 9]
Prints one line per row count: each build's median time and the default's time over it (above 1: faster).
"""

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from specdec.model import cpu_kernels
from specdec.model.gguf_file import GGUFFile
from specdec.model.registry import pull


def build(flags: list[str], so: Path):
    subprocess.run(["gcc", *cpu_kernels.FLAGS, *flags, *map(str, cpu_kernels.SOURCES), "-o", str(so), "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(so))
    lib.quant_gemm_q8.argtypes = cpu_kernels.load().quant_gemm_q8.argtypes
    lib.quant_gemm_q8.restype = ctypes.c_int
    return lib


def step_matrices(model: str) -> list[tuple[int, torch.Tensor, int, int]]:
    """(ggml type, blocks, N, K) of every quantized matrix a decode step reads (the output head included)."""
    f = GGUFFile(pull(model))
    head = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    mats = []
    for name, t in f.tensors.items():
        if len(t.dims) != 2 or t.ggml_type not in cpu_kernels.QUANT_TYPES.values() or (
                name == "token_embd.weight" and head != name):
            continue
        mats.append((t.ggml_type, torch.from_numpy(np.array(f.tensor(name), copy=True)), t.rows, t.dims[0]))
    return mats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", default=[], help="NAME=FLAG[,FLAG...], e.g. pf4k=-DQPF_BYTES=4096")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,4")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"default": build([], Path(tmp) / "default.so")}
        for v in args.variant:
            name, _, flags = v.partition("=")
            if not name or not flags:
                raise SystemExit(f"--variant {v!r}: give NAME=FLAG[,FLAG...]")
            libs[name] = build(flags.split(","), Path(tmp) / f"{name}.so")
        mats = step_matrices(args.model)
        threads = torch.get_num_threads()
        out = {"model": args.model, "threads": threads, "variants": args.variant, "rows": {}}
        for n in map(int, args.rows.split(",")):
            xs = {K: torch.randn(n, K) for *_, K in mats}
            ys = {name: [torch.empty(n, N) for _, _, N, _ in mats] for name in libs}

            def once(name):
                for (qt, data, N, K), y in zip(mats, ys[name]):
                    libs[name].quant_gemm_q8(qt, data.data_ptr(), xs[K].data_ptr(), None, y.data_ptr(), N, K, n, K,
                                             N, threads)
            for name in libs:
                once(name)
            same = all(torch.equal(a, b) for y in ys.values() for a, b in zip(ys["default"], y))
            ts = {name: [] for name in libs}
            for r in range(args.rounds):
                for name in (list(libs) if r % 2 == 0 else list(libs)[::-1]):
                    t0 = time.perf_counter()
                    once(name)
                    ts[name].append(time.perf_counter() - t0)
            base = statistics.median(ts["default"])
            out["rows"][n] = {"same_bits": same, **{name: {"ms": round(statistics.median(v) * 1e3, 2),
                                                           "speed_vs_default": round(base / statistics.median(v), 3)}
                                                    for name, v in ts.items()}}
            print(n, out["rows"][n], flush=True)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
