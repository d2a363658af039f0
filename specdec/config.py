"""Frozen, validated configuration objects. Flags map 1:1 to these fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.errors import SpecdecError


SAMPLER_ORDER = ("temperature", "min_p", "top_k", "top_p")  # vLLM's order, and HF's
LLAMA_ORDER = ("top_k", "top_p", "min_p", "temperature")  # llama.cpp's default chain (the samplers of both)


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. temperature == 0 means greedy (argmax).

    temperature, top_k, top_p and min_p shape both sides of rejection sampling alike (the target's p and
    a drafter's q, sampling/logits.py). logit_bias ((token id, bias) pairs) and the penalties depend on
    the text so far, so they shape the target's logits alone, row by row along each draft
    (sampling/penalties.py): what plain decoding with the same settings draws, speculation draws too.
    repetition_penalty (HF's and vLLM's: a seen token's positive logit divided by it, a negative one
    multiplied) counts the prompt and the answer; presence_penalty and frequency_penalty (OpenAI's:
    minus presence once a token has appeared, minus frequency per appearance) the answer alone. With
    penalty_last_n n > 0 all three count as llama.cpp's do: the last n tokens of the prompt and answer.
    `order` is the order the temperature and the three cuts apply in, after the bias and penalties:
    vLLM's (SAMPLER_ORDER, the temperature first) unless told, llama.cpp's (LLAMA_ORDER, the temperature
    last) for llama-server's own endpoints, which may also place llama.cpp's infill sampler in it
    ("infill", reading `infill_vocab`: sampling/infill.py)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None
    min_p: float = 0.0  # 0 = off: drop tokens below min_p x the top token's probability
    repetition_penalty: float = 1.0  # 1 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    penalty_last_n: int = 0  # > 0: the penalties count the last n tokens of the text (llama.cpp's repeat_last_n)
    order: tuple[str, ...] = SAMPLER_ORDER  # the order temperature, min_p, top_k and top_p apply in
    infill_vocab: Any = None  # with "infill" in order: the infill sampler's view of the vocabulary (sampling.infill)

    def __post_init__(self):
        if not self.temperature >= 0:
            raise SpecdecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecdecError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecdecError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise SpecdecError(f"seed must be in [0, 2**64), got {self.seed}")
        if not 0.0 <= self.min_p <= 1.0:
            raise SpecdecError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise SpecdecError(f"repetition_penalty must be in (0, 10] (1 = off), got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise SpecdecError(f"{name} must be in [-2, 2] (0 = off), got {getattr(self, name)}")
        if self.penalty_last_n < 0:
            raise SpecdecError(f"penalty_last_n must be >= 0 (0: the whole text, as HF and OpenAI count), "
                               f"got {self.penalty_last_n}")
        if sorted(s for s in self.order if s != "infill") != sorted(SAMPLER_ORDER) or self.order.count("infill") > 1:
            raise SpecdecError(f"order must name each of {', '.join(SAMPLER_ORDER)} once (and infill at most once), "
                               f"got {self.order}")
        if ("infill" in self.order) != (self.infill_vocab is not None):
            raise SpecdecError("the infill sampler needs its vocabulary (infill_vocab), and only it does")
        for token, bias in self.logit_bias:
            if not (isinstance(token, int) and token >= 0):
                raise SpecdecError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not -100.0 <= bias <= 100.0:
                raise SpecdecError(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether the target's logits depend on the text so far (a bias or a penalty is set)."""
        return bool(self.logit_bias) or self.repetition_penalty != 1.0 or bool(self.presence_penalty) \
            or bool(self.frequency_penalty)


@dataclass(frozen=True)
class TreeConfig:
    """Draft trees for the draft-model drafter.

    Dynamic (EAGLE-2 style): expand the `topk` best nodes of each depth by cumulative draft
    probability, each into its `topk` most likely children, down to `depth`; keep the best `budget`
    nodes. Static: `choices`, Medusa-style rank paths ([[0], [1], [0, 0], ...]: child rank at each depth).
    """

    budget: int = 16
    depth: int = 4
    topk: int = 4
    choices: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self):
        if self.choices is not None:
            return  # validated by rank_paths (below) where the tree is built, and by the flags' parser
        if self.depth < 1 or self.topk < 1:
            raise SpecdecError(f"tree depth and topk must be >= 1, got depth={self.depth}, topk={self.topk}")
        if self.budget < self.depth:
            raise SpecdecError(f"tree budget ({self.budget}) must be at least its depth ({self.depth}): "
                               "a tree of that depth needs that many nodes")


@dataclass(frozen=True)
class GenerationConfig:
    """One request: token budget, draft length and sampling; and whether to score the tokens.

    k: the most draft tokens a step verifies (the adaptive policy's cap); 0: plain decoding, the
    drafter never starts (a server request's `speculative.n_max` 0).

    logprobs: None = not asked; n >= 0 = each new token's logprob under the target's raw
    distribution (before temperature, top-k, top-p) and the n most likely alternatives.
    prompt_logprobs: also every prompt token's logprob (all prompt positions are computed)."""

    max_new_tokens: int = 128
    k: int = 4
    sampling: SamplingParams = SamplingParams()
    stop_at_eos: bool = True
    logprobs: int | None = None
    prompt_logprobs: bool = False

    def __post_init__(self):
        if self.logprobs is not None and self.logprobs < 0:
            raise SpecdecError(f"logprobs (top alternatives per token) must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs and self.logprobs is None:
            raise SpecdecError("prompt_logprobs needs logprobs (the number of top alternatives) too")
        if self.k < 0:
            raise SpecdecError(f"k (draft length) must be >= 0 (0: plain decoding), got {self.k}")
        if self.max_new_tokens < 0:
            raise SpecdecError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")


def rank_paths(choices) -> tuple[list[int], list[int]]:
    """A static tree from Medusa-style rank paths -> (parents, ranks), one entry a node (tree.choices_to_parents
    makes them tensors).

    Each choice is a path of ranks from the root: [0] is the root's top-1 candidate, [1, 0] is the
    top-1 candidate after the root's top-2 candidate. Nodes come out in the order
    sorted(choices, key=lambda c: (len(c), c)) (breadth first, siblings by rank), so parents precede
    their children; ranks[i] is the last element of node i's path (which top-k candidate it is).
    Raises SpecdecError for an empty list, a path that is not a non-empty list of non-negative ints,
    a duplicate path, or a path whose prefix is not itself a choice.
    """
    if not isinstance(choices, (list, tuple)):
        raise SpecdecError(f"tree choices must be a list of rank paths such as [[0], [1], [0, 0]], got {choices!r}")
    if not choices:
        raise SpecdecError("tree choices are empty; give rank paths such as [[0], [1], [0, 0]]")
    for choice in choices:
        if (not isinstance(choice, (list, tuple)) or not choice
                or any(isinstance(r, bool) or not isinstance(r, int) for r in choice)):
            raise SpecdecError(f"tree choice {choice!r} is not a non-empty list of ints such as [0, 1]")
        if any(r < 0 for r in choice):
            raise SpecdecError(f"tree choice {list(choice)} has a negative rank; ranks count from 0")
    ordered = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c))
    index: dict[tuple[int, ...], int] = {}
    parents = []
    for i, path in enumerate(ordered):
        if path in index:
            raise SpecdecError(f"duplicate tree choice {list(path)}")
        if len(path) > 1 and path[:-1] not in index:
            raise SpecdecError(f"tree choice {list(path)} needs its prefix {list(path[:-1])} as a choice too")
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
        index[path] = i
    return parents, [p[-1] for p in ordered]


def parse_schedule(text: str) -> dict[int, int]:
    """'1:4,4:2,8:0' -> {1: 4, 4: 2, 8: 0}: from batch size 1 use k=4, from 4 use 2, from 8 plain."""
    out = {}
    try:
        for item in text.split(","):
            b, k = item.split(":")
            out[int(b)] = int(k)
    except ValueError:
        raise SpecdecError(f"a k schedule is 'batch:k,batch:k' with integers, e.g. 1:4,4:2,8:0; got {text!r}") from None
    if not out or min(out) < 1 or min(out.values()) < 0:
        raise SpecdecError(f"a k schedule needs batch sizes >= 1 and k >= 0, got {text!r}")
    return out
