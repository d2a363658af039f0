"""Instructions executed on aarch64, ours against llama.cpp's own aarch64 build, counted under qemu-user
(a proxy for speed where no ARM host is at hand, not a speed): one decode step, a 5-row verify pass and
a 128-token prefill of the same GGUF file on one thread, for a dot-product build and an i8mm build.

Ours: tests/kernel_harness.c's --count mode (the C layer loop, forward_layers, on the structs the
Python loader builds for the file, dumped here on the x86 host; and the LM head's GEMM: every row of
the verify pass, the last of the prefill), cross-compiled for each -march. llama.cpp: llama-bench,
cross-compiled from the same sdist for the same -march (static, no OpenMP; scripts/llama_cpp.sh's
source), `-t 1 --no-warmup` with -p 0 -n 1 (a decode step), -p 5 -n 0 and -p 128 -n 0 (its prompt
batches compute the last row's logits only). Each count is a program run with 2 repetitions less the
same run with 1 (scripts/qemu/insn_count.c), so loading is left out. Prints JSON.

--per-weights adds each kernel's instructions per 256 weights and activation row (the harness's
--count-gemm: 256 rows of 1024 weights against 1, 5 and 16 rows, 2 repetitions less 1) against the
multiply instruction's own floor: sdot takes 16 products, so 16 a row per 256 weights; smmla takes 32
(two activation rows at once), so 8 where the i8mm build runs it (the 32-weight tiles, 2 rows or more).

Usage: python scripts/arm_counts.py [--model qwen2.5-coder-0.5b-instruct] [--llama-counts EARLIER.json] \
    [--per-weights] > runs/arm-counts.json
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.test_arm import C_SOURCES, CROSS_CC, HARNESS, MODEL_DIR, QEMU, SYSROOT, forward_inputs, write_blobs  # noqa: E402

BUILDS = {"dotprod": ("armv8.2-a+dotprod", "neoverse-n1"), "i8mm": ("armv8.6-a+dotprod+i8mm", "max")}
PASSES = {"decode": ["-p", "0", "-n", "1"], "verify5": ["-p", "5", "-n", "0"], "prefill128": ["-p", "128", "-n", "0"]}
LLAMA = Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec")) / "llama.cpp"


def plugin(tmp: Path) -> Path:
    so = tmp / "insn_count.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(ROOT / "scripts" / "qemu" / "insn_count.c"), "-o", str(so)],
                   check=True)
    return so


def count(so: Path, cpu: str, argv: list[str]) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([QEMU, "-plugin", str(so), "-L", SYSROOT, "-cpu", cpu, *argv], capture_output=True, text=True,
                       env=env)
    m = re.search(r"insns (\d+)", p.stderr)
    if p.returncode or not m:
        raise SystemExit(f"{' '.join(argv)} on {cpu} failed: {p.stderr[-600:]}")
    return int(m[1])


def our_harness(march: str, out: Path) -> Path:
    cmd = [CROSS_CC, "-O3", "-std=c11", "-fopenmp", f"-march={march}", "-static", f"-I{MODEL_DIR}", str(HARNESS),
           *(str(s) for s in C_SOURCES if s.name != "quant_q8.c"), "-o", str(out), "-lm"]
    subprocess.run(cmd, check=True)
    return out


def llama_bench(name: str, march: str) -> Path:
    src, build = LLAMA / "src", LLAMA / "src" / f"build-aarch64-{name}"
    binary = build / "bin" / "llama-bench"
    if not binary.exists():
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                        f"-DCMAKE_C_COMPILER={CROSS_CC}", "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
                        "-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={march}", "-DGGML_OPENMP=OFF",
                        "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_EXE_LINKER_FLAGS=-static", "-DLLAMA_CURL=OFF",
                        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count()), "--target", "llama-bench"],
                       check=True, stdout=subprocess.DEVNULL)
    return binary


def dump(model_name: str, path: Path) -> None:
    import numpy as np
    from specdec.model import cpu_kernels, load_model
    from specdec.model.registry import resolve_model
    module = load_model(str(resolve_model(model_name)), device="cpu", progress=lambda *a: None).module
    blobs = forward_inputs(module, module.layer_loop.n_layers, positions=128)
    (qtype, data), = module.lm_head.parts
    blobs["head"], blobs["head_meta"] = data.numpy(), np.array([qtype, data.shape[0]], np.int64)
    assert data.shape[1] == cpu_kernels.quant_row_bytes(qtype, module.config.hidden_size)
    write_blobs(path, blobs)


# (GGUF type, repacked?) of each kernel counted per 256 weights; the rows it runs against
KERNELS = {"Q4_0": (2, False), "Q5_0": (6, False), "Q8_0": (8, False), "Q4_K": (12, False), "Q6_K": (14, False),
           "Q4_0_R16": (2, True), "Q8_0_R16": (8, True), "Q4_K_R16": (12, True), "Q6_K_R16": (14, True)}
GEMM_ROWS, GEMM_N, GEMM_K = (1, 5, 16), 256, 1024


def per_weights(so: Path, harness: Path, cpu: str, i8mm: bool) -> dict:
    """{kernel: {rows: {"ours": instructions per 256 weights and row, "floor": the multiplies' own}}}"""
    out = {}
    for name, (qtype, repacked) in KERNELS.items():
        row = out[name] = {}
        for c in GEMM_ROWS:
            argv = [str(harness), "--count-gemm", str(qtype), *(["R"] if repacked else []), str(GEMM_N), str(GEMM_K),
                    str(c)]
            n = count(so, cpu, [*argv, "2"]) - count(so, cpu, [*argv, "1"])
            smmla = i8mm and repacked and qtype in (2, 8) and c >= 2
            row[c] = {"ours": round(n / (GEMM_N * GEMM_K / 256) / c, 1), "floor": 8 if smmla else 16}
        print(name, row, file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--llama-counts", help="an earlier output of this script: take llama.cpp's counts from it "
                                           "(they do not change with our code), count ours only")
    ap.add_argument("--builds", default=",".join(BUILDS), help=f"comma list of {', '.join(BUILDS)}")
    ap.add_argument("--per-weights", action="store_true", help="each kernel's instructions per 256 weights too")
    args = ap.parse_args()
    earlier = json.loads(Path(args.llama_counts).read_text())["builds"] if args.llama_counts else None
    from specdec.model.registry import resolve_model
    gguf = str(resolve_model(args.model))
    out = {"model": args.model, "method": "qemu-aarch64 TCG plugin (scripts/qemu/insn_count.c): instructions of "
                                          "a run with 2 repetitions less those of a run with 1", "builds": {}}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        so, inputs = plugin(tmp), tmp / "forward.bin"
        dump(args.model, inputs)
        for name in args.builds.split(","):
            march, cpu = BUILDS[name]
            ours = our_harness(march, tmp / f"harness-{name}")
            llama = None if earlier else llama_bench(name, march)
            row = out["builds"][name] = {"march": march, "qemu_cpu": cpu}
            for what, flags in PASSES.items():
                o = [count(so, cpu, [str(ours), "--count", str(inputs), what, str(r)]) for r in (1, 2)]
                ll = earlier[name][what]["llama"] if earlier else -1
                if not earlier:
                    ll = (count(so, cpu, [str(llama), "-m", gguf, "-t", "1", "--no-warmup", "-r", "2", *flags])
                          - count(so, cpu, [str(llama), "-m", gguf, "-t", "1", "--no-warmup", "-r", "1", *flags]))
                row[what] = {"ours": o[1] - o[0], "llama": ll, "ours_over_llama": (o[1] - o[0]) / ll}
                print(name, what, row[what], file=sys.stderr)
            if args.per_weights:
                row["per_256_weights_and_row"] = per_weights(so, ours, cpu, "i8mm" in march)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
