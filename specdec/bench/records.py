"""The bench's method kinds and its per-run record (what compare writes and report reads)."""

from __future__ import annotations

from dataclasses import dataclass

OUR_KINDS = ("plain", "draft", "ngram", "suffix", "lookahead", "layer-skip", "tree", "hybrid", "eagle", "eagle-tree",
             "eagle-hybrid", "medusa")  # tree:N = the draft model's dynamic tree of N nodes, eagle-tree:N the EAGLE
# head's dynamic tree of N nodes; eagle-hybrid: the EAGLE head's chains and prompt lookup (as hybrid)
HF_KINDS = {"hf": "plain", "hf-assisted": "assisted", "hf-lookup": "lookup"}
LLAMA_KINDS = {"llama": "plain", "llama-spec": "spec", "llama-lookup": "lookup"}  # llama-server (bench/llama_server.py)
ALL_KINDS = OUR_KINDS + tuple(HF_KINDS) + tuple(LLAMA_KINDS)


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
