"""The scheduler: one background thread owns the engine; requests join and leave at step boundaries.

The event loop never runs torch. It calls `submit()` (cheap: checks, then a queue append under a
lock) and receives `Event`s through the `sink` it passed, which the scheduler thread calls (the app's
sink hops back onto the loop with `call_soon_threadsafe`).

`submit()` hands the request to the engine (`Engine.add_request`, which checks that it fits: a bad
request is the client's error), where it waits for a slot; the queue is bounded here. The engine
steps; the server admits, streams and cancels. The thread's loop, one iteration per round:
1. reap: end requests that were cancelled (client gone), passed their deadline ('timeout') or are
   being aborted at shutdown ('abort'): `Engine.abort`, their slots free for the next;
2. set the round's draft-length limit from the number of requests in slots (`k_for_batch`);
3. one `Engine.step()`: waiting requests take free slots, each request in a slot runs a prefill
   (chunk) or one speculative step; an exception fails that request only ('error'), never the thread;
4. deliver: decode each request's new tokens to text, cut at the first stop string (then the
   request ends with 'stop' and leaves its slot), send the text that can no longer change, with
   its tokens' logprobs where the request asks (the tokens whose text is sent: none past a stop
   string, nor an end-of-sequence token; the prompt's with the first event, for echo).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from specdec.config import GenerationConfig, SamplingParams
from specdec.engine.engine import Engine, Sequence
from specdec.errors import SpecdecError
from specdec.server.logprobs import Scored, TokenTexts
from specdec.server.metrics import ServerMetrics

log = logging.getLogger("specdec.server")


class QueueFull(Exception):
    """The wait queue is full; retry after `retry_after` seconds (HTTP 429)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The server no longer admits requests (HTTP 503)."""


@dataclass(frozen=True)
class RequestParams:
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: not asked; n: each token's logprob and its n top alternatives
    prompt_logprobs: bool = False  # the prompt's tokens' logprobs too (echo)
    constraint: object | None = field(default=None, compare=False)  # its grammar (a fresh Constraint), or None
    k_max: int | None = None  # the request's own cap on a step's draft length (None: the server's; 0: plain)
    indent: int = 0  # > 0: the text ends before a later line indented less (llama-server's n_indent)
    line_ms: float = 0.0  # > 0: past this long from the first token, the text ends at a line end (t_max_predict_ms)

    def generation(self, k: int) -> GenerationConfig:
        """The request's GenerationConfig under the server's draft length k."""
        k = k if self.k_max is None else min(k, self.k_max)
        return GenerationConfig(self.max_tokens, k, self.sampling, logprobs=self.logprobs,
                                prompt_logprobs=self.prompt_logprobs)


@dataclass
class Event:
    """'delta': new text (and the tokens that completed it); 'done': the rest of the text, the finish
    reason ('stop', 'length', 'timeout', 'abort', 'cancelled' or 'error'), usage and any error.
    Where asked: the logprobs of the tokens sent so far and not yet scored, and with the first event
    the prompt's."""

    kind: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    error: str | None = None
    logprobs: list[Scored] = field(default_factory=list)
    prompt_logprobs: list[Scored] | None = None
    stop_word: str | None = None  # 'done': the stop string the text ended at
    timings: dict | None = None  # 'done': prompt_ms (the prefill's) and predicted_ms (from the first token on)


def k_schedule(spec_off_batch: int | None = None, schedule: dict[int, int] | None = None) -> Callable[[int], int | None]:
    """batch size -> the largest draft length allowed (None = no limit; 0 = plain steps).

    spec_off_batch N: 0 when more than N sequences are active. schedule {min batch: k} (from
    specdec.policy.parse_schedule, e.g. '1:4,4:2,8:0'): the entry of the largest size <= batch;
    below its smallest size there is no limit."""
    def limit(batch: int) -> int | None:
        if spec_off_batch is not None and batch > spec_off_batch:
            return 0
        if schedule:
            sizes = [b for b in schedule if b <= batch]
            if sizes:
                return schedule[max(sizes)]
        return None
    return limit


class TextTracker:
    """Turns a growing list of token ids into text deltas, cut where the text ends: at the first stop
    string ('stop'); under llama-server's rules for code completion ('length'), before the first
    character of a line (past the first) indented by fewer than `indent` spaces or tabs (its n_indent),
    and, once the request is past its time (`add(overdue=True)`, its t_max_predict_ms), after the first
    line end in the new text.

    Text is held back while it ends in an incomplete UTF-8 character or in a prefix of a stop
    string (it may still turn into one)."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), lock: threading.Lock | None = None, indent: int = 0):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.indent = indent
        self.lock = lock or threading.Lock()
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of text already delivered
        self.ended: str | None = None  # why the text ended: 'stop' or 'length'; None: it goes on
        self.word: str | None = None  # the stop string it ended at

    def _decode(self) -> str:
        with self.lock:
            return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def add(self, new: list[int], overdue: bool = False) -> tuple[str, str | None]:
        """New tokens -> (text to deliver now, why the text ended: 'stop', 'length' or None)."""
        if self.ended:
            return "", self.ended
        before = len(self.text)
        self.ids += new
        text = self.text = self._decode()
        end = self._end(text, before, overdue)
        if end is not None:
            cut, self.ended, self.word = end
            self.text = text[:cut]
            delta = text[self.sent:cut]
            self.sent = max(self.sent, cut)
            return delta, self.ended
        safe = len(text)
        if text.endswith("\ufffd"):
            safe = len(text.rstrip("\ufffd"))
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    safe = min(safe, len(text) - n)
                    break
        delta = text[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return delta, None

    def _end(self, text: str, before: int, overdue: bool) -> tuple[int, str, str | None] | None:
        """The earliest end in `text` (its first `before` characters were there before): (where it is
        cut, why, the stop string), or None."""
        ends = [(i, "stop", s) for s, i in ((s, text.find(s)) for s in self.stop) if i >= 0]
        if self.indent > 0:
            line = text.find("\n")
            while line >= 0:
                first = line + 1  # the line's first character past its indentation
                while first < len(text) and text[first] in " \t":
                    first += 1
                if first < len(text) and first - line - 1 < self.indent:
                    ends.append((first, "length", None))
                    break
                line = text.find("\n", first)
        if overdue and (line := text.find("\n", before)) >= 0:
            ends.append((line + 1, "length", None))
        return min(ends, key=lambda e: e[0]) if ends else None

    def covering(self, start: int = 0) -> int:
        """The fewest leading tokens (at least `start`) whose text covers the text kept so far: tokens
        past a stop string, or an end-of-sequence token, add nothing to it."""
        m, n = len(self.ids), len(self.text)
        with self.lock:
            while m > start and len(self.tokenizer.decode(self.ids[:m - 1], skip_special_tokens=True)) >= n:
                m -= 1
        return m

    def flush(self) -> str:
        """Everything not yet delivered (at the end of the sequence)."""
        delta = self.text[self.sent:]
        self.sent = len(self.text)
        return delta


class Handle:
    """One submitted request, as the app holds it: `cancel()` ends it at the next step boundary."""

    _ids = itertools.count(1)

    def __init__(self, prompt: list[int], params: RequestParams, sink: Callable[[Event], None],
                 deadline: float | None, tracker: TextTracker):
        self.id = next(self._ids)
        self.prompt = prompt
        self.params = params
        self.sink = sink
        self.deadline = deadline
        self.tracker = tracker
        self.submitted = time.monotonic()
        self.seq: Sequence | None = None
        self.sent_tokens = 0
        self.scored = 0  # new tokens whose logprobs were sent
        self.prompt_scored = False  # the prompt's logprobs were sent
        self.t_first: float | None = None
        self.done = False
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Scheduler:
    """Owns an engine (specdec.engine.Engine) on one thread: bounds its wait queue, steps it, streams
    each request's text and ends requests that are cancelled, time out or are aborted."""

    def __init__(self, engine: Engine, tokenizer, eos_ids: set[int], k: int = 4, max_queue: int = 64,
                 request_timeout: float | None = None, k_for_batch: Callable[[int], int | None] | None = None,
                 metrics: ServerMetrics | None = None, memory=None, model=None):
        if max_queue < 0:
            raise SpecdecError(f"max_queue must be >= 0, got {max_queue}")
        if k < 1:
            raise SpecdecError(f"k (draft length) must be >= 1, got {k}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.tokenizer_lock = threading.Lock()  # the app encodes while this thread decodes
        self.token_texts = TokenTexts(tokenizer, self.tokenizer_lock)
        self.eos_ids = set(eos_ids)
        self.k = k
        self.max_queue = max_queue
        self.request_timeout = request_timeout if request_timeout and request_timeout > 0 else None
        self.k_for_batch = k_for_batch
        self.metrics = metrics or ServerMetrics()
        self.memory = memory  # a MemoryPlan, for /stats
        self.model = model  # the LoadedModel, when built from CLI values
        self.metrics.max_batch.set(engine.max_batch)
        self.metrics.speculation_on.set(int(engine.speculative))
        self._cv = threading.Condition()
        self._handles: list[Handle] = []  # submitted and not ended (waiting in the engine or in a slot)
        self._draining = False
        self._abort = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._mean_seconds = 1.0  # running mean of request durations, for Retry-After
        self.speculation_on = engine.speculative
        self.k_limit: int | None = None

    # ---- the app's side (any thread) ----

    @property
    def context(self) -> int:
        return self.engine.capacity

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="specdec-scheduler", daemon=True)
            self._thread.start()

    def submit(self, prompt: list[int], params: RequestParams, sink: Callable[[Event], None]) -> Handle:
        """Queue a request. Raises SpecdecError (bad request: too long, bad values), QueueFull, ShuttingDown."""
        if self._draining or self._stop:
            raise ShuttingDown("the server is shutting down and admits no new requests")
        if not self.alive:
            raise ShuttingDown("the scheduler is not running")
        cfg = params.generation(self.k)  # validates
        deadline = time.monotonic() + self.request_timeout if self.request_timeout else None
        handle = Handle(list(prompt), params, sink, deadline, TextTracker(self.tokenizer, params.stop,
                                                                          self.tokenizer_lock, params.indent))
        with self._cv:
            free = self.engine.max_batch - len(self.engine.running)
            if len(self.engine.waiting) >= self.max_queue + free:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting, {self.engine.max_batch} running); "
                                "retry later", self._retry_after())
            handle.seq = self.engine.add_request(handle.prompt, cfg, self.eos_ids, constraint=params.constraint,
                                                 tag=handle)  # checks the fit: a SpecdecError is the client's
            self._handles.append(handle)
            self.metrics.prompt_tokens.inc(len(prompt))
            self._sync_counts()
            self._cv.notify()
        return handle

    def drain(self, grace: float) -> None:
        """Stop admitting; requests still running after `grace` seconds end with 'abort'."""
        with self._cv:
            if self._draining:
                return
            self._draining = True
        timer = threading.Timer(max(0.0, grace), self._begin_abort)
        timer.daemon = True
        timer.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread; whatever is still queued or running ends with 'abort'."""
        with self._cv:
            self._draining = self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def snapshot(self) -> dict:
        with self._cv:
            active, queued = len(self.engine.running), len(self.engine.waiting)
            return {"active": active, "queued": queued, "max_batch": self.engine.max_batch,
                    "free_slots": self.engine.max_batch - active, "max_queue": self.max_queue,
                    "context": self.context, "speculation_on": self.speculation_on, "k": self.k,
                    "k_limit": self.k_limit, "draining": self._draining, "alive": self.alive,
                    "request_timeout": self.request_timeout,
                    "memory": self.memory.summary() if self.memory is not None else None}

    def _retry_after(self) -> int:
        waves = (len(self.engine.waiting) + 1) / max(1, self.engine.max_batch)
        return int(min(60, max(1, math.ceil(self._mean_seconds * waves))))

    def _begin_abort(self) -> None:
        with self._cv:
            self._abort = True
            self._cv.notify()

    # ---- the scheduler thread ----

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._stop or self._handles):
                        self._cv.wait(0.5)
                    if self._stop:
                        break
                try:
                    self._reap()
                    if self.engine.has_work:
                        self._round()
                except Exception:  # noqa: BLE001 - keep serving; the failing request was ended
                    log.exception("scheduler iteration failed")
                    time.sleep(0.01)
        finally:
            with self._cv:
                left = list(self._handles)
            for h in left:
                self._end(h, "abort")

    def _sync_counts(self) -> None:
        self.metrics.queue_depth.set(len(self.engine.waiting))
        self.metrics.active.set(len(self.engine.running))

    def _reap(self) -> None:
        """End the requests that were cancelled, passed their deadline or are aborted at shutdown."""
        now = time.monotonic()
        with self._cv:
            handles = list(self._handles)
        for h in handles:
            if h.cancelled:
                self._end(h, "cancelled")
            elif self._abort:
                self._end(h, "abort")
            elif h.deadline is not None and now > h.deadline:
                self._end(h, "timeout")

    def _round(self) -> None:
        """One engine step at the draft-length limit of the load, then every request's new text."""
        with self._cv:
            load = min(len(self._handles), self.engine.max_batch)
        limit = self.k_for_batch(load) if self.k_for_batch else None
        self.engine.k_limit = self.k_limit = limit
        k_now = self.k if limit is None else min(self.k, limit)
        self.speculation_on = self.engine.speculative and k_now > 0
        self.metrics.speculation_on.set(int(self.speculation_on))
        self.metrics.draft_k.set(k_now if self.engine.speculative else 0)
        done = self.engine.step()
        with self._cv:
            self._sync_counts()
            handles = list(self._handles)
        for h in handles:
            if h.seq.error is not None:
                continue
            try:
                self._deliver(h)
            except Exception as e:  # noqa: BLE001
                log.exception("request %s failed while decoding its text", h.id)
                self._end(h, "error", f"decoding the output failed: {type(e).__name__}: {e}")
        for seq in done:
            e = seq.error
            if e is not None:
                log.error("request %s failed in its step", seq.tag.id, exc_info=e)
                self._end(seq.tag, "error", f"the request failed in the engine: {type(e).__name__}: {e}")
            else:
                self._end(seq.tag, seq.finish_reason or "stop")

    def _deliver(self, h: Handle) -> None:
        if h.done:
            return
        new = h.seq.new_tokens[h.sent_tokens:]
        if not new:
            return
        h.sent_tokens += len(new)
        self.metrics.generated_tokens.inc(len(new))
        if h.t_first is None:
            h.t_first = time.monotonic()
        delta, ended = h.tracker.add(new, self._overdue(h))
        if delta:
            self._send(h, Event("delta", delta, new, logprobs=self._scored(h), prompt_logprobs=self._prompt_scored(h)))
        if ended:
            self._end(h, ended)

    @staticmethod
    def _overdue(h: Handle) -> bool:
        """Whether the request is past its time for lines (RequestParams.line_ms) since its first token."""
        return h.params.line_ms > 0 and h.t_first is not None and \
            (time.monotonic() - h.t_first) * 1000.0 > h.params.line_ms

    def _end(self, h: Handle, reason: str, error: str | None = None) -> None:
        """Finish a request once: out of the engine (its slot free), the rest of its text, usage and reason."""
        if h.done:
            return
        h.done = True
        seq = h.seq
        self.engine.abort(seq)
        with self._cv:
            if h in self._handles:
                self._handles.remove(h)
            self._sync_counts()
        tail, scored, prompt_scored = "", [], None
        if error is None:
            try:
                if h.sent_tokens < len(seq.new_tokens):
                    _, ended = h.tracker.add(seq.new_tokens[h.sent_tokens:], self._overdue(h))
                    reason = ended or reason
                    h.sent_tokens = len(seq.new_tokens)
                tail = h.tracker.flush()
                scored, prompt_scored = self._scored(h), self._prompt_scored(h)
            except Exception as e:  # noqa: BLE001
                reason, error = "error", f"decoding the output failed: {type(e).__name__}: {e}"
        stats, completion = seq.stats, len(seq.new_tokens)
        usage = {"prompt_tokens": len(h.prompt), "completion_tokens": completion,
                 "total_tokens": len(h.prompt) + completion,
                 "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
                 "speculative": {"drafted": stats.drafted, "accepted": stats.accepted, "tau": round(stats.tau, 4),
                                 "steps": stats.steps, "plain_steps": stats.k_chosen[0] if stats.k_chosen else 0,
                                 "drafted_per_position": list(stats.drafted_at),
                                 "accepted_per_position": list(stats.accepted_at),
                                 "lookup_drafted": stats.lookup_drafted, "lookup_accepted": stats.lookup_accepted,
                                 "draft_started_at": stats.draft_started_at}}
        self.metrics.finished.labels(reason=reason).inc()
        if stats.steps or completion:
            self.metrics.record_generation(stats)
            if h.t_first is not None and completion > 1:
                self.metrics.tpot.observe((time.monotonic() - h.t_first) / (completion - 1))
        if reason in ("stop", "length"):
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.monotonic() - h.submitted)
        timings = {"prompt_ms": stats.prefill_seconds * 1000.0,
                   "predicted_ms": 0.0 if h.t_first is None else (time.monotonic() - h.t_first) * 1000.0}
        self._send(h, Event("done", tail, finish_reason=reason, usage=usage, error=error, logprobs=scored,
                            prompt_logprobs=prompt_scored, stop_word=h.tracker.word, timings=timings))

    def _scored(self, h: Handle) -> list[Scored]:
        """The logprobs of the tokens whose text is out now and that were not scored yet (where asked)."""
        seq = h.seq
        if seq is None or seq.logprobs is None:
            return []
        m = min(h.tracker.covering(h.scored), len(seq.logprobs))
        out = [self.token_texts.scored(lp) for lp in seq.logprobs[h.scored:m]]
        h.scored = max(h.scored, m)
        return out

    def _prompt_scored(self, h: Handle) -> list[Scored] | None:
        """The prompt's logprobs, once (where asked); the first token has none."""
        seq = h.seq
        if h.prompt_scored or seq is None or seq.prompt_logprobs is None:
            return None
        h.prompt_scored = True
        return [self.token_texts.scored(lp, tok) for lp, tok in zip(seq.prompt_logprobs, h.prompt)]

    @staticmethod
    def _send(h: Handle, event: Event) -> None:
        try:
            h.sink(event)
        except Exception:  # noqa: BLE001 - the listener is gone (loop closed); nothing to tell
            log.debug("request %s: event dropped", h.id)
