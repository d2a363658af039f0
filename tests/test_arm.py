"""The aarch64 (NEON) build of the CPU kernels gives the x86-64-v3 (AVX2) build's bits: the same C
sources, linked into tests/kernel_harness.c, are built for x86-64-v3 here and cross-compiled for
aarch64 three ways (i8mm + dotprod, dotprod, plain NEON), run under qemu-user on CPU models with and
without those extensions, on the same inputs, and every output (activations, dequantized weights,
every GEMM at every row count 1..16 and a 23-row prefill on raw blocks and repacked tiles, repacking,
RMSNorm, RoPE, attention, the gates, and forward_layers on SmolLM2-135M) must be byte for byte the x86
output."""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from specdec.model import cpu_kernels
from tests.conftest import SUPER_BLOCK_FORMATS, random_blocks

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "specdec" / "model"
C_SOURCES = [MODEL_DIR / n for n in ("quant_dequant.c", "quant_repack.c", "quant_q8.c", "fused_ops.c", "cpu_forward.c")]
HARNESS = Path(__file__).with_name("kernel_harness.c")
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
FLAGS = ["-O3", "-std=c11", "-fopenmp"]  # cpu_kernels.FLAGS' code generation (ISO C: no FMA contraction)
# aarch64 builds: -march, and the qemu CPU models that run each (with and without the extensions it may use)
ARM_BUILDS = {"i8mm": ("armv8.6-a+i8mm+dotprod", ["max"]),
              "dotprod": ("armv8.2-a+dotprod", ["neoverse-n1", "cortex-a76"]),
              "neon": ("armv8-a", ["cortex-a72"])}
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ3_S": 21, "IQ4_XS": 23}

X86_V3 = {"avx2", "fma", "f16c", "bmi2"}  # what the reference build (x86-64-v3) runs on
cross = pytest.mark.skipif(not (shutil.which(CROSS_CC) and shutil.which(QEMU) and shutil.which("gcc")),
                           reason=f"needs gcc, {CROSS_CC} and {QEMU} (apt: gcc-aarch64-linux-gnu qemu-user)")
x86_host = pytest.mark.skipif(platform.machine() != "x86_64" or cpu_kernels.missing_features(" ".join(X86_V3),
                                                                                             cpu_kernels._cpu_flags()),
                              reason="the reference build is x86-64-v3: needs an x86 host with AVX2, FMA, F16C, BMI2")


def write_blobs(path: Path, blobs: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        for name, a in blobs.items():
            data = np.ascontiguousarray(a).tobytes()
            f.write(struct.pack("<I", len(name)) + name.encode() + struct.pack("<Q", len(data)) + data)


def read_blobs(path: Path) -> dict[str, bytes]:
    raw, out, i = path.read_bytes(), {}, 0
    while i < len(raw):
        (n,) = struct.unpack_from("<I", raw, i)
        name = raw[i + 4:i + 4 + n].decode()
        (size,) = struct.unpack_from("<Q", raw, i + 4 + n)
        out[name] = raw[i + 12 + n:i + 12 + n + size]
        i += 12 + n + size
    return out


def kernel_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random blocks of every format (fp16 scales sane), activations, and the fused ops' inputs.
    K: 11 blocks of 32 (a group of 8 and a tail) or 2 K-quant blocks; 32 rows (two tiles)."""
    rng = np.random.default_rng(seed)
    blobs = {}
    N = 32
    for i, (fmt, t) in enumerate(TYPES.items()):
        kq = fmt in SUPER_BLOCK_FORMATS
        K = 512 if kq else 352
        x = rng.standard_normal((16, K)).astype(np.float32) * rng.uniform(0.1, 3, (16, 1)).astype(np.float32)
        x[3, :40] = 0  # a zero block: scale 0
        blobs[f"cfg_{t}"] = np.array([N, K, 256 if kq else 32], np.int64)
        blobs[f"w_{t}"] = random_blocks(fmt, N, K, seed=seed + i, scale=0.05)
        blobs[f"x_{t}"] = x
        blobs[f"b_{t}"] = rng.standard_normal(N).astype(np.float32)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    blobs["nx"], blobs["nw"] = f32(4, 600) * 3, f32(600)
    blobs["rope_x"], blobs["rope_c"], blobs["rope_s"] = f32(2 * 3 * 7 * 64), f32(2 * 3 * 64), f32(2 * 3 * 64)
    blobs["att_q"], blobs["att_k"], blobs["att_v"] = f32(2 * 5 * 10 * 64), f32(3 * 2 * 40 * 64), f32(3 * 2 * 40 * 64)
    mask = rng.random((5, 40)) < 0.6
    mask[2] = False  # a query that sees nothing
    blobs["att_mask"] = mask.astype(np.uint8)
    g = f32(1003) * 4
    g[:8] = [-100, -87.5, -87, 0, -0.0, 30, 100, 1e-8]  # the clamp, zeros, saturation
    blobs["gate_g"], blobs["gate_u"] = g, f32(1003)
    return blobs


def build(cc: str, march: str, out: Path) -> Path:
    sources = [str(s) for s in C_SOURCES if s.name != "quant_q8.c"]  # the harness includes quant_q8.c
    cmd = [cc, *FLAGS, f"-march={march}", f"-I{MODEL_DIR}", str(HARNESS), *sources, "-o", str(out), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr[-3000:]}"
    return out


def run(binary: Path, args: list[str], cpu: str | None = None) -> None:
    cmd = [QEMU, "-L", SYSROOT, "-cpu", cpu, str(binary), *args] if cpu else [str(binary), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, f"{' '.join(cmd)}: rc {proc.returncode}\n{proc.stderr[-2000:]}"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The harness built for x86-64-v3 and for each aarch64 target, in parallel: {name: binary}."""
    d = tmp_path_factory.mktemp("arm")
    jobs = {"x86": ("gcc", "x86-64-v3")} | {k: (CROSS_CC, march) for k, (march, _) in ARM_BUILDS.items()}
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {k: pool.submit(build, cc, march, d / f"harness_{k}") for k, (cc, march) in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


# attention with bf16 products (attend_bf16.h, where the build has FEAT_BF16): its own bits, near fp32's
BF16_ATTENTION = ("attend_64_all", "attend_64_mask", "attend_64_alone", "attend_64_cap")


def assert_same_bits(ref: dict[str, bytes], got: dict[str, bytes], what: str) -> None:
    assert sorted(ref) == sorted(got), what
    for D in (32, 64) if "attend_64_alone" in got else ():  # a query's bits whatever the blocking
        assert got[f"attend_{D}_alone"] == got[f"attend_{D}_mask"], f"{what}: attention at D {D} depends on the blocking"
    bf16 = b"bf16" in got.get("isa", b"").split()
    differ = [name for name in ref if name != "isa" and ref[name] != got[name] and not (bf16 and name in BF16_ATTENTION)]
    assert not differ, f"{what}: {len(differ)} outputs differ from x86-64-v3's: {differ[:20]}"
    if bf16:  # q, k, p and v rounded to bf16: within bf16's rounding of x86-64-v3's fp32 attention
        for name in BF16_ATTENTION:
            a, b = np.frombuffer(ref[name], np.float32), np.frombuffer(got[name], np.float32)
            assert np.abs(a - b).max() < 0.05 and np.abs(a - b).mean() < 5e-3, f"{what}: {name} off by {np.abs(a - b).max()}"


@cross
@x86_host
def test_kernels_give_the_x86_bits_on_every_aarch64_build(builds, tmp_path):
    inputs = tmp_path / "in.bin"
    write_blobs(inputs, kernel_inputs())
    runs = {("x86", None): tmp_path / "x86.bin"}
    for name, (_, cpus) in ARM_BUILDS.items():
        for cpu in cpus:
            runs[(name, cpu)] = tmp_path / f"{name}_{cpu}.bin"
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda kv: run(builds[kv[0][0]], [str(inputs), str(kv[1])], kv[0][1]), runs.items()))
    ref = read_blobs(runs[("x86", None)])
    assert b"avx2" in ref["isa"].split() and len(ref) == 952  # every output is there
    for key, path in runs.items():
        got = read_blobs(path)
        if key[0] != "x86":
            isa = set(got["isa"].decode().split())
            assert isa == {"asimd", *{"i8mm": ["asimddp", "i8mm", "bf16"], "dotprod": ["asimddp"], "neon": []}[key[0]]}, isa
        assert_same_bits(ref, got, f"{key[0]} on {key[1]}")


FORWARD_LAYERS = 30  # SmolLM2-135M's every layer


def forward_inputs(model, layers: int, positions: int = 6) -> dict[str, np.ndarray]:
    """One forward_layers call's structs as the Python loader builds them (model.layer_loop), as blobs
    fw_harness.h rebuilds them from, with `positions` positions' embeddings and RoPE rows."""
    import ctypes
    import torch
    cf = model.layer_loop
    D, H, KV, hd, inter = cf.dims
    at = lambda ptr, n: np.frombuffer(ctypes.string_at(ptr, n), np.uint8)  # noqa: E731
    blobs = {"dims": np.array([layers, D, H, KV, hd, inter], np.int64),
             "eps_scale": np.array([cf.eps, cf.scale], np.float32)}
    for i in range(layers):
        ly = cf.layers[i]
        for name, n in (("ln1", D), ("ln2", D), ("attn_post", D), ("mlp_post", D), ("q_norm", hd), ("k_norm", hd)):
            if getattr(ly, name):
                blobs[f"l{i}_{name}"] = at(getattr(ly, name), 4 * n)
        blobs[f"l{i}_flags"] = np.array([ly.local, ly.act], np.int32)
        for lin in ("qkv", "o", "gate_up", "down"):
            li = getattr(ly, lin)
            meta = [li.n_parts, li.N, li.K, int(bool(li.bias))]
            if li.bias:
                blobs[f"l{i}_{lin}_bias"] = at(li.bias, 4 * li.N)
            for p in range(li.n_parts):
                part = li.parts[p]
                meta += [part.type, part.rows]
                blobs[f"l{i}_{lin}_p{p}"] = at(part.data, part.rows * cpu_kernels.quant_row_bytes(part.type, li.K))
            blobs[f"l{i}_{lin}_meta"] = np.array(meta, np.int64)
    torch.manual_seed(0)
    with torch.inference_mode():
        blobs["x"] = model.model.embed_tokens(torch.randint(0, 1000, (positions,))).float().numpy()
    blobs["cos"], blobs["sin"] = (t[:positions].float().contiguous().numpy() for t in (model.rope_cos, model.rope_sin))
    return blobs


@cross
@x86_host
@pytest.mark.real
@pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernels unavailable: {cpu_kernels.unavailable_reason()}")
def test_forward_layers_gives_the_x86_bits_on_aarch64(builds, tmp_path, smollm2_path):
    from specdec.model import load_model
    model = load_model(str(smollm2_path), device="cpu", progress=lambda *a: None).module
    assert model.layer_loop is not None
    inputs = tmp_path / "forward.bin"
    blobs = forward_inputs(model, FORWARD_LAYERS)
    write_blobs(inputs, blobs)
    runs = {"x86": (builds["x86"], None), "dotprod": (builds["dotprod"], "neoverse-n1")}
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda k: run(runs[k][0], ["--forward", str(inputs), str(tmp_path / k)], runs[k][1]), runs))
    ref, got = read_blobs(tmp_path / "x86"), read_blobs(tmp_path / "dotprod")
    assert sorted(ref) == ["forward_T1", "forward_T5", "forward_k", "forward_ragged", "forward_ragged_k", "forward_v"]
    # the harness rebuilt the call: the library built for x86-64-v3, called by CpuForward, gives its bytes
    import torch
    cf, x = model.layer_loop, torch.from_numpy(blobs["x"].copy())[None]
    cf.lib = cpu_kernels.load(target="x86-64-v3")
    cache, causal = model.new_cache(16), torch.ones(5, 16, dtype=torch.bool).tril()
    with torch.inference_mode():
        t5 = cf.run(x[:, :5].clone(), model.layer_inputs(torch.arange(5)[None], 0, causal), cache, 0)
        t1 = cf.run(x[:, 5:].clone(), model.layer_inputs(torch.arange(5, 6)[None], 5, None), cache, 5)
    assert t5.numpy().tobytes() == ref["forward_T5"] and t1.numpy().tobytes() == ref["forward_T1"]
    assert_same_bits(ref, got, "forward_layers, dotprod on neoverse-n1")


@cross
def test_the_library_builds_for_aarch64_with_the_loaders_flags(tmp_path):
    out = tmp_path / "kernels.so"
    cpu_kernels._compile(CROSS_CC, cpu_kernels.FLAGS + cpu_kernels.target_flags("armv8.2-a+dotprod"), out)
    assert out.read_bytes()[18:20] == struct.pack("<H", 183)  # ELF e_machine: EM_AARCH64


def test_missing_features_names_what_the_cpu_lacks():
    assert cpu_kernels.missing_features(" asimd asimddp i8mm", "Features : fp asimd asimddp") == ["i8mm"]
    assert cpu_kernels.missing_features(" asimd asimddp", "Features\t: fp asimd evtstrm asimddp") == []
    # a build with bf16 attention is refused on a CPU without the bf16 dot product (it would stop on SIGILL)
    assert cpu_kernels.missing_features(" asimd asimddp i8mm bf16", "Features : fp asimd asimddp i8mm") == ["bf16"]
    assert cpu_kernels.missing_features(" avx2 avx512f avx512_bf16", "flags : avx2 avx512f avx512_vnni") == ["avx512_bf16"]
    assert cpu_kernels.target_flags("armv8.2-a+dotprod") == ["-march=armv8.2-a+dotprod"]
