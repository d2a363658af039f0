"""Feature extraction: the target (as loaded, i.e. its default quantized path on CPU) reads each
planned chunk once; its final-norm features (bf16) and top-k next-token distribution go into shards.

work/features/manifest.json lists the shards and the chunks each holds; a chunk not in it is
extracted again, so a killed run resumes at its last finished shard (an interrupted one, Ctrl-C or
SIGTERM, first saves the chunks it finished).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.heads.checkpoint import write_json_atomic
from specdec.model.tokenizer import encode_messages
from specdec.sampling.verify import ragged_inputs
from specdec.training.corpus import Chunk

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


def top_of(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, vocab] -> the teacher's top-k (ids [T, k], probabilities [T, k])."""
    probs, top = torch.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    return top, probs


@torch.inference_mode()
def teacher(module, tokens: list[int], top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over a chunk -> features [T, hidden] bf16, top ids [T, k], top probs [T, k]."""
    ids = torch.tensor([tokens], dtype=torch.int64, device=module.device)  # [1, T]
    cache = module.new_cache(len(tokens))
    logits, h = module(ids, cache, 0, hidden=True)  # [1, T, vocab], [1, T, hidden]
    top, probs = top_of(logits[0], top_k)  # [T, k]
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
    try:
        for chunk in chunks:
            if chunk.id in done:
                continue
            features, top_ids, top_probs = teacher(module, chunk.tokens, top_k)
            writer.add(ChunkRecord(chunk.id, torch.tensor(chunk.tokens), features, top_ids, top_probs))
            if progress is not None:
                progress(len(chunk.tokens))
    finally:  # an interrupted run keeps every finished chunk
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


SELF_BATCH = 16  # answers generated together: 2.7x the tokens/s of one at a time on 2 cores (scripts/head_train_rate.py)
SELF_VAL_EVERY = 25  # every 25th answer is held out for validation


class _Answer:
    """One answer being generated in a row of the batched cache: its tokens, and the features and
    top-k of every position read so far (position i's predict token i + 1)."""

    def __init__(self, cid: str, prompt: list[int], logits: torch.Tensor, h: torch.Tensor, top_k: int):
        self.id, self.tokens, self.prompt_len = cid, list(prompt), len(prompt)
        self.features, self.top_ids, self.top_probs = [], [], []
        self.read(logits, h, top_k)

    def read(self, logits: torch.Tensor, h: torch.Tensor, top_k: int) -> None:
        """Positions read: logits [n, vocab], h [n, hidden] (the prompt's n, then one at a time)."""
        top, probs = top_of(logits, top_k)
        self.features.append(h.to(torch.bfloat16))
        self.top_ids.append(top)
        self.top_probs.append(probs)

    def next_token(self) -> int:
        return int(self.top_ids[-1][-1, 0])

    def record(self) -> ChunkRecord:
        """The positions read: prompt + answer but the last token (it was chosen, never read)."""
        n = len(self.tokens) - 1
        return ChunkRecord(self.id, torch.tensor(self.tokens[:n]), torch.cat(self.features)[:n].cpu(),
                           torch.cat(self.top_ids)[:n].cpu(), torch.cat(self.top_probs)[:n].cpu())


@torch.inference_mode()
def answer_records(module, prompts: Iterable[tuple[str, list[int]]], max_prompt: int, max_new_tokens: int,
                   eos_ids: set[int], top_k: int, batch: int | None = None) -> Iterator[ChunkRecord]:
    """The target's greedy answers to (id, prompt tokens) (each at most max_prompt tokens), `batch`
    at a time (default SELF_BATCH) in one batched cache, each as a ChunkRecord of prompt + answer: the
    features and top-k come from the very forwards that chose the tokens (the prompt's prefill, then one decode row per token),
    so an answer is never read twice. A finished row takes the next prompt; records come out as their
    answers end."""
    device, queue, batch = module.device, iter(prompts), batch or SELF_BATCH
    cache = module.new_cache(max_prompt + max_new_tokens + 1, batch=batch)
    rows: list[_Answer | None] = [None] * batch  # the answer in each cache row
    while True:
        for b in range(batch):
            if rows[b] is None and (item := next(queue, None)) is not None:
                cid, prompt = item
                if not 1 <= len(prompt) <= max_prompt:
                    raise SpecdecError(f"a prompt of {len(prompt)} tokens: an answer needs 1 to {max_prompt}")
                logits, h = module(torch.tensor([prompt], device=device), cache.row(b), 0, hidden=True)
                rows[b] = _Answer(cid, prompt, logits[0], h[0], top_k)
        live = [b for b in range(batch) if rows[b] is not None]
        if not live:
            return
        for b in live:  # each row's next token; a row whose answer ended leaves the batch
            a = rows[b]
            a.tokens.append(a.next_token())
            if a.tokens[-1] in eos_ids or len(a.tokens) - a.prompt_len >= max_new_tokens:
                rows[b] = None
                yield a.record()
        live = [b for b in live if rows[b] is not None]
        if not live:
            continue
        lengths = [len(rows[b].tokens) - 1 for b in live]  # slots written: all but the newest token
        tokens, slots, positions, mask = ragged_inputs(lengths, [[rows[b].tokens[-1]] for b in live], device)
        logits, h = module(tokens, cache, 0, positions=positions, mask=mask, slots=slots,
                           rows=torch.tensor(live, device=device), hidden=True)  # [B, 1, vocab], [B, 1, hidden]
        for i, b in enumerate(live):
            rows[b].read(logits[i], h[i], top_k)


def self_prompts(tokenizer, documents, count: int, max_prompt: int, guard, taken: set[str]) -> Iterator[tuple[str, list[int]]]:
    """(id, prompt tokens) for up to `count` documents: a ShareGPT conversation's first user turn, a
    request made here (specdec.training.tasks) all its turns; not in `taken`, not overlapping the
    evaluation sets, at most max_prompt tokens through the chat template (a longer one is skipped:
    cut, it would lose the template's assistant turn; so is one of no tokens)."""
    made = 0
    for doc in documents:
        if made >= count:
            return
        turns = prompt_turns(doc)
        text = "\n\n".join(c for _, c in turns)
        if not turns or doc.id in taken or not guard.admit(text, "self"):
            continue
        messages = [{"role": r, "content": c} for r, c in turns]
        prompt = (encode_messages(tokenizer, messages) if getattr(tokenizer, "chat_template", None)
                  else tokenizer.encode(text, add_special_tokens=False))
        if not prompt or len(prompt) > max_prompt:
            continue
        made += 1
        yield f"self:{doc.id}#0", prompt


def prompt_turns(doc) -> tuple:
    """The turns a self-generated answer replies to: a ShareGPT conversation's first user turn, or a
    request's own turns (they end with the user's); () if there is none."""
    if doc.source != "sharegpt":
        return doc.messages if doc.messages and doc.messages[-1][0] == "user" else ()
    first = next((c for r, c in doc.messages if r == "user"), None)
    return (("user", first),) if first is not None else ()
