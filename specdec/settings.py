"""What each command's flags configure, as frozen objects validated on construction: one class per
component, its fields named as the flags' destinations (flags.py defines the flags and builds these;
nothing below the CLI reads the parsed command line).

  ModelSettings     the model flags of every command that loads one (add_model_flags)
  DraftingSettings  how generate and serve draft (add_spec_flags)
  ServeSettings     the HTTP server (add_serve_flags), with its Access and RequestLimits (server/guard.py
                    enforces them); RaySettings its replicas (add_ray_flags)
  BenchSettings     specdec bench (add_bench_flags); LoadtestSettings specdec loadtest
Sampling is config.SamplingParams, whose fields are the sampling flags'.
"""

from __future__ import annotations

import hmac
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

import specdec.model
from specdec.config import SAMPLER_ORDER, SamplingParams, TreeConfig, parse_schedule, rank_paths
from specdec.drafters import registry
from specdec.errors import SpecdecError

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_DRAFT_VOCAB = 32768  # the draft scores ids < 32768: faster drafts for the Qwen2.5 pair, the output unchanged
LOADTEST_MODES = ("off", "on", "policy")  # speculation off, on at a fixed k, the policy's choice
API_KEY_ENV = "SPECDEC_API_KEY"  # serve's --api-key, kept out of the process list
STATS_PATHS = ("/stats", "/metrics")
MIB = 1 << 20


def at_least(flag: str, value, low) -> None:
    if value < low:
        raise SpecdecError(f"{flag} must be >= {low}, got {value}")


SELF_DRAFT = "self"  # --draft self: the target's own weights, re-encoded at load, draft for it
NO_DRAFT = "none"  # --draft none: plain decoding


@dataclass(frozen=True)
class ModelSettings:
    model: str = DEFAULT_TARGET
    device: str | None = None
    dtype: str | None = None
    max_context: int = 4096
    weight_dtype: str | None = None
    cuda_graphs: bool = False
    gpu_kernels: bool = False
    draft_bits: int | None = None  # None: auto, the kernel build's best (cpu_kernels.best_draft_bits)
    threads: int | None = None  # None: torch's default

    def __post_init__(self):
        at_least("--max-context", self.max_context, 1)
        if self.threads is not None:
            at_least("--threads", self.threads, 1)
        if self.draft_bits not in (None, 3, 4, 8):
            raise SpecdecError(f"--draft-bits must be 3, 4, 8 or auto, got {self.draft_bits}")

    def load(self, spec: str | None = None, draft: bool = False, progress=None, beside=None, head_rows: int = 0,
             defer: bool = False):
        """load_model(spec or the model) with these settings; a draft named "self" is the model itself,
        loaded again as a draft (its blocks re-encoded in --draft-bits). beside: a model loaded before,
        whose tokenizer this one takes where the two files' tokenizers are the same. head_rows: a
        draft's LM head only for ids below it (--draft-vocab; 0: all). defer: a draft's weights loaded at
        its first use, where load_model can defer them."""
        if draft and spec == SELF_DRAFT:
            spec = self.model
        if self.threads is not None:  # before the load: repacking and the costs measured at first use run on them
            torch.set_num_threads(self.threads)
        return specdec.model.load_model(spec or self.model, device=self.device, dtype=self.dtype,
                                        cuda_graphs=self.cuda_graphs, gpu_kernels=self.gpu_kernels,
                                        weight_dtype=self.weight_dtype, draft=draft,
                                        draft_bits=self.draft_bits, progress=progress or print, beside=beside,
                                        head_rows=head_rows, defer=defer)


@dataclass(frozen=True)
class DrafterKnobs:
    """How the drafters are tuned (flags.add_drafter_knobs): shared by generate/serve and bench.
    `drafters`: each registered drafter's own settings (its Entry.settings), from its own flags."""
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    draft_p_min: float = 0.0
    draft_window: int = 0
    tree_depth: int = 4
    tree_topk: int = 4
    layer_skip: str | None = None
    layer_skip_file: str = "runs/layer_skip.json"
    head: str | None = None
    cost_profile: str | None = None
    drafters: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        at_least("--draft-vocab", self.draft_vocab, 0)
        if not 0.0 <= self.draft_p_min < 1.0:
            raise SpecdecError(f"draft p_min must be in [0, 1), got {self.draft_p_min}")
        if self.draft_window < 0:
            raise SpecdecError(f"--draft-window must be >= 0 prompt tokens (0 = the whole prompt), got "
                               f"{self.draft_window}")


@dataclass(frozen=True)
class DraftingSettings(DrafterKnobs):
    draft: str | None = None
    switches: frozenset[str] = frozenset()  # the drafters' on/off flags given (--ngram, --suffix, ...)
    k: int = 4
    tree_budget: int = 0
    tree_choices: str | None = None
    policy: str = "adaptive"
    drafter: str | None = None

    def __post_init__(self):
        super().__post_init__()
        at_least("--k", self.k, 1)
        if self.policy not in ("fixed", "adaptive", "adaptive-k"):
            raise SpecdecError(f"--policy is fixed, adaptive or adaptive-k, got {self.policy!r}")
        entry = registry.method(self.method).entry  # raises on a conflicting choice or an unknown --drafter
        if self.tree_config() is not None and not entry.trees:
            raise SpecdecError(entry.no_trees)

    @property
    def method(self) -> str:
        """--drafter NAME (any registered drafter; --draft, --head and --layer-skip name what it loads),
        else the one the flags given pick (registry.chosen: each drafter declares its own, e.g. --ngram;
        --draft with --ngram is 'hybrid'), else 'none'."""
        if self.drafter is not None:
            return self.drafter
        loaders = {"--draft": self.draft not in (None, NO_DRAFT), "--head": self.head is not None,
                   "--layer-skip": self.layer_skip is not None}
        return registry.chosen(frozenset(self.switches) | {f for f, on in loaders.items() if on}, self.drafters)

    @property
    def adaptive(self) -> bool:
        return self.policy.startswith("adaptive")

    def tree_config(self) -> TreeConfig | None:
        """--tree-choices (static) or --tree-budget > 0 (dynamic), else None (chains)."""
        if self.tree_choices:
            return TreeConfig(choices=parse_choices(self.tree_choices))
        if self.tree_budget:
            return TreeConfig(self.tree_budget, self.tree_depth, self.tree_topk)
        return None


def parse_choices(text: str) -> tuple[tuple[int, ...], ...]:
    """Medusa-style choices from JSON text or a JSON file: [[0], [1], [0, 0], ...]."""
    raw = open(text).read() if os.path.isfile(text) else text
    try:
        value = json.loads(raw)
    except ValueError:
        raise SpecdecError(f"--tree-choices must be a JSON list of rank paths like [[0], [1], [0, 0]], "
                           f"or a file holding one; got {text[:60]!r}") from None
    if not isinstance(value, list) or not all(isinstance(c, list) and all(isinstance(r, int) for r in c) for c in value):
        raise SpecdecError(f"--tree-choices must be a list of lists of integers, got {text[:60]!r}")
    rank_paths(value)  # validates: empty, negative ranks, missing prefixes, duplicates
    return tuple(tuple(c) for c in value)


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 4
    max_queue: int = 64
    request_timeout: float = 600.0
    memory_budget_gb: float | None = None
    spec_off_batch: int | None = None
    k_schedule: str | None = None
    prefill_chunk: int = 256
    prefix_cache: bool = True
    shutdown_grace: float = 10.0
    served_model_name: str | None = None
    api_key: str | None = field(default=None, repr=False)  # or $SPECDEC_API_KEY (flags.serve_settings)
    api_key_protects_stats: bool = False
    max_body_bytes: int = 4 * MIB
    max_stop_length: int = 256
    max_messages: int = 512

    def __post_init__(self):
        for flag, value, low in (("--max-batch", self.max_batch, 1), ("--max-queue", self.max_queue, 0),
                                 ("--prefill-chunk", self.prefill_chunk, 1),
                                 ("--max-body-bytes", self.max_body_bytes, 1),
                                 ("--max-stop-length", self.max_stop_length, 1),
                                 ("--max-messages", self.max_messages, 1)):
            at_least(flag, value, low)
        self.check_api_key()
        if self.spec_off_batch is not None:
            at_least("--spec-off-batch", self.spec_off_batch, 0)
        if self.request_timeout < 0:
            raise SpecdecError(f"--request-timeout must be >= 0 (0 = none), got {self.request_timeout}")
        if self.memory_budget_gb is not None and self.memory_budget_gb <= 0:
            raise SpecdecError(f"--memory-budget-gb must be > 0, got {self.memory_budget_gb}")
        self.schedule()

    def schedule(self) -> dict[int, int] | None:
        return parse_schedule(self.k_schedule) if self.k_schedule else None

    def check_api_key(self) -> None:
        if self.api_key is not None and not (self.api_key.isascii() and self.api_key.isprintable()
                                             and self.api_key and " " not in self.api_key):
            raise SpecdecError("--api-key (or $SPECDEC_API_KEY) must be non-empty printable ASCII without spaces")
        if self.api_key_protects_stats and self.api_key is None:
            raise SpecdecError("--api-key-protects-stats needs an API key: give --api-key KEY or set "
                               "$SPECDEC_API_KEY")

    def access(self) -> Access:
        """Who may call what."""
        return Access(self.api_key, self.api_key_protects_stats)

    def limits(self) -> RequestLimits:
        """The caps on a request."""
        return RequestLimits(self.max_body_bytes, self.max_stop_length, self.max_messages)


@dataclass(frozen=True)
class Access:
    """Who may call what (server/guard.py enforces it): no key, everything is open."""

    api_key: str | None = field(default=None, repr=False)
    protects_stats: bool = False

    def needs_key(self, path: str) -> bool:
        """Every path but /health (and /stats, /metrics unless protects_stats), when there is a key."""
        if self.api_key is None or path == "/health":
            return False
        return self.protects_stats or path not in STATS_PATHS

    def allows(self, authorization: str | None, x_api_key: str | None = None) -> bool:
        """Whether an Authorization header value (Bearer KEY) or an x-api-key one (Anthropic's) carries the
        key (compared in constant time)."""
        if self.api_key is None:
            return False
        scheme, _, given = (authorization or "").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            return True
        return x_api_key is not None and hmac.compare_digest(x_api_key.strip().encode(), self.api_key.encode())


@dataclass(frozen=True)
class RequestLimits:
    """The caps on one request (the serve flags of the same names)."""

    max_body_bytes: int = 4 * MIB
    max_stop_length: int = 256  # characters of one stop string
    max_messages: int = 512  # messages of one chat request

    def violation(self, stops: tuple[str, ...] = (), messages: int = 0) -> tuple[str, str] | None:
        """(param, message) of the first limit a request's stop strings or message count exceed, or None."""
        long = [s for s in stops if len(s) > self.max_stop_length]
        if long:
            return "stop", (f"Invalid value for 'stop': a stop string may have at most {self.max_stop_length} "
                            f"characters; one has {len(long[0])}")
        if messages > self.max_messages:
            return "messages", (f"Invalid value for 'messages': at most {self.max_messages} messages per request, "
                                f"got {messages}")
        return None


@dataclass(frozen=True)
class RaySettings:
    ray: bool = False
    replicas: int | None = None
    autoscale: str | None = None
    autoscale_delays: str = "30:600"  # seconds of load before adding a replica : of idleness before removing one
    ray_address: str | None = None
    cpus_per_replica: float = 1.0
    ray_routing: str = "conversation"

    def __post_init__(self):
        if self.ray:
            self.replica_range()

    def replica_range(self) -> tuple[int, int]:
        """(min, max) replicas from --replicas / --autoscale."""
        if self.autoscale and self.replicas is not None:
            raise SpecdecError("give --replicas N or --autoscale MIN:MAX, not both")
        if self.cpus_per_replica <= 0:
            raise SpecdecError(f"--cpus-per-replica must be > 0, got {self.cpus_per_replica}")
        if self.ray_routing not in ("conversation", "least-loaded"):
            raise SpecdecError(f"--ray-routing is conversation or least-loaded, got {self.ray_routing!r}")
        if self.autoscale:
            self.delays()
            return parse_autoscale(self.autoscale)
        n = 2 if self.replicas is None else self.replicas
        at_least("--replicas", n, 1)
        return n, n


    def delays(self) -> tuple[float, float]:
        """(up, down) seconds from --autoscale-delays UP:DOWN."""
        try:
            up, down = (float(x) for x in self.autoscale_delays.split(":"))
        except ValueError:
            raise SpecdecError(f"--autoscale-delays takes UP:DOWN seconds, e.g. 30:600; got {self.autoscale_delays!r}") \
                from None
        if up < 0 or down < 0:
            raise SpecdecError(f"--autoscale-delays needs seconds >= 0, got {self.autoscale_delays!r}")
        return up, down


def parse_autoscale(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise SpecdecError(f"--autoscale takes MIN:MAX replicas, e.g. 1:4; got {text!r}") from None
    if not 1 <= lo <= hi:
        raise SpecdecError(f"--autoscale needs 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


@dataclass(frozen=True)
class BenchSettings(DrafterKnobs):
    draft: str = DEFAULT_DRAFT
    methods: str = "plain,draft,ngram,hf"
    llama_bin: str | None = None
    dataset: str | None = None
    limit: int | None = None
    categories: str | None = None
    k: str = "2,auto"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 0
    order: tuple[str, ...] = SAMPLER_ORDER
    seed: int | None = None
    ignore_eos: bool = False
    repeats: int = 1
    theory: bool = False
    no_plots: bool = False
    report_only: bool = False
    out: str = "runs/bench"

    def __post_init__(self):
        super().__post_init__()
        at_least("--repeats", self.repeats, 1)
        at_least("--max-new-tokens", self.max_new_tokens, 1)
        self.sampling  # noqa: B018 - validated now: a bad value is the flags' error

    @property
    def sampling(self) -> SamplingParams:
        """Every method's sampling (the seed the base one: per prompt, seed + index)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed, self.min_p,
                              self.repetition_penalty, self.presence_penalty, self.frequency_penalty,
                              penalty_last_n=self.penalty_last_n, order=self.order)


@dataclass(frozen=True)
class LoadtestSettings:
    draft: str | None = None
    ngram: bool = False
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    modes: str = "off,on,policy"
    order: str = "level"
    concurrency: str = "1,2,4,8,16"
    min_requests: int = 4
    max_tokens: int = 32
    k: int = 4
    max_batch: int = 16
    dataset: str | None = None
    categories: str | None = None
    completions: bool = False
    timeout: float = 900.0
    ray: bool = False
    replicas: int = 2
    cpus_per_replica: float = 1.0
    out: str = "runs/loadtest"

    def __post_init__(self):
        if self.draft and self.ngram:
            raise SpecdecError("choose one drafter for the speculative modes: --draft MODEL or --ngram")
        for flag, value, low in (("--k", self.k, 1), ("--max-batch", self.max_batch, 1),
                                 ("--min-requests", self.min_requests, 1), ("--max-tokens", self.max_tokens, 1),
                                 ("--replicas", self.replicas, 1)):
            at_least(flag, value, low)
        self.levels(), self.mode_list()

    def levels(self) -> list[int]:
        try:
            levels = [int(x) for x in str(self.concurrency).split(",") if x.strip()]
        except ValueError:
            levels = []
        if not levels or min(levels) < 1:
            raise SpecdecError(f"--concurrency needs positive integers such as 1,2,4,8,16; got {self.concurrency!r}")
        return levels

    def mode_list(self) -> list[str]:
        modes = [m.strip() for m in self.modes.split(",") if m.strip()]
        bad = [m for m in modes if m not in LOADTEST_MODES]
        if bad or not modes:
            raise SpecdecError(f"unknown mode(s) {bad}; choose from {', '.join(LOADTEST_MODES)}")
        return modes
