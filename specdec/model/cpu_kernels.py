"""Our own CPU kernel for decode and verify GEMMs (`skinny_gemm.c`), built on first use.

The C source ships in the package; the first call compiles it with the system C compiler
(`-O3 -march=native -fopenmp`) into `SPECDEC_HOME/kernels/` (or `$SPECDEC_KERNEL_DIR`), keyed by
a hash of the source, the flags, the compiler and this CPU's flags, and loads it with ctypes. It
links the OpenMP runtime by its soname, so in a process that imported torch it shares torch's
thread pool instead of starting a second one.

Where it cannot be built (no compiler, no AVX2/FMA), `available()` is False with the reason in
`unavailable_reason()`, and callers keep torch's kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("skinny_gemm.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
MAX_ROWS = 8  # above this, oneDNN-packed GEMMs were as fast or faster in the model (perf.md): callers use those

_lib = None
_error: str | None = None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _cache_dir() -> Path:
    d = os.environ.get("SPECDEC_KERNEL_DIR")
    return Path(d) if d else Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec")) / "kernels"


def _build(extra_flags: list[str] | None = None) -> Path:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    flags = FLAGS + (extra_flags or [])
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256("\n".join([SOURCE.read_text(), " ".join(flags), *version, _cpu_flags()]).encode())
    out = _cache_dir() / f"skinny_gemm-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # build aside, then rename: no half files
        tmp_so = Path(tmp) / out.name
        proc = subprocess.run([cc, *flags, str(SOURCE), "-o", str(tmp_so)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed: {proc.stderr.strip()[-400:]}")
        os.replace(tmp_so, out)
    return out


def load(extra_flags: list[str] | None = None):
    """The loaded library (built if needed); raises RuntimeError with the reason if it cannot be."""
    so = _build(extra_flags)
    lib = ctypes.CDLL(str(so))
    fn = lib.skinny_gemm
    i64, p = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_int]
    fn.restype = None
    return lib


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


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  lib=None) -> torch.Tensor:
    """F.linear(x, weight, bias) for fp32 CPU tensors with at most MAX_ROWS rows in x (any leading shape)."""
    lib = lib or _lib
    if lib is None:
        raise RuntimeError(f"skinny_gemm kernel unavailable: {unavailable_reason()}")
    for name, t in (("x", x), ("weight", weight)) + ((("bias", bias),) if bias is not None else ()):
        if t.dtype != torch.float32 or t.device.type != "cpu":
            raise ValueError(f"skinny_linear takes float32 CPU tensors; {name} is {t.dtype} on {t.device}")
    K = x.shape[-1]
    N = weight.shape[0]
    if weight.shape[1] != K:
        raise ValueError(f"shape mismatch: x [..., {K}] and weight {tuple(weight.shape)}")
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n = x2.shape[0]
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    y = torch.empty(n, N, dtype=torch.float32)
    b = bias.data_ptr() if bias is not None else None
    lib.skinny_gemm(weight.data_ptr(), x2.data_ptr(), b, y.data_ptr(), N, K, n, x2.stride(0), N,
                    torch.get_num_threads())
    return y.view(*x.shape[:-1], N)
