"""Prometheus series of the server, in their own registry (several servers may live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401 - re-exported for the app

from specdec.metrics import GenerationStats

TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class ServerMetrics:
    """Counters and gauges the scheduler and the app update; `render()` is the /metrics body."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdec_requests", "HTTP requests to the API, by status code", ["status"], registry=r)
        self.finished = Counter("specdec_finished", "Generations that ended, by finish reason", ["reason"],
                                registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens admitted", registry=r)
        self.generated_tokens = Counter("specdec_generated_tokens", "Tokens generated", registry=r)
        self.cached_tokens = Counter("specdec_prefix_cache_hit_tokens", "Prompt tokens the prefix cache held "
                                     "(not prefilled)", registry=r)
        self.queue_depth = Gauge("specdec_queue_depth", "Requests waiting for a slot", registry=r)
        self.active = Gauge("specdec_active_sequences", "Sequences in slots (the active batch size)", registry=r)
        self.max_batch = Gauge("specdec_max_batch", "Slots", registry=r)
        self.drafted = Counter("specdec_drafted_tokens", "Draft tokens proposed (a tree counts its depth)",
                               registry=r)
        self.accepted = Counter("specdec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.drafted_at = Counter("specdec_drafted_at_position", "Drafts reaching position i (1-based)",
                                  ["position"], registry=r)
        self.accepted_at = Counter("specdec_accepted_at_position", "Draft tokens accepted at position i (1-based)",
                                   ["position"], registry=r)
        self.verify_steps = Counter("specdec_verify_steps", "Verify steps (the prefill is not one)", registry=r)
        self.speculative_steps = Counter("specdec_speculative_steps", "Verify steps that drafted at least one token",
                                         registry=r)
        self.tau = Gauge("specdec_tau", "Mean tokens per verify step over finished requests (plain = 1)",
                         registry=r)
        self.tpot = Histogram("specdec_time_per_output_token_seconds",
                              "Per request: (end - first token) / (output tokens - 1)", buckets=TPOT_BUCKETS,
                              registry=r)
        self.speculation_on = Gauge("specdec_speculation_on", "1 while steps draft tokens, 0 while plain "
                                    "(--spec-off-batch / --k-schedule under load)", registry=r)
        self.draft_k = Gauge("specdec_draft_k", "Largest draft length allowed at the current batch size",
                             registry=r)
        self._emitted = 0
        self._steps = 0

    def record_generation(self, stats: GenerationStats) -> None:
        """A finished (or ended) sequence's speculation counts."""
        self.drafted.inc(stats.drafted)
        self.cached_tokens.inc(stats.cached_tokens)
        self.accepted.inc(stats.accepted)
        self.verify_steps.inc(stats.steps)
        self.speculative_steps.inc(stats.steps - (stats.k_chosen[0] if stats.k_chosen else 0))
        for i, (d, a) in enumerate(zip(stats.drafted_at, stats.accepted_at)):
            self.drafted_at.labels(position=str(i + 1)).inc(d)
            self.accepted_at.labels(position=str(i + 1)).inc(a)
        self._emitted += sum(stats.emitted_per_step)
        self._steps += stats.steps
        if self._steps:
            self.tau.set(self._emitted / self._steps)

    def render(self) -> bytes:
        return generate_latest(self.registry)
