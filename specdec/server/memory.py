"""The server's memory budget: weights + per-slot KV caches + activation head-room must fit.

Everything the server allocates is sized at start-up (the caches are preallocated), so the check
runs once, before the caches exist:

    need = weights(target) + weights(draft)
         + max_batch * (kv(target, context) + kv(draft, context) + a suffix drafter's cache)
         + head-room for one forward (a prefill chunk or a verify of the widest draft/tree)

kv(model, n) = 2 (keys, values) * layers * kv_heads * head_dim * n * bytes per element.
The head-room is a rough upper bound of one forward's live activations, in fp32:
    T * (6 * hidden + 3 * intermediate + 2 * heads * context + vocab) * 4 bytes
for T tokens in the forward (max of the prefill chunk and the verify width).

A suffix drafter's cache of earlier requests is counted at its bound, 512 bytes per token (see
specdec/drafters/suffix.py: about 0.5 KB per token while mutable).

The default budget is the memory available when the server starts (before it loads the models),
less a margin of max(512 MiB, 10 %): psutil's `available` (or /proc/meminfo MemAvailable) on the
CPU, torch.cuda.mem_get_info on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError

GIB = 1024 ** 3
MIB = 1024 ** 2


def available_bytes(device: torch.device | str = "cpu") -> int:
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise SpecdecError("cannot tell how much memory is available; give --memory-budget-gb")


def default_budget(available: int) -> int:
    return max(0, available - max(512 * MIB, available // 10))


def _tensor_bytes(t: torch.Tensor) -> int:
    try:
        return t.numel() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return 0


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (shared tensors once; a GGUF model's blocks are
    views of its memory-mapped file, counted as the pages they will occupy)."""
    seen, total = set(), 0
    tensors = list(module.parameters()) + list(module.buffers())
    for t in tensors:
        key = (t.data_ptr(), t.numel()) if t.layout == torch.strided else id(t)
        if key not in seen:
            seen.add(key)
            total += _tensor_bytes(t)
    return total


def kv_bytes(model, context: int) -> int:
    """One slot's KV cache for `model` (a Transformer) at `context` tokens."""
    cfg = model.config
    n = min(context, cfg.max_position_embeddings)
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * n * model.dtype.itemsize


def activation_bytes(model, tokens: int, context: int) -> int:
    cfg = model.config
    n = min(context, cfg.max_position_embeddings)
    return 4 * tokens * (6 * cfg.hidden_size + 3 * cfg.intermediate_size + 2 * cfg.num_heads * n + cfg.vocab_size)


@dataclass
class MemoryPlan:
    weights: int
    kv_per_slot: int
    slots: int
    headroom: int
    budget: int

    @property
    def total(self) -> int:
        return self.weights + self.slots * self.kv_per_slot + self.headroom

    def check(self) -> None:
        if self.total > self.budget:
            fit = (self.budget - self.weights - self.headroom) // self.kv_per_slot if self.kv_per_slot else 0
            fits = f"at most {fit} fit" if fit >= 1 else "not even one fits"
            raise SpecdecError(
                f"the server needs {self.total / GIB:.3f} GiB (weights {self.weights / GIB:.3f} GiB + "
                f"{self.slots} slots x {self.kv_per_slot / GIB:.3f} GiB of per-slot caches + head-room "
                f"{self.headroom / GIB:.3f} GiB) but the memory budget is {self.budget / GIB:.3f} GiB; "
                f"lower --max-batch ({fits}), --max-context or --suffix-cache-tokens, or raise --memory-budget-gb")

    def summary(self) -> dict:
        return {"weights_bytes": self.weights, "kv_bytes_per_slot": self.kv_per_slot, "slots": self.slots,
                "headroom_bytes": self.headroom, "total_bytes": self.total, "budget_bytes": self.budget}


def plan_memory(target, draft, context: int, max_batch: int, forward_tokens: int, budget: int,
                drafter_bytes_per_slot: int = 0) -> MemoryPlan:
    """target, draft: Transformer modules (draft may be None). drafter_bytes_per_slot: host memory a
    slot's drafter may grow to besides a KV cache (the suffix drafter's cache of earlier requests)."""
    models = [m for m in (target, draft) if m is not None]
    weights = sum(module_bytes(m) for m in models)
    kv = sum(kv_bytes(m, context) for m in models) + drafter_bytes_per_slot
    headroom = max(activation_bytes(m, forward_tokens, context) for m in models)
    return MemoryPlan(weights, kv, max_batch, headroom, budget)
