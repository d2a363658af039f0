"""Does the kind of page the weights sit in change a step's GEMMs? The same matrices in the GGUF file's
own mmap pages (as the engine reads them), copied into anonymous memory with MADV_HUGEPAGE (2 MB pages
where the kernel grants them), and into anonymous memory with MADV_NOHUGEPAGE; alternated, medians.

Usage: python scripts/weight_pages_ab.py [--model qwen2.5-coder-1.5b-instruct] [--rows 1,2,3,4] [--rounds 9]
"""

import argparse
import json
import mmap
import statistics
import time

import numpy as np
import torch

from specdec.model import cpu_kernels
from specdec.model.gguf_file import GGUFFile
from specdec.model.registry import pull


def anonymous_copy(views: dict[str, np.ndarray], huge: bool):
    total = sum((v.nbytes + 4095) // 4096 * 4096 for v in views.values())
    m = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    buf, out, off = np.frombuffer(m, dtype=np.uint8), {}, 0
    for name, v in views.items():
        out[name] = buf[off:off + v.nbytes]
        out[name][:] = v.reshape(-1)
        off += (v.nbytes + 4095) // 4096 * 4096
    return out  # the arrays hold the mapping


def anon_huge_kb() -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,4")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    lib = cpu_kernels.load()
    f = GGUFFile(pull(args.model))
    head = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    names = [n for n, t in f.tensors.items() if len(t.dims) == 2 and t.ggml_type in cpu_kernels.QUANT_TYPES.values()
             and (n != "token_embd.weight" or head == n)]
    views = {n: f.tensor(n) for n in names}
    sets = {"file": views, "anon_huge": anonymous_copy(views, True), "anon_4k": anonymous_copy(views, False)}
    out = {"model": args.model, "anon_huge_pages_kb": anon_huge_kb(), "rows": {}}
    mats = [(f.tensors[n].ggml_type, f.tensors[n].rows, f.tensors[n].dims[0], n) for n in names]
    threads = torch.get_num_threads()
    for rows in map(int, args.rows.split(",")):
        xs = {K: torch.randn(rows, K) for _, _, K, _ in mats}
        ys = {N: torch.empty(rows, N) for _, N, _, _ in mats}

        def once(ws):
            for qt, N, K, n in mats:
                lib.quant_gemm_q8(qt, ws[n].ctypes.data, xs[K].data_ptr(), None, ys[N].data_ptr(), N, K, rows, K, N,
                                  threads)
        ts = {k: [] for k in sets}
        for k in sets:
            once(sets[k])
        for r in range(args.rounds):
            for k in (list(sets) if r % 2 == 0 else list(sets)[::-1]):
                t0 = time.perf_counter()
                once(sets[k])
                ts[k].append(time.perf_counter() - t0)
        base = statistics.median(ts["file"])
        out["rows"][rows] = {k: {"ms": round(statistics.median(v) * 1e3, 2),
                                 "speed_vs_file": round(base / statistics.median(v), 3)} for k, v in ts.items()}
        print(rows, out["rows"][rows], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
