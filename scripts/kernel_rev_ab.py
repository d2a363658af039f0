"""quant_q8.c's GEMMs as built from a git revision against the working tree's, on every GGUF matrix of
a model's step, alternated in rounds (medians), with the outputs compared bit for bit.

Usage: python scripts/kernel_rev_ab.py REV [--model qwen2.5-coder-1.5b-instruct] [--rows 1,2,5,9,16]
    [--rounds 7] [--head-rows N]
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
from specdec.model.registry import pull


def build_rev(rev: str, tmp: Path):
    """The kernels library compiled from `rev`'s sources (as cpu_kernels builds the working tree's)."""
    for src in cpu_kernels.SOURCES + cpu_kernels.HEADERS:
        rel = src.relative_to(Path(cpu_kernels.__file__).resolve().parents[2])
        shown = subprocess.run(["git", "show", f"{rev}:{rel}"], capture_output=True, text=True)
        if shown.returncode != 0 and src in cpu_kernels.HEADERS:
            continue  # a header that revision does not have (its sources do not include it)
        if shown.returncode != 0:
            raise SystemExit(f"cannot read {rel} at revision {rev!r}: {shown.stderr.strip()}")
        (tmp / src.name).write_text(shown.stdout)
    so = tmp / "rev.so"
    subprocess.run(["gcc", *cpu_kernels.FLAGS, *(str(tmp / s.name) for s in cpu_kernels.SOURCES), "-o", str(so), "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(so))
    lib.quant_gemm_q8.argtypes = cpu_kernels.load().quant_gemm_q8.argtypes
    lib.quant_gemm_q8.restype = ctypes.c_int
    return lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rev")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rows", default="1,2,5,9,16")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--head-rows", type=int, default=0, help="keep only this many rows of the output head (a draft's cut vocabulary)")
    args = ap.parse_args()
    import gguf
    with tempfile.TemporaryDirectory() as tmp:
        libs = {args.rev: build_rev(args.rev, Path(tmp)), "tree": cpu_kernels.load()}
        reader = gguf.GGUFReader(str(pull(args.model)))
        head = "output.weight" if any(t.name == "output.weight" for t in reader.tensors) else "token_embd.weight"
        mats = []
        for t in reader.tensors:
            if len(t.data.shape) != 2 or t.tensor_type.name not in cpu_kernels.QUANT_TYPES or (
                    t.name == "token_embd.weight" and head != t.name):
                continue
            data = np.array(t.data, dtype=np.uint8, copy=True)
            if t.name == head and args.head_rows:
                data = data[:args.head_rows]
            mats.append((int(t.tensor_type), torch.from_numpy(data), data.shape[0], int(t.shape[0])))
        threads = torch.get_num_threads()
        out = {"model": args.model, "rev": args.rev, "threads": threads, "rows": {}}
        for n in map(int, args.rows.split(",")):
            xs = {K: torch.randn(n, K) for *_, K in mats}
            ys = {name: [torch.empty(n, N) for _, _, N, _ in mats] for name in libs}

            def once(name):
                for (qt, data, N, K), y in zip(mats, ys[name]):
                    libs[name].quant_gemm_q8(qt, data.data_ptr(), xs[K].data_ptr(), None, y.data_ptr(), N, K, n, K, N,
                                             threads)
            for name in libs:
                once(name)
            same = all(torch.equal(a, b) for a, b in zip(*ys.values()))
            ts = {name: [] for name in libs}
            for _ in range(args.rounds):
                for name in libs:
                    t0 = time.perf_counter()
                    once(name)
                    ts[name].append(time.perf_counter() - t0)
            out["rows"][n] = {**{name: round(statistics.median(v), 5) for name, v in ts.items()}, "same_bits": same}
            print(n, out["rows"][n], flush=True)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
