"""Our own CPU kernels, built on first use: the GEMM on a GGUF file's blocks against 8-bit
activations (`quant_q8.c`), the blocks' dequantizer (`quant_dequant.c`), their repacking at load
(`quant_repack.c`), RMSNorm, RoPE, attention
and the MLP's gates (`fused_ops.c`), and the layer loop in one call (`cpu_forward.c`).

The C sources ship in the package; the first call compiles them with the system C compiler
(`-O3 -march=native -fopenmp`) into `SPECDEC_HOME/kernels/` (or `$SPECDEC_KERNEL_DIR`), keyed by
a hash of the source, the flags, the compiler and this CPU's flags, and loads it with ctypes. It
links the OpenMP runtime by its soname, so in a process that imported torch it shares torch's
thread pool instead of starting a second one. Where the compiler has no OpenMP (Apple clang), it
tries libomp (`-Xpreprocessor -fopenmp -lomp`), else builds without it: one thread.

On an x86 CPU with AMX, a native build runs Q4_K's GEMM from 9 input rows on AMX tiles (quant_rp_amx.h:
the same bits as the vector kernels); `SPECDEC_AMX=0` keeps the vector kernels (for comparing them).

The instruction set is the compiler's target: `native` unless `$SPECDEC_CPU_TARGET` names another
(`x86-64-v3`, `x86-64-v3+avxvnni`, `armv8.2-a+dotprod`, `armv8.6-a+i8mm`, ...; see target_flags).
The library says what it was built for (kernels_isa), and it is used only where this CPU has all
of it: an older CPU gets the reason, never an illegal instruction.

Where it cannot be built or used (no compiler, no AVX2/FMA or NEON, a target this CPU lacks),
`available()` is False with the reason in `unavailable_reason()`, and callers keep torch's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

SOURCES = [Path(__file__).with_name(n) for n in ("quant_dequant.c", "quant_repack.c", "quant_q8.c", "fused_ops.c",
                                                "cpu_forward.c")]
HEADERS = [Path(__file__).with_name(n) for n in ("kernels.h", "simd.h", "quant_kq.h", "quant_rp.h", "quant_neon.h", "quant_rp_neon.h", "quant_rp_mm.h",
                                                "quant_rp_amx.h", "attend_bf16.h", "iq_grids.h")]
FLAGS = ["-O3", "-shared", "-fPIC", "-std=c11"]
OPENMP = (["-fopenmp"], ["-Xpreprocessor", "-fopenmp", "-lomp"], [])  # tried in turn: gcc/clang, Apple clang + libomp, none
TARGET_ENV = "SPECDEC_CPU_TARGET"
AMX_ENV = "SPECDEC_AMX"  # "0": the vector kernels even where AMX could run (cpu_kernels.load)
# GGUF block formats the kernels read (ggml type ids: gguf.GGMLQuantizationType)
QUANT_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ3_S": 21, "IQ4_XS": 23}
# the layouts weights are repacked into at load (quant_rp.h: tiles of 16 output rows); ids of our own, not GGUF's
REPACKED_TYPES = {"Q4_0_R16": 102, "Q3_0_R16": 103, "Q4_1_R16": 104, "Q5_0_R16": 106, "Q5_1_R16": 107, "Q8_0_R16": 108, "Q2_K_R16": 110, "Q3_K_R16": 111, "Q4_K_R16": 112, "Q5_K_R16": 113, "Q6_K_R16": 114,
                  "IQ4_NL_R16": 120, "IQ4_XS_R16": 123}
REPACK_ROWS = 16  # a repacked matrix's rows come in tiles of this many

_lib = None
_error: str | None = None
_so_name: str | None = None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):  # x86, aarch64
                return line
    except OSError:
        pass
    return ""


def _cache_dir() -> Path:
    d = os.environ.get("SPECDEC_KERNEL_DIR")
    return Path(d) if d else Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec")) / "kernels"


def target_flags(target: str | None = None) -> list[str]:
    """The compiler flags that build for `target` (default: $SPECDEC_CPU_TARGET, else "native"):
    "native" -> -march=native (-mcpu=native on ARM); an ARM architecture with its extensions
    ("armv8.2-a+dotprod") -> -march=TARGET; an ARM core ("cortex-a76", "neoverse-n1", "apple-m1") ->
    -mcpu=TARGET; an x86 level or CPU with extensions ("x86-64-v3+avxvnni") -> -march=x86-64-v3 -mavxvnni."""
    target = (target or os.environ.get(TARGET_ENV) or "native").strip()
    if target == "native":
        return ["-mcpu=native"] if platform.machine().lower() in ("aarch64", "arm64") else ["-march=native"]
    if target.startswith("armv"):
        return [f"-march={target}"]
    if target.startswith(("cortex-", "neoverse-", "apple-")):
        return [f"-mcpu={target}"]
    arch, *extensions = target.split("+")
    if not arch or not all(extensions):
        raise RuntimeError(f"{TARGET_ENV}={target!r}: name a target such as native, x86-64-v3, x86-64-v3+avxvnni "
                           "or armv8.2-a+dotprod")
    return [f"-march={arch}", *(f"-m{e}" for e in extensions)]


def _compile(cc: str, flags: list[str], out: Path) -> None:
    """The library at `out`, built aside and renamed (no half files); OpenMP as the compiler allows."""
    errors = []
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        for omp in OPENMP:
            proc = subprocess.run([cc, *flags, *omp, *map(str, SOURCES), "-o", str(tmp_so), "-lm"],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp_so, out)
                return
            errors.append(proc.stderr.strip())
    names = ", ".join(s.name for s in SOURCES)
    raise RuntimeError(f"compiling {names} failed: {errors[0][-400:]}")


def _build(extra_flags: list[str] | None = None, target: str | None = None) -> Path:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    flags = FLAGS + target_flags(target) + (extra_flags or [])
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256("\n".join([*(s.read_text() for s in SOURCES + HEADERS), " ".join(flags), *version,
                                    _cpu_flags()]).encode())
    out = _cache_dir() / f"specdec_kernels-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        _compile(cc, flags, out)
    return out


def missing_features(isa: str, cpu_flags: str) -> list[str]:
    """The features a library built for `isa` (kernels_isa: /proc/cpuinfo names, space-separated)
    needs that `cpu_flags` (a cpuinfo flags or Features line) lacks."""
    have = set(cpu_flags.split(":", 1)[-1].split())
    return [f for f in isa.split() if f not in have]


def _check_isa(lib) -> None:
    """RuntimeError where this CPU lacks what the library was built for (it would stop on an illegal instruction)."""
    flags = _cpu_flags()
    if not flags:  # no /proc/cpuinfo (macOS): the compiler's target is this machine's own
        return
    missing = missing_features(lib.kernels_isa().decode(), flags)
    if missing:
        raise RuntimeError(f"the kernels were built for {lib.kernels_isa().decode()!r} ({TARGET_ENV}="
                           f"{os.environ.get(TARGET_ENV) or 'native'}), and this CPU lacks {', '.join(missing)}; "
                           f"unset {TARGET_ENV} or name a target this CPU has")


def load(extra_flags: list[str] | None = None, target: str | None = None):
    """The loaded library (built if needed, for `target`: see target_flags); raises RuntimeError with
    the reason if it cannot be built or this CPU cannot run it."""
    global _so_name
    so = _build(extra_flags, target)
    lib = ctypes.CDLL(str(so))
    lib.kernels_isa.argtypes = []
    lib.kernels_isa.restype = ctypes.c_char_p
    _check_isa(lib)
    if not extra_flags and not target:
        _so_name = so.stem
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.quant_row_bytes.argtypes = [ctypes.c_int, i64]
    lib.quant_row_bytes.restype = i64
    lib.quant_rp_row_bytes.argtypes = [ctypes.c_int, i64]
    lib.quant_rp_row_bytes.restype = i64
    lib.quant_dequantize.argtypes = [ctypes.c_int, p, p, i64, i64]
    lib.quant_dequantize.restype = None
    lib.quant_gemm_q8.argtypes = [ctypes.c_int, p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_int]
    lib.quant_gemm_q8.restype = ctypes.c_int
    lib.quant_amx_enable.argtypes = [ctypes.c_int]
    lib.quant_amx_enable.restype = ctypes.c_int
    lib.quant_amx_enable(0 if os.environ.get(AMX_ENV) == "0" else 1)
    lib.quant_q8_supported.argtypes = [ctypes.c_int, i64]
    lib.quant_q8_supported.restype = ctypes.c_int
    lib.quant_repack.argtypes = [ctypes.c_int, p, p, i64, i64, ctypes.c_int]
    lib.quant_repack.restype = ctypes.c_int
    lib.quant_requant_q4_0.argtypes = [ctypes.c_int, p, p, i64, i64, ctypes.c_int]
    lib.quant_requant_q4_0.restype = ctypes.c_int
    lib.quant_requant_q3_0.argtypes = [ctypes.c_int, p, p, i64, i64, ctypes.c_int]
    lib.quant_requant_q3_0.restype = ctypes.c_int
    lib.quant_repacked_type.argtypes = [ctypes.c_int]
    lib.quant_repacked_type.restype = ctypes.c_int
    lib.quant_q8_activations.argtypes = [p, i64, i64, p, p, p, p]
    lib.quant_q8_activations.restype = None
    f32 = ctypes.c_float
    lib.rms_norm.argtypes = [p, p, p, i64, i64, i64, f32]
    lib.rope.argtypes = [p, p, p] + [i64] * 8
    lib.attend.argtypes = [p] * 6 + [i64] * 14 + [f32, f32, ctypes.c_int]
    lib.attention_precision.argtypes = []
    lib.attention_precision.restype = ctypes.c_char_p
    lib.head_norm.argtypes = [p, p, i64, i64, i64, i64, f32]
    lib.head_norm.restype = None
    lib.gate_mul_rows.argtypes = [p, p, i64, i64, ctypes.c_int, ctypes.c_int]
    lib.gate_mul_rows.restype = None
    lib.silu_mul.argtypes = [p, p, p, i64]
    lib.silu_mul_scalar.argtypes = [p, p, p, i64]
    lib.silu_mul_scalar.restype = None
    lib.silu_mul_rows.argtypes = [p, p, i64, i64, ctypes.c_int]
    lib.silu_mul_rows.restype = None
    for f in (lib.rms_norm, lib.rope, lib.attend, lib.silu_mul):
        f.restype = None
    lib.forward_scratch_floats.argtypes = [i64] * 6
    lib.forward_scratch_floats.restype = i64
    lib.forward_layers.argtypes = [p, i64, p] + [i64] * 6 + [f32, f32, p, p, p, p, p, p, i64, i64, i64, p, i64, p,
                                                             i64, p, ctypes.c_int]
    lib.forward_layers.restype = ctypes.c_int
    lib.forward_rows.argtypes = [p, i64, p] + [i64] * 7 + [f32, f32, p, p, p, p, p, p] + [i64] * 4 + [p, p] \
        + [i64] * 2 + [p, i64, i64, p, i64, i64, p, ctypes.c_int]
    lib.forward_rows.restype = ctypes.c_int
    lib.moe_rows.argtypes = [p, p, p, i64, i64, ctypes.c_int, ctypes.c_int]
    lib.moe_rows.restype = ctypes.c_int
    return lib


def build_id() -> str:
    """The loaded kernel library's name (a hash of its sources, flags, compiler and this CPU's flags), or
    'none' where the kernels are unavailable."""
    return _so_name if available() and _so_name else "none"


def available() -> bool:
    global _lib, _error
    if _lib is None and _error is None:
        if os.environ.get("SPECDEC_NO_KERNEL"):
            _error = "disabled by SPECDEC_NO_KERNEL"
        else:
            try:
                _lib = load()
            except (RuntimeError, OSError) as e:
                _error = str(e)
    return _lib is not None


def unavailable_reason() -> str | None:
    available()
    return _error


def _plain(t: torch.Tensor) -> bool:
    """float32, on the CPU, contiguous: what the kernels take without a copy (cheap: checked per call)."""
    return t.dtype is torch.float32 and t.is_cpu and t.is_contiguous()


def _lib_or_raise(lib):
    lib = lib or (_lib if available() else None)
    if lib is None:
        raise RuntimeError(f"specdec CPU kernels unavailable: {unavailable_reason()}")
    return lib


def _check(what: str, **tensors) -> None:
    """A clear error for a tensor the kernels cannot take (dtype or device); the slow path of the checks."""
    for name, t in tensors.items():
        if t is not None and (t.dtype != torch.float32 or t.device.type != "cpu"):
            raise ValueError(f"{what} takes float32 CPU tensors; {name} is {t.dtype} on {t.device}")


def quant_row_bytes(qtype: int, K: int, lib=None) -> int:
    """Bytes of one row of K weights in GGUF block format `qtype` or a repacked layout (REPACKED_TYPES);
    0 where our kernels cannot read it."""
    return _row_bytes(_lib_or_raise(lib), qtype, K)


@functools.lru_cache(maxsize=None)
def _row_bytes(lib, qtype: int, K: int) -> int:  # cached: quant_linear checks every part on every call
    repacked = qtype in REPACKED_TYPES.values()
    return int(lib.quant_rp_row_bytes(qtype, K) if repacked else lib.quant_row_bytes(qtype, K))


def quant_q8_supported(qtype: int, K: int, lib=None) -> bool:
    """Whether quant_linear takes format `qtype` with rows of K weights."""
    return bool(_lib_or_raise(lib).quant_q8_supported(qtype, K))


def quant_dequantize(qtype: int, data: torch.Tensor, K: int, lib=None) -> torch.Tensor:
    """The fp32 weights [rows, K] of quantized rows data # uint8 [rows, quant_row_bytes(qtype, K)]."""
    lib = _lib_or_raise(lib)
    if qtype in REPACKED_TYPES.values():
        raise ValueError(f"quant_dequantize reads GGUF blocks; type {qtype} is a repacked layout")
    _check_quant(qtype, data, K, lib)
    out = torch.empty(data.shape[0], K)
    lib.quant_dequantize(qtype, data.data_ptr(), out.data_ptr(), data.shape[0], K)
    return out


def _check_quant(qtype: int, data: torch.Tensor, K: int, lib) -> None:
    rb = _row_bytes(lib, qtype, K)
    if not rb:
        raise ValueError(f"quantized weights: type {qtype} with rows of {K} weights is not supported")
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != rb or not data.is_contiguous() \
            or not data.is_cpu:
        raise ValueError(f"quantized weights of type {qtype}, K = {K}: need contiguous uint8 CPU rows of {rb} bytes, "
                         f"not {data.dtype} {tuple(data.shape)} on {data.device}")


def repacked_type(qtype: int, lib=None) -> int:
    """The layout quant_repack turns GGUF format `qtype` into, 0 if none."""
    return int(_lib_or_raise(lib).quant_repacked_type(qtype))


def repack(qtype: int, data: torch.Tensor, K: int, lib=None) -> tuple[int, torch.Tensor]:
    """GGUF blocks data # uint8 [rows, row bytes] (rows a multiple of REPACK_ROWS) rewritten into the
    kernels' tiles of 16 output rows: (repacked type, uint8 [rows, quant_row_bytes(repacked type, K)]),
    in new memory; the same weights, and quant_linear gives each row within fp32 rounding of the GGUF
    kernel's value. ValueError where the format or the shape cannot be repacked."""
    lib = _lib_or_raise(lib)
    _check_quant(qtype, data, K, lib)
    rtype = repacked_type(qtype, lib)
    rows = data.shape[0]
    if not rtype or rows % REPACK_ROWS:
        raise ValueError(f"quantized weights of type {qtype}, {rows} rows: not repackable (formats "
                         f"{sorted(k for k, v in QUANT_TYPES.items() if repacked_type(v, lib))}, rows in {REPACK_ROWS}s)")
    return rtype, _tiles(lib.quant_repack, qtype, data, K, rtype, lib, "repacking")


DRAFT_BITS = {4: "Q4_0", 3: "Q3_0"}  # a draft's re-encodings: symmetric, an fp16 scale per 32 weights


def best_draft_bits() -> int:
    """--draft-bits auto: 3 where the kernels are x86's (a draft step costs about its bytes there: 0.85-0.86
    of the 4-bit one's with the MLP's gate and up at 3 bits, in the AVX-512 VNNI and the AVX2 build alike:
    docs/results/raw/draft-bits3-zen4/profile.txt), else 4 (the NEON build is not measured for it)."""
    return 3 if available() and "avx2" in _lib.kernels_isa().decode().split() else 4


def requant(qtype: int, data: torch.Tensor, K: int, bits: int = 4, lib=None) -> tuple[int, torch.Tensor]:
    """GGUF blocks of any format (rows a multiple of REPACK_ROWS, K of 32s) re-encoded at `bits` bits a
    weight and an fp16 scale per 32 weights (4: Q4_0, llama.cpp's rounding; 3: Q3_0, the same rule at 3
    bits) in Q4_0_R16 / Q3_0_R16 tiles: lossy, for a draft model, whose numerics never reach the output.
    Returns (the tiles' type, uint8 [rows, row bytes])."""
    lib = _lib_or_raise(lib)
    _check_quant(qtype, data, K, lib)
    if bits not in DRAFT_BITS:
        raise ValueError(f"a draft re-encodes at {sorted(DRAFT_BITS)} bits, not {bits}")
    name = DRAFT_BITS[bits]
    rtype, rows = REPACKED_TYPES[f"{name}_R16"], data.shape[0]
    if rows % REPACK_ROWS or K % 32:
        raise ValueError(f"re-encoding as {name} takes rows in {REPACK_ROWS}s of a multiple of 32 weights, not "
                         f"{rows} x {K}")
    return rtype, _tiles(getattr(lib, f"quant_requant_{name.lower()}"), qtype, data, K, rtype, lib,
                         f"re-encoding as {name}")


def _tiles(convert, qtype: int, data: torch.Tensor, K: int, rtype: int, lib, what: str) -> torch.Tensor:
    """data's rows converted by the C function `convert` into new `rtype` tiles, uint8 [rows, row bytes]."""
    out = torch.empty(data.shape[0], _row_bytes(lib, rtype, K), dtype=torch.uint8)
    if convert(qtype, data.data_ptr(), out.data_ptr(), data.shape[0], K, torch.get_num_threads()) != rtype:
        raise ValueError(f"quantized weights of type {qtype}, K = {K}: {what} failed (memory)")
    return out


def quant_linear(x: torch.Tensor, parts: list[tuple[int, torch.Tensor]], bias: torch.Tensor | None = None,
                 lib=None) -> torch.Tensor:
    """x @ W.T + bias for fp32 CPU x (any leading shape, any number of rows), where W is given as GGUF
    blocks: parts = [(qtype, uint8 [rows_i, row_bytes]), ...], stacked in order along W's output rows.
    Each row of x is quantized to 8 bits per block and meets the blocks in integer dot products
    (quant_q8.c, llama.cpp's arithmetic): close to, not equal to, the fp32 result, and a row's bits do
    not depend on the row count."""
    lib = _lib_or_raise(lib)
    K = x.shape[-1]
    n = x.numel() // K
    N = sum(d.shape[0] for _, d in parts)
    if not (_plain(x) and (bias is None or (_plain(bias) and bias.numel() == N))) or n < 1:
        _check("quant_linear", x=x, bias=bias)
        if bias is not None and bias.numel() != N:
            raise ValueError(f"quant_linear: a bias of {bias.numel()} for {N} outputs")
        if n < 1:
            raise ValueError("quant_linear takes at least 1 row")
        x = x.contiguous()
    y = x.new_empty((*x.shape[:-1], N))
    threads, off = torch.get_num_threads(), 0
    for qtype, data in parts:
        rows = data.shape[0]
        if data.dtype is not torch.uint8 or data.shape[-1] != _row_bytes(lib, qtype, K) or not data.is_contiguous():
            _check_quant(qtype, data, K, lib)  # raises: the kernel would read past the rows
        if lib.quant_gemm_q8(qtype, data.data_ptr(), x.data_ptr(), bias.data_ptr() + 4 * off if bias is not None else None,
                             y.data_ptr() + 4 * off, rows, K, n, K, N, threads):
            raise ValueError(f"quant_linear: type {qtype} with rows of {K} weights is not supported")
        off += rows
    return y


def silu_mul(gate: torch.Tensor, up: torch.Tensor, lib=None) -> torch.Tensor:
    """silu(gate) * up for fp32 CPU tensors of one shape (the gated MLP's activation; cpu_forward.c
    calls the same C function, so both paths give the same bits)."""
    lib = _lib_or_raise(lib)
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    if not (_plain(gate) and _plain(up)):
        _check("silu_mul", gate=gate, up=up)
        gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    lib.silu_mul(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel())
    return out


def _gate_up(name: str, gu: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
    """gu [..., 2 I] (gate then up) checked and contiguous, I, and a new [..., I] output."""
    if not _plain(gu) or gu.shape[-1] % 2:
        _check(name, gu=gu)
        if gu.shape[-1] % 2:
            raise ValueError(f"{name}: an odd last dimension {gu.shape[-1]} cannot be gate and up")
        gu = gu.contiguous()
    I = gu.shape[-1] // 2
    return gu, I, gu.new_empty((*gu.shape[:-1], I))


def silu_mul_rows(gu: torch.Tensor, lib=None) -> torch.Tensor:
    """silu(gate) * up for gu [..., 2 I] holding gate then up (the fused gate/up GEMM's output), into a
    new [..., I] tensor; the same bits as silu_mul on the two halves."""
    lib = _lib_or_raise(lib)
    gu, I, out = _gate_up("silu_mul_rows", gu)
    lib.silu_mul_rows(gu.data_ptr(), out.data_ptr(), gu.numel() // (2 * I), I, torch.get_num_threads())
    return out


ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # fused_ops.c's gate_mul


def gated_rows(gu: torch.Tensor, activation: str, lib=None) -> torch.Tensor:
    """act(gate) * up for gu [..., 2 I] holding gate then up, into a new [..., I] tensor; activation
    "silu" (silu_mul_rows' bits) or "gelu_tanh" (PyTorch's gelu with approximate="tanh")."""
    if activation == "silu":
        return silu_mul_rows(gu, lib)
    lib = _lib_or_raise(lib)
    gu, I, out = _gate_up("gated_rows", gu)
    lib.gate_mul_rows(gu.data_ptr(), out.data_ptr(), gu.numel() // (2 * I), I, ACTIVATIONS[activation],
                      torch.get_num_threads())
    return out


def head_norm_(y: torch.Tensor, weight: torch.Tensor, first: int, heads: int, head_dim: int, eps: float,
               lib=None) -> None:
    """In place: rms_norm with weight [head_dim] on heads first .. first + heads - 1 of every row of
    y [..., >= (first + heads) * head_dim] (contiguous): the per-head q/k norms."""
    lib = _lib_or_raise(lib)
    ld = y.shape[-1]
    if not (_plain(y) and _plain(weight) and weight.numel() == head_dim and ld >= (first + heads) * head_dim):
        _check("head_norm_", y=y, weight=weight)
        raise ValueError(f"head_norm_: y {tuple(y.shape)} must be contiguous with {first + heads} heads of {head_dim}, "
                         f"weight [{head_dim}], not {tuple(weight.shape)}")
    lib.head_norm(y.data_ptr() + 4 * first * head_dim, weight.data_ptr(), y.numel() // ld, heads, head_dim, ld, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, lib=None) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2, -1) + eps) for x [..., dim] (a new contiguous tensor)."""
    lib = _lib_or_raise(lib)
    dim = x.shape[-1]
    if not (_plain(x) and _plain(weight) and weight.numel() == dim):
        _check("rms_norm", x=x, weight=weight)
        if weight.numel() != dim:
            raise ValueError(f"rms_norm: weight of {weight.numel()} for x [..., {dim}]")
        x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    lib.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, dim, eps)
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int, lib=None) -> None:
    """In place: HF's rotate-half RoPE on the first `heads` heads of x [B, T, >= heads * head_dim]
    (contiguous); cos, sin [B, T, head_dim], contiguous (any view of that shape, e.g. [B, 1, T, head_dim])."""
    lib = _lib_or_raise(lib)
    B, T = x.shape[0], x.shape[1]
    if not (_plain(x) and _plain(cos) and _plain(sin) and cos.numel() == sin.numel() == B * T * head_dim
            and x.dim() == 3 and x.shape[2] >= heads * head_dim):
        _check("rope_", x=x, cos=cos, sin=sin)
        raise ValueError(f"rope_: x {tuple(x.shape)} must be contiguous [B, T, >= {heads} x {head_dim}], with cos "
                         f"{tuple(cos.shape)} and sin {tuple(sin.shape)} contiguous [B, T, {head_dim}]")
    lib.rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), B, T, heads, head_dim, x.stride(0), x.stride(1),
             T * head_dim, head_dim)


def attention_precision(lib=None) -> str:
    """The attention's products in this build: "bf16" (AVX-512 BF16, or aarch64's BF16: q.k and p.v on
    bf16 operands, added in fp32; attend_bf16.h) or "fp32"."""
    return _lib_or_raise(lib).attention_precision().decode()


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: int, heads: int,
           rows: torch.Tensor | None = None, mask: torch.Tensor | None = None, scale: float | None = None,
           softcap: float = 0.0, lib=None) -> torch.Tensor:
    """Attention of q [B, T, >= heads * head_dim] (contiguous) over the first `slots` slots of one
    layer's cache k_cache, v_cache [batch, kv_heads, capacity, head_dim] (contiguous; batch row b
    reads cache row rows[b], default b). mask: bool [T, >= slots] or [B, 1, T, >= slots], True where
    a query sees a slot; None: all slots. scale: of q.k (None: 1 / sqrt(head_dim) in fp32). softcap > 0
    (Gemma 2): each scaled score s becomes softcap tanh(s / softcap) before the softmax.
    Returns [B, T, heads * head_dim]; a query that sees no slot gets zeros."""
    lib = _lib_or_raise(lib)
    B, T = q.shape[0], q.shape[1]
    _, kv, cap, D = k_cache.shape
    if not (_plain(q) and _plain(k_cache) and _plain(v_cache) and q.dim() == 3):
        _check("attend", q=q, k_cache=k_cache, v_cache=v_cache)
        raise ValueError(f"attend: q {tuple(q.shape)} must be [B, T, n], and q and the caches contiguous")
    if slots > cap or heads % kv or q.shape[2] < heads * D or k_cache.shape != v_cache.shape:
        raise ValueError(f"attend: {slots} slots, {heads} heads against caches {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}, q {tuple(q.shape)}")
    smb = smt = 0
    if mask is not None:
        if mask.dtype is not torch.bool or mask.shape[-1] < slots or mask.shape[-2] != T or mask.stride(-1) != 1 \
                or mask.dim() not in (2, 4):
            raise ValueError(f"attend: mask must be bool [T, S] or [B, 1, T, S] with S >= {slots} and contiguous "
                             f"slots, not {mask.dtype} {tuple(mask.shape)}")
        if mask.dim() == 4:
            smb, smt = mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2)
        else:
            smt = mask.stride(0)
    if rows is not None:
        rows = rows.to(torch.int64).contiguous()
        if rows.numel() != B:
            raise ValueError(f"attend: {rows.numel()} cache rows for a batch of {B}")
    elif B > k_cache.shape[0]:
        raise ValueError(f"attend: a batch of {B} against a cache of {k_cache.shape[0]} rows")
    out = q.new_empty((B, T, heads * D))
    lib.attend(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), rows.data_ptr() if rows is not None else None,
               mask.data_ptr() if mask is not None else None, out.data_ptr(), B, T, heads, kv, D, slots,
               q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), smb, smt, heads * D * T, heads * D,
               float(np.float32(1) / np.sqrt(np.float32(D))) if scale is None else scale, float(softcap),
               torch.get_num_threads())
    return out
