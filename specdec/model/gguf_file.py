"""A GGUF file, memory-mapped: its metadata, its tensor table, and views of the tensors' bytes.

Nothing is copied or converted here: a tensor is a numpy view into the map, so the pages a model
reads come from the page cache, shared with every other process that maps the file (as llama.cpp
does). String arrays in the metadata (the tokenizer's vocabulary and merges) are decoded only when
asked for; other arrays are numpy views too.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec.errors import SpecdecError

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")
F32, F16, BF16 = 0, 1, 30  # ggml type ids of the plain float formats


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length (K), the rest count rows
    offset: int  # from the start of the file
    nbytes: int

    @property
    def rows(self) -> int:
        return int(np.prod(self.dims[1:], dtype=np.int64)) if len(self.dims) > 1 else 1


class StringArray:
    """A metadata array of strings, decoded on first use (the vocabulary: 150k entries)."""

    def __init__(self, buf: memoryview, pos: int, count: int, end: int):
        self.buf, self.pos, self.count, self.end = buf, pos, count, end  # the strings lie in buf[pos:end]
        self._items: list[str] | None = None

    def __len__(self) -> int:
        return self.count

    def items(self) -> list[str]:
        if self._items is None:
            out, pos, buf = [], self.pos, self.buf
            length, append = _U64.unpack_from, out.append
            for _ in range(self.count):  # the vocabulary and merges: 300k strings, decoded straight from the map
                n = length(buf, pos)[0]
                start = pos + 8
                append(str(buf[start:start + n], "utf-8", "replace"))
                pos = start + n
            self._items = out
        return self._items


# (weights per block, bytes per block) of each ggml tensor type, by type id: the gguf package's
# GGML_QUANT_SIZES (a test holds the two equal), kept here because importing gguf costs ~0.17 s of
# every start-up
TYPE_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
              10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
              16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
              22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
              29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18)}


def _type_size(ggml_type: int) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type."""
    try:
        return TYPE_SIZES[ggml_type]
    except KeyError:
        raise SpecdecError(f"unknown ggml tensor type {ggml_type}; the file may be corrupt") from None


class GGUFFile:
    """Open and parse a GGUF file's header; `tensor(name)` maps its bytes without a copy."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.map = np.memmap(self.path, dtype=np.uint8, mode="r")
            buf = memoryview(self.map)
            if bytes(buf[:4]) != MAGIC:
                raise ValueError("no GGUF magic")
            self.metadata, self.tensors = self._parse(buf)
        except (ValueError, struct.error, OSError, UnicodeDecodeError, IndexError) as e:
            raise SpecdecError(f"{self.path} is not a readable GGUF file ({type(e).__name__}: {e}); "
                               "it may be truncated or corrupt: pull or copy it again") from None

    def _parse(self, buf: memoryview) -> tuple[dict, dict[str, TensorInfo]]:
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old (2 or later needed)")
        pos, metadata = 24, {}
        for _ in range(n_kv):
            key, pos = _string(buf, pos)
            (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            metadata[key], pos = _value(buf, pos, vtype)
        infos = []
        for _ in range(n_tensors):
            name, pos = _string(buf, pos)
            (nd,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{nd}Q", buf, pos + 4)
            ttype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * nd)
            pos += 4 + 8 * nd + 12
            infos.append((name, ttype, tuple(int(d) for d in dims), offset))
        align = int(metadata.get("general.alignment", 32))
        start = (pos + align - 1) // align * align
        tensors = {}
        for name, ttype, dims, offset in infos:
            block, size = _type_size(ttype)
            elements = int(np.prod(dims, dtype=np.int64))
            nbytes = elements // block * size
            if start + offset + nbytes > len(buf):
                raise ValueError(f"tensor {name} runs past the end of the file (truncated)")
            tensors[name] = TensorInfo(name, ttype, dims, start + offset, nbytes)
        return metadata, tensors

    def get(self, key: str, default=None):
        value = self.metadata.get(key, default)
        return value.items() if isinstance(value, StringArray) else value

    def tensor(self, name: str) -> np.ndarray:
        """A read-only view of a tensor's bytes: float32 [rows, K] for F32, float16/uint16 for F16/BF16
        (bf16 as raw uint16), else uint8 [rows, row bytes] for a block format."""
        info = self.tensors[name]
        raw = self.map[info.offset:info.offset + info.nbytes]
        plain = {F32: np.float32, F16: np.float16, BF16: np.uint16}.get(info.ggml_type)
        if plain is not None:
            return raw.view(plain).reshape(info.rows, info.dims[0]) if len(info.dims) > 1 else raw.view(plain)
        return raw.reshape(info.rows, info.nbytes // info.rows)

    def adjacent(self, first: str, second: str) -> bool:
        """Whether `second`'s bytes follow `first`'s with no gap (one view can cover both)."""
        a, b = self.tensors[first], self.tensors[second]
        return a.ggml_type == b.ggml_type and a.offset + a.nbytes == b.offset and a.dims[0] == b.dims[0]

    def release(self, name: str) -> None:
        """Drop a tensor's pages from this process's resident set (they stay in the page cache, and a
        later read maps them again): for tensors whose blocks were copied and are not read here again."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = (info.offset + page - 1) // page * page
        end = (info.offset + info.nbytes) // page * page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self.map._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def forget_strings(self) -> None:
        """Free decoded string arrays (the vocabulary and merges, once the tokenizer holds them)."""
        for value in self.metadata.values():
            if isinstance(value, StringArray):
                value._items = None

    def weights_digest(self) -> str:
        """A digest of every tensor's name, format, shape and first 64 bytes, read through the map
        without touching the rest: two copies of one file give the same string, another file another."""
        h = hashlib.blake2b(digest_size=16)
        for name in sorted(self.tensors):
            info = self.tensors[name]
            h.update(f"{name}:{info.ggml_type}:{tuple(info.dims)}".encode())
            h.update(bytes(self.map[info.offset:info.offset + min(64, info.nbytes)]))
        return h.hexdigest()

    def digest(self, prefix: str, skip: tuple[str, ...] = ()) -> str:
        """A digest of the metadata under the keys starting with `prefix`, but those in `skip` (the raw
        bytes of string arrays, undecoded): two files with the same such metadata give the same string."""
        h = hashlib.blake2b(digest_size=16)
        for key in sorted(k for k in self.metadata if k.startswith(prefix) and k not in skip):
            value = self.metadata[key]
            if isinstance(value, StringArray):
                raw = value.buf[value.pos:value.end]
            elif isinstance(value, np.ndarray):
                raw = value.dtype.str.encode() + value.tobytes()
            else:
                raw = repr(value).encode()
            h.update(key.encode() + b"\0" + len(raw).to_bytes(8, "little"))
            h.update(raw)
        return h.hexdigest()

    def span(self, names: list[str]) -> np.ndarray:
        """One uint8 view [rows, row bytes] over adjacent tensors (see `adjacent`)."""
        a, z = self.tensors[names[0]], self.tensors[names[-1]]
        rows = sum(self.tensors[n].rows for n in names)
        return self.map[a.offset:z.offset + z.nbytes].reshape(rows, a.nbytes // a.rows)


def _string(buf: memoryview, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n


def _value(buf: memoryview, pos: int, vtype: int):
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == STRING:
        return _string(buf, pos)
    if vtype != ARRAY:
        raise ValueError(f"unknown metadata value type {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _NUMPY:
        width = np.dtype(_NUMPY[etype]).itemsize
        return np.frombuffer(buf, dtype=_NUMPY[etype], count=count, offset=pos), pos + width * count
    if etype == STRING:
        start = pos
        for _ in range(count):  # skip: decoded on demand
            pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        return StringArray(buf, start, count, pos), pos
    values = []
    for _ in range(count):
        v, pos = _value(buf, pos, etype)
        values.append(v)
    return values, pos
