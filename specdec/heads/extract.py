"""Feature extraction: the target (as loaded, i.e. its default quantized path on CPU) reads each
planned chunk once; its final-norm features (bf16) and top-k next-token distribution go into shards.

work/features/manifest.json lists the shards and the chunks each holds; a chunk not in it is
extracted again, so a killed run resumes at its last finished shard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.heads.corpus import Chunk, write_json_atomic

DEFAULT_TOP_K = 32
SHARD_TOKENS = 32768


@dataclass
class ChunkRecord:
    """One extracted chunk: its tokens, features and the teacher's top-k distribution."""

    id: str
    tokens: torch.Tensor    # [T] int64
    features: torch.Tensor  # [T, hidden] bf16: the final norm's output at each position
    top_ids: torch.Tensor   # [T, top_k] int32 (int64 fresh from the teacher): the most likely next tokens, best first
    top_probs: torch.Tensor  # [T, top_k] float16 (float32 fresh from the teacher): their probabilities


@torch.inference_mode()
def teacher(module, tokens: list[int], top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over a chunk -> features [T, hidden] bf16, top ids [T, k], top probs [T, k]."""
    ids = torch.tensor([tokens], dtype=torch.int64, device=module.device)  # [1, T]
    cache = module.new_cache(len(tokens))
    logits, h = module(ids, cache, 0, hidden=True)  # [1, T, vocab], [1, T, hidden]
    probs, top = torch.softmax(logits[0].float(), dim=-1).topk(top_k, dim=-1)  # [T, k]
    return h[0].to(torch.bfloat16).cpu(), top.cpu(), probs.cpu()


class ShardWriter:
    """Buffers chunk records and writes them as a shard, then records them in the manifest."""

    def __init__(self, directory: Path, manifest: dict, shard_tokens: int = SHARD_TOKENS):
        self.directory, self.manifest, self.shard_tokens = directory, manifest, shard_tokens
        self.buffer: list[ChunkRecord] = []

    def add(self, record: ChunkRecord) -> None:
        self.buffer.append(record)
        if sum(r.tokens.numel() for r in self.buffer) >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        name = f"shard-{len(self.manifest['shards']):05d}.safetensors"
        save_file(pack(self.buffer), str(self.directory / name))
        self.manifest["shards"].append({"file": name, "chunks": [r.id for r in self.buffer]})
        write_json_atomic(self.directory / "manifest.json", self.manifest)
        self.buffer = []


def pack(records: list[ChunkRecord]) -> dict[str, torch.Tensor]:
    return {"tokens": torch.cat([r.tokens for r in records]).to(torch.int32),
            "features": torch.cat([r.features for r in records]).contiguous(),
            "top_ids": torch.cat([r.top_ids for r in records]).to(torch.int32),
            "top_probs": torch.cat([r.top_probs for r in records]).to(torch.float16),
            "lengths": torch.tensor([r.tokens.numel() for r in records], dtype=torch.int64)}


def read_manifest(directory: Path, settings: dict) -> dict:
    path = directory / "manifest.json"
    if not path.is_file():
        return {"settings": settings, "shards": []}
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        raise SpecdecError(f"{path} is corrupt; delete {directory} to extract again") from None
    if manifest.get("settings") != settings:
        raise SpecdecError(f"{directory} holds features of another model or top-k ({manifest.get('settings')}); "
                           "use another --out, or delete that directory to extract again")
    return manifest


def extracted_ids(manifest: dict) -> set[str]:
    """The ids of the chunks the manifest's shards hold."""
    return {cid for shard in manifest["shards"] for cid in shard["chunks"]}


def extract(module, chunks: Iterable[Chunk], directory: Path, settings: dict, top_k: int = DEFAULT_TOP_K,
            shard_tokens: int = SHARD_TOKENS, progress: Callable[[int], None] | None = None) -> dict:
    """Extract every chunk not yet in the manifest; returns the manifest. progress(n_tokens) per chunk."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(directory, settings)
    done = extracted_ids(manifest)
    writer = ShardWriter(directory, manifest, shard_tokens)
    for chunk in chunks:
        if chunk.id in done:
            continue
        features, top_ids, top_probs = teacher(module, chunk.tokens, top_k)
        writer.add(ChunkRecord(chunk.id, torch.tensor(chunk.tokens), features, top_ids, top_probs))
        if progress is not None:
            progress(len(chunk.tokens))
    writer.flush()
    return manifest


def load_records(directory: Path, wanted: set[str] | None = None) -> list[ChunkRecord]:
    """The extracted chunks (those in `wanted`, or all), read from the shards of the manifest."""
    manifest = json.loads((directory / "manifest.json").read_text())
    records = []
    for shard in manifest["shards"]:
        try:
            data = load_file(str(directory / shard["file"]))
        except (OSError, SafetensorError) as e:
            raise SpecdecError(f"feature shard {directory / shard['file']} is unreadable ({e}); delete "
                               f"{directory} to extract again") from None
        records += unpack(data, shard["chunks"], wanted)
    return records


def unpack(data: dict, ids: list[str], wanted: set[str] | None) -> list[ChunkRecord]:
    out, offset = [], 0
    for cid, n in zip(ids, data["lengths"].tolist()):
        if wanted is None or cid in wanted:
            s = slice(offset, offset + n)
            out.append(ChunkRecord(cid, data["tokens"][s].long(), data["features"][s], data["top_ids"][s],
                                   data["top_probs"][s]))
        offset += n
    return out


@torch.inference_mode()
def greedy_answer(module, prompt: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """The target's own greedy continuation of prompt (stops after an end token)."""
    device = module.device
    cache = module.new_cache(len(prompt) + max_new_tokens)
    logits = module(torch.tensor([prompt], device=device), cache, 0, last_only=True)  # [1, 1, vocab]
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = int(logits[0, -1].argmax())
        out.append(token)
        if token in eos_ids or len(prompt) + len(out) >= cache.capacity:
            break
        logits = module(torch.tensor([[token]], device=device), cache, len(prompt) + len(out) - 1)
    return out


def self_generated(module, tokenizer, documents, count: int, max_new_tokens: int, eos_ids: set[int], guard,
                   taken: set[str], progress=None) -> list[tuple[str, list[int]]]:
    """The target's greedy answers to the first user turns of `count` conversations (not in `taken`,
    not overlapping the evaluation sets): [(id, prompt + answer tokens)]."""
    from specdec.model.tokenizer import encode_messages
    out = []
    for doc in documents:
        if len(out) >= count:
            break
        first = next((c for r, c in doc.messages if r == "user"), None)
        if first is None or doc.id in taken or not guard.admit(first, "self"):
            continue
        messages = [{"role": "user", "content": first}]
        prompt = (encode_messages(tokenizer, messages) if getattr(tokenizer, "chat_template", None)
                  else tokenizer.encode(first, add_special_tokens=False))[:max_new_tokens * 2]
        out.append((f"self:{doc.id}", prompt + greedy_answer(module, prompt, max_new_tokens, eos_ids)))
        if progress is not None:
            progress(1)
    return out
