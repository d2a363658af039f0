"""The bench's method kinds and its per-run record (what compare writes and report reads)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.drafters.registry import method
from specdec.drafters.registry import names as our_kinds  # every drafter name the bench can run

HF_KINDS = {"hf": "plain", "hf-assisted": "assisted", "hf-lookup": "lookup"}
LLAMA_KINDS = {"llama": "plain", "llama-spec": "spec", "llama-lookup": "lookup"}  # llama-server (bench/llama_server.py)
PLAIN_PEERS = ("hf", "llama")  # the peers decoding without a draft


def is_ours(kind: str) -> bool:
    """A method our engine runs (a registered drafter name), not a peer's."""
    return kind in our_kinds()


def drafts(kind: str) -> bool:
    """Whether a method drafts: ours as its drafter's entry declares, a peer unless it is its plain decoding."""
    return method(kind).entry.drafts if is_ours(kind) else kind not in PLAIN_PEERS


def is_plain(kind: str) -> bool:
    """Our engine without a drafter (its entry drafts nothing): the reference of every speedup."""
    return is_ours(kind) and not method(kind).entry.drafts


def chain_theory(kind: str) -> bool:
    """The theory check fits it: one of ours whose entry declares chain_theory, not a tree-size sweep."""
    return is_ours(kind) and method(kind).entry.chain_theory and not method(kind).tree_sizes


def drafts_with_model(kind: str) -> bool:
    """One of ours whose draft token is a draft model's forward (a profile's draft cost prices it)."""
    return is_ours(kind) and method(kind).entry.draft_model


def all_kinds() -> tuple[str, ...]:
    return our_kinds() + tuple(HF_KINDS) + tuple(LLAMA_KINDS)


@dataclass
class Record:
    prompt_id: str
    category: str
    method: str
    tokens: list[int]
    seconds: float
    stats: list[dict] | None  # per turn, our engine's GenerationStats.summary(); None for peers
    repeat: int = 0
    k: int | None = None
    kind: str | None = None
    error: str | None = None  # a peer that failed on this prompt (the run goes on; the summary lists it)
    peer: dict | None = None  # a peer's own counts, summed over turns (llama-server: draft_n, draft_n_accepted)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0

    @property
    def method_kind(self) -> str:
        return self.kind or self.method.split(":")[0]
