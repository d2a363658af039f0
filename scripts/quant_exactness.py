"""Check quant_gemm.c against gguf-py and skinny_gemm.c on a real GGUF file's matrices, for the
kernels built with extra compiler flags (e.g. -mno-avx512f: the AVX2 path on an AVX-512 host,
which the test suite, building for this host only, does not cover). Both kernels are built with
the same flags, so the fp32 comparison is like for like. Prints one line per matrix and a total.

Usage: python scripts/quant_exactness.py [--flags=-mno-avx512f] [--model qwen2.5-coder-0.5b-instruct] \
    (docs/results/quant-exactness-avx2-s14.txt: the three models, AVX2)
"""

import argparse
import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from specdec.model.registry import pull

SRC = Path(__file__).resolve().parent.parent / "specdec" / "model"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flags", default="-mno-avx512f", help="extra compiler flags, space-separated")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--layers", type=int, default=2, help="check the matrices of this many layers, and the head")
    args = ap.parse_args()
    import gguf
    from gguf.quants import dequantize
    from specdec.model.cpu_kernels import QUANT_TYPES
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "k.so"
        subprocess.run(["gcc", "-O3", "-march=native", *args.flags.split(), "-fopenmp", "-shared", "-fPIC", "-std=c11",
                        str(SRC / "quant_gemm.c"), str(SRC / "skinny_gemm.c"), "-o", str(so)], check=True)
        lib = ctypes.CDLL(str(so))
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.quant_gemm.argtypes = [ctypes.c_int, p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_int]
    lib.quant_gemm.restype = ctypes.c_int
    lib.skinny_gemm.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_int]
    lib.quant_dequantize.argtypes = [ctypes.c_int, p, p, i64, i64]
    reader = gguf.GGUFReader(str(pull(args.model)))
    wanted = [f"blk.{i}." for i in range(args.layers)] + ["output.weight", "token_embd.weight"]
    bad = checked = 0
    for t in reader.tensors:
        if not any(t.name.startswith(w) for w in wanted) or len(t.data.shape) != 2 \
                or t.tensor_type.name not in QUANT_TYPES:
            continue
        raw = torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True))
        ref = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        N, K = ref.shape
        ours = torch.empty(N, K)
        lib.quant_dequantize(int(t.tensor_type), raw.data_ptr(), ours.data_ptr(), N, K)
        deq = torch.equal(ours.view(torch.int32), ref.view(torch.int32))
        gemm = True
        for n in (1, 2, 3, 5, 9, 16):
            x, y, yr = torch.randn(n, K), torch.empty(n, N), torch.empty(n, N)
            rc = lib.quant_gemm(int(t.tensor_type), raw.data_ptr(), x.data_ptr(), None, y.data_ptr(), N, K, n, K, N, 2)
            lib.skinny_gemm(ref.data_ptr(), x.data_ptr(), None, yr.data_ptr(), N, K, n, K, N, 2)
            gemm &= rc == 0 and torch.equal(y, yr)
        checked += 1
        bad += not (deq and gemm)
        print(f"{t.name} {t.tensor_type.name} {N}x{K}: dequantize exact {deq}, GEMM = skinny_gemm at 1-16 rows {gemm}")
    print(f"flags {args.flags!r}: {checked} matrices, {bad} not exact")


if __name__ == "__main__":
    main()
