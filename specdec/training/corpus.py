"""The corpus plan: documents -> token chunks for training and held-out validation, within budgets.

The plan is written once into the work directory (plan.json) and read back on resume, so a killed
run extracts exactly the chunks it planned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from specdec.errors import SpecdecError
from specdec.heads.checkpoint import write_json_atomic
from specdec.training.data import Document
from specdec.training.overlap import OverlapGuard

MIN_CHUNK = 4
VAL_EVERY = 10  # every 10th admitted document is held out until the validation budget is met


@dataclass
class Chunk:
    id: str            # document id + "#" + chunk index
    split: str         # "train" or "val"
    tokens: list[int]


@dataclass
class Plan:
    chunks: list[Chunk]
    settings: dict     # what the plan was made from (sources, budgets, tokenizer fingerprint)
    stats: dict = field(default_factory=dict)

    def tokens(self, split: str) -> int:
        return sum(len(c.tokens) for c in self.chunks if c.split == split)


def document_of(chunk_id: str) -> str:
    """The document a chunk comes from: its id without the chunk index."""
    return chunk_id.rpartition("#")[0]


def chunk_tokens(ids: list[int], seq_len: int) -> list[list[int]]:
    """Consecutive pieces of at most seq_len tokens (a tail shorter than MIN_CHUNK is dropped)."""
    return [ids[i:i + seq_len] for i in range(0, len(ids), seq_len) if len(ids) - i >= MIN_CHUNK]


def build_plan(docs: Iterable[Document], tokenizer, guard: OverlapGuard, train_tokens: int, val_tokens: int,
               seq_len: int, settings: dict) -> Plan:
    """Admitted documents, tokenized and chunked, until both budgets are met or the documents end."""
    chunks, budget, seen = [], {"train": train_tokens, "val": val_tokens}, {"train": 0, "val": 0}
    per_source, admitted = {}, 0
    for doc in docs:
        if seen["train"] >= budget["train"] and seen["val"] >= budget["val"]:
            break
        if not guard.admit(doc.text, doc.source):
            continue
        val_turn = admitted % VAL_EVERY == 0 or seen["train"] >= budget["train"]
        split = "val" if val_turn and seen["val"] < budget["val"] else "train"
        admitted += 1
        ids = tokenizer.encode(doc.text, add_special_tokens=False)
        for j, piece in enumerate(chunk_tokens(ids, seq_len)):
            piece = piece[:max(MIN_CHUNK, budget[split] - seen[split])]
            chunks.append(Chunk(f"{doc.id}#{j}", split, piece))
            seen[split] += len(piece)
            per_source[doc.source] = per_source.get(doc.source, 0) + len(piece)
            if seen[split] >= budget[split]:
                break
    stats = {"documents": admitted, "dropped_overlap": dict(guard.dropped), "tokens_by_source": per_source,
             "train_tokens": seen["train"], "val_tokens": seen["val"]}
    return _checked(Plan(chunks, settings, stats))


def _checked(plan: Plan) -> Plan:
    if not plan.chunks or plan.tokens("train") == 0:
        dropped = sum(plan.stats["dropped_overlap"].values())
        raise SpecdecError("the training corpus is empty: the data sources gave no usable text"
                           + (f" ({dropped} document(s) overlapped the evaluation sets)" if dropped else "")
                           + "; pass --data with ShareGPT JSON, source files or a directory")
    if plan.tokens("val") == 0:
        raise SpecdecError("the corpus is too small to hold out validation text; add data or raise --tokens")
    return plan


def save_plan(plan: Plan, path: Path) -> None:
    data = {"settings": plan.settings, "stats": plan.stats,
            "chunks": [{"id": c.id, "split": c.split, "tokens": c.tokens} for c in plan.chunks]}
    write_json_atomic(path, data)


def load_plan(path: Path) -> Plan:
    try:
        data = json.loads(path.read_text())
        chunks = [Chunk(c["id"], c["split"], list(c["tokens"])) for c in data["chunks"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecdecError(f"the corpus plan {path} is unreadable ({e}); delete it to plan the corpus again") from None
    return Plan(chunks, data.get("settings", {}), data.get("stats", {}))


GROWABLE = ("tokens", "self_generate")  # settings a saved plan can grow in (to larger values)
CHANGEABLE = ("self_prompts",)  # settings a grown plan may change: they only choose what is added


def plan_or_resume(path: Path, settings: dict, make, grow=None) -> Plan:
    """The plan saved at path if it was made with the same settings, else make() (saved). A saved
    plan whose settings differ only by larger GROWABLE budgets (and CHANGEABLE choices of what to
    add) is handed to grow(plan) instead, which returns it with more chunks (its own kept, so their
    extracted features are reused)."""
    if path.is_file():
        plan = load_plan(path)
        if plan.settings == settings:
            return plan
        diff = sorted(k for k in set(settings) | set(plan.settings) if settings.get(k) != plan.settings.get(k))
        grows = [k for k in diff if k not in CHANGEABLE]
        if grow is None or not grows or not all(k in GROWABLE and settings.get(k, 0) >= plan.settings.get(k, 0)
                                                for k in grows):
            raise SpecdecError(f"{path.parent} holds a corpus planned with other settings ({', '.join(diff)}); "
                               "use another --out, or delete that directory to start over"
                               + (" (--tokens and --self-generate may only grow)" if grow is not None else ""))
        plan = grow(plan)
        plan.settings = settings
    else:
        plan = make()
    save_plan(plan, path)
    return plan


def grown(previous: Plan, fresh: Plan) -> Plan:
    """previous, plus the chunks of fresh's documents that previous holds none of (a document keeps
    the split it had, so no held-out text moves into training)."""
    docs = {document_of(c.id) for c in previous.chunks}
    added = [c for c in fresh.chunks if document_of(c.id) not in docs]
    plan = Plan(previous.chunks + added, previous.settings, dict(fresh.stats))
    by_source = dict(previous.stats.get("tokens_by_source", {}))
    for c in added:  # a document id starts with its source's name ("sharegpt:...", "file:..." is code)
        source = c.id.partition(":")[0].replace("file", "code")
        by_source[source] = by_source.get(source, 0) + len(c.tokens)
    plan.stats.update(train_tokens=plan.tokens("train"), val_tokens=plan.tokens("val"), tokens_by_source=by_source,
                      documents=len({document_of(c.id) for c in plan.chunks}),
                      grown_from=previous.stats.get("train_tokens"))
    return plan


def split_chunks(plan: Plan, split: str) -> Iterator[Chunk]:
    return (c for c in plan.chunks if c.split == split)
