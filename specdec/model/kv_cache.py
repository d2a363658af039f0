"""Static KV cache: per-layer buffers indexed by slot. The engine advances and rolls it back."""

from __future__ import annotations

import math
import mmap

import torch

from specdec.errors import SpecdecError


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A zero tensor. On the CPU in anonymous memory of small pages: the system's zero pages until
    written, so a cache costs start-up time and resident memory only for the slots it fills (torch's
    zeros write every byte at once: 40 ms for the 1.5B target's 4k-token cache; transparent huge pages
    would fault in 2 MB, one per layer and head, at the first token)."""
    if torch.device(device).type == "cpu" and dtype == torch.float32:
        count = math.prod(shape)
        buf = mmap.mmap(-1, max(4 * count, 1))  # the tensor holds a reference to its buffer
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            buf.madvise(mmap.MADV_NOHUGEPAGE)
        return torch.frombuffer(buf, dtype=torch.float32, count=count).view(shape)
    return torch.zeros(shape, dtype=dtype, device=device)


class KVCache:
    """Keys and values for every layer, preallocated to `capacity` slots.

    `length` is the number of valid slots. A forward pass writes new keys/values at slots
    [start, start + T) and the engine then sets the length: `truncate(n)` rolls back in O(1),
    `keep(indices)` compacts a chosen subset of slots into place (tree acceptance).
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int,
                 batch: int = 1, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        shape = (n_layers, batch, n_kv_heads, capacity, head_dim)
        self.k = zeros(shape, dtype, device)  # [layers, batch, kv_heads, capacity, head_dim]
        self.v = zeros(shape, dtype, device)  # [layers, batch, kv_heads, capacity, head_dim]
        self.capacity = capacity
        self.length = 0

    def require(self, n: int) -> None:
        """Raise a clear error unless n slots fit."""
        if n > self.capacity:
            raise SpecdecError(f"sequence needs {n} positions but the context holds {self.capacity}; "
                               "shorten the prompt, lower --max-new-tokens or raise --max-context")

    def advance(self, n: int) -> None:
        self.require(self.length + n)
        self.length += n

    def truncate(self, n: int) -> None:
        """Roll back to the first n slots (O(1): later slots are simply overwritten)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {n}")
        self.length = n

    def keep(self, indices: list[int]) -> None:
        """Keep exactly the slots `indices` (ascending), moved to slots 0..len-1 in that order."""
        if any(b <= a for a, b in zip(indices, indices[1:])) or (indices and indices[-1] >= self.length):
            raise ValueError(f"keep() needs ascending slot indices below {self.length}")
        first = next((i for i, s in enumerate(indices) if s != i), len(indices))
        if first < len(indices):
            src = torch.tensor(indices[first:], device=self.k.device)
            self.k[:, :, :, first:len(indices)] = self.k[:, :, :, src]
            self.v[:, :, :, first:len(indices)] = self.v[:, :, :, src]
        self.length = len(indices)

    def reset(self) -> None:
        self.length = 0

    def row(self, b: int) -> "KVCache":
        """Batch row b as a cache of its own (shares storage; its own length starts at 0)."""
        view = KVCache.__new__(KVCache)
        view.k, view.v = self.k[:, b:b + 1], self.v[:, b:b + 1]  # [layers, 1, kv_heads, capacity, head_dim]
        view.capacity, view.length = self.capacity, 0
        return view
