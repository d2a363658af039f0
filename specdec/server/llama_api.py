"""llama-server's own endpoints, for the clients written against it: POST /completion (also
/completions) and POST /infill, the code-completion endpoint of llama.vscode and llama.vim.

Request fields, with llama-server's defaults: prompt (text or token ids; /infill: text, placed after the
prefix), n_predict (-1: as many as the context leaves; 0: the prompt is prefilled into the prefix cache,
nothing generated), temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty, presence_penalty,
frequency_penalty (as llama.cpp counts them: over the last repeat_last_n tokens of the prompt and answer,
default 64; -1: all of them; 0: off), logit_bias (pairs
[[id, bias]], false banning the token, or a dict), seed (-1: random), stop, stream, n_probs (0..20),
json_schema, grammar, samplers (which of temperature, top_k, top_p, min_p, infill (llama.cpp's infill
sampler, sampling/infill.py) and penalties apply, and the order all but the penalties apply in; unset:
llama.cpp's, top_k, top_p, min_p, temperature; the penalties always first; other names are accepted and
have no effect), n_indent and t_max_predict_ms (server/scheduler.py's TextTracker: the text ends before a
line indented less, or at a line end once that long has passed since the first token),
cache_prompt (the prefix cache is always on), speculative.n_max. /infill adds input_prefix,
input_suffix and input_extra ([{filename, text}]), laid out as llama-server lays them (`infill_ids`).
Refused with a 400 naming the field: mirostat, typical_p, dry, xtc, top_n_sigma, dynamic temperature or
LoRA adapters set to anything that would act, and ignore_eos.
Answers are llama-server's: {content, stop, stop_type (eos, word, limit, none), stopping_word, tokens_predicted,
tokens_evaluated, tokens_cached, timings (with draft_n and draft_n_accepted), generation_settings, ...}
plus `speculative` (the usage's); a stream is `data: {...}` chunks ending with one whose stop is true.
"""

from __future__ import annotations

from typing import Union

from fastapi.responses import Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from specdec.model.tokenizer import REPO_SPELLINGS, encode_infill, fim_ids, lead_ids, spelled_ids, text_ids
from specdec.server.logprobs import Scored, chat_content
from specdec.server.protocol import _Sampling, collected, error_body, sse
from specdec.config import LLAMA_ORDER, SAMPLER_ORDER
from specdec.sampling.infill import InfillVocab
from specdec.sampling.logprobs import MAX_TOP_LOGPROBS

INFILL_BATCH = 2048  # as llama-server's default batch: the prefix keeps its last 3/4 of it, the suffix 1/4
SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's separator of extra chunks where the model has no file token
SAMPLERS = {"temperature": "temperature", "temp": "temperature", "top_k": "top_k", "top-k": "top_k", "topk": "top_k",
            "top_p": "top_p", "top-p": "top_p", "topp": "top_p", "nucleus": "top_p", "min_p": "min_p",
            "min-p": "min_p", "minp": "min_p", "penalties": "penalties", "infill": "infill"}
SAMPLER_LETTERS = {"t": "temperature", "k": "top_k", "p": "top_p", "m": "min_p", "e": "penalties", "i": "infill"}
ORDERED = (*SAMPLER_ORDER, "infill")  # the samplers whose order counts (the penalties always come first)
# fields that would change sampling in ways this server does not: (name, the value that leaves it off)
INERT = (("mirostat", 0), ("typical_p", 1.0), ("dry_multiplier", 0.0), ("xtc_probability", 0.0),
         ("top_n_sigma", -1.0), ("dynatemp_range", 0.0), ("ignore_eos", False))


class ExtraChunk(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str
    filename: str = "tmp"


class LlamaCompletionRequest(_Sampling):
    """llama-server's /completion body, read into the fields Endpoints.submit reads (see the module's text)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    model: str | None = None
    prompt: Union[str, list[int]] = ""
    max_tokens: int = Field(-1, ge=-1, validation_alias=AliasChoices("n_predict", "max_tokens"))
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    top_k: int = Field(40, ge=-1)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    min_p: float = Field(0.05, ge=0.0, le=1.0)
    seed: int | None = None
    repeat_last_n: int = Field(64, ge=-1)
    logit_bias: dict[str, float] | None = None
    samplers: list[str] | str | None = None
    n_probs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: float = Field(0, ge=0)
    cache_prompt: bool = True
    return_tokens: bool = False
    lora: list | None = None

    @field_validator("seed", mode="before")
    @classmethod
    def _random_seed(cls, v):
        return None if v is None or v in (-1, 0xFFFFFFFF) else v

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v):
        if v is not None and not 0 <= v < 2**63:
            raise ValueError(f"seed must be -1 (random) or in [0, 2^63), got {v}")
        return v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _pairs(cls, v):
        """llama-server's [[id, bias], ...] (bias false: never) or {id: bias} -> {"id": bias}."""
        if v is None or isinstance(v, dict):
            return v
        if not isinstance(v, list) or any(not isinstance(p, list) or len(p) != 2 for p in v):
            raise ValueError("logit_bias must be [[token id, bias], ...] or {token id: bias}")
        return {str(t): -100.0 if b is False else b for t, b in v}

    @model_validator(mode="after")
    def _llama_rules(self):
        extra = self.model_extra or {}
        for name, off in INERT:
            if extra.get(name, off) not in (off, None):
                raise ValueError(f"{name} is not supported by this server; leave it out (or at {off})")
        if self.lora:
            raise ValueError("lora adapters are not supported by this server")
        if isinstance(self.prompt, list) and any(t < 0 for t in self.prompt):
            raise ValueError("token ids must be >= 0")
        if self.samplers is not None:
            on = self.sampler_names()
            if "temperature" not in on:
                self.temperature = 1.0  # llama.cpp: without its temperature sampler the logits are drawn as they are
            self.top_k = self.top_k if "top_k" in on else 0
            self.top_p = self.top_p if "top_p" in on else 1.0
            self.min_p = self.min_p if "min_p" in on else 0.0
            if "penalties" not in on:
                self.no_penalties()
        return self

    @property
    def line_rules(self) -> tuple[int, float]:
        return self.n_indent, self.t_max_predict_ms

    @property
    def sampler_order(self) -> tuple[str, ...]:
        """The order of the temperature and the cuts: as `samplers` names them (those it leaves out, which
        are off, after), else llama.cpp's default chain's."""
        if self.samplers is None:
            return LLAMA_ORDER
        named = [s for s in self.sampler_list() if s in ORDERED]
        named = list(dict.fromkeys(named))  # a sampler named twice applies where it is first named
        return tuple(named + [s for s in LLAMA_ORDER if s not in named])

    def sampler_list(self) -> list[str]:
        """The samplers named (letters or names), in order, as this server's names: temperature, top_k,
        top_p, min_p, infill, penalties (names it does not know left out)."""
        if isinstance(self.samplers, str):
            return [SAMPLER_LETTERS[c] for c in self.samplers if c in SAMPLER_LETTERS]
        return [SAMPLERS[s.lower()] for s in self.samplers or () if s.lower() in SAMPLERS]

    def sampler_names(self) -> set[str]:
        return set(self.sampler_list())

    def settings(self) -> dict:
        """The answer's generation_settings: the request's sampling as this server applies it."""
        return {"n_predict": self.max_tokens, "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "min_p": self.min_p, "seed": -1 if self.seed is None else self.seed,
                "repeat_penalty": self.repetition_penalty, "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty, "repeat_last_n": self.repeat_last_n,
                "stop": list(self.stop_list), "n_indent": self.n_indent, "t_max_predict_ms": self.t_max_predict_ms,
                "n_probs": self.n_probs, "stream": self.stream, "speculative.n_max": self.speculative_n_max,
                "samplers": [s for s in ("penalties", *self.sampler_order)
                             if self.samplers is None or s in self.sampler_names()]}


class InfillRequest(LlamaCompletionRequest):
    """llama-server's /infill body: a /completion one with the text around the gap."""

    prompt: str = ""
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraChunk] = []


def infill_ids(tokenizer, body: InfillRequest, room: int) -> list[int]:
    """/infill's prompt, as llama-server lays it out: the extra chunks (after the model's repository
    token and "myproject", each as its file token, its file name and its text; without those tokens
    each after a snippet line), then [BOS], the FIM prefix token, the prefix's last 3/4 of INFILL_BATCH
    tokens with the prompt after it, the suffix token, the suffix's first tokens up to a quarter of the
    batch, and the middle token; the extra chunks keep their last tokens that fit `room` (the context
    left past the batch and twice n_predict). The prompt is encoded with its special tokens' strings as those
    tokens, the rest as text, as llama-server encodes each. SpecdecError where the model has no FIM tokens."""
    if fim_ids(tokenizer) is None:
        encode_infill(tokenizer, "", "")  # raises its error, naming what is missing
    pre, suf, mid = fim_ids(tokenizer)
    repo, sep = spelled_ids(tokenizer, REPO_SPELLINGS) or (None, None)
    extra = [] if repo is None else [repo] + text_ids(tokenizer, "myproject\n")
    for chunk in body.input_extra:
        extra += ([sep] + text_ids(tokenizer, chunk.filename + "\n")) if sep is not None else text_ids(tokenizer, SNIPPET)
        extra += text_ids(tokenizer, chunk.text)
    if sep is not None:
        extra += [sep] + text_ids(tokenizer, "filename\n")
    prompt = list(tokenizer.encode(body.prompt, add_special_tokens=False)) if body.prompt else []  # specials parsed
    prefix = text_ids(tokenizer, body.input_prefix)[-(3 * INFILL_BATCH // 4):] if body.input_prefix else []
    suffix = text_ids(tokenizer, body.input_suffix)[:max(0, INFILL_BATCH // 4 - (2 + len(prompt)))]
    keep = min(max(0, room), len(extra))
    return extra[len(extra) - keep:] + lead_ids(tokenizer) + [pre] + prefix + prompt + [suf] + suffix + [mid]


def infill_vocabulary(engine, eos_ids, eos_id: int | None) -> InfillVocab:
    """llama.cpp's infill sampler's view of a vocabulary: the end tokens (eos_ids: llama.cpp's
    end-of-generation set), the one it falls back to (eos_id where it is one of them), and each token's
    text as bytes, read through the grammar engine's tokenizer (`engine`: constraints' Vocabulary.tokenizer;
    special tokens have none, as llama.cpp reads them)."""
    ends = frozenset(eos_ids)
    return InfillVocab(ends, eos_id if eos_id in ends else min(ends),
                       lambda i: b"" if engine.is_special_token(i) else engine.decode_bytes([i]))


STOP_TYPES = {"length": "limit"}  # finish reason -> llama-server's stop_type; 'stop' is eos or word


class LlamaAnswer:
    """One request's answer in llama-server's shapes: whole, or a stream of chunks (Answer's interface)."""

    def __init__(self, model_name: str, body: LlamaCompletionRequest, prompt_ids: list[int], prompt_text: str):
        self.model_name, self.body, self.prompt_ids, self.prompt_text = model_name, body, prompt_ids, prompt_text

    def final(self, content: str, ids: list[int], scored: list[Scored], ev) -> dict:
        usage = ev.usage or {}
        prompt, predicted = len(self.prompt_ids), usage.get("completion_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        spec, t = usage.get("speculative") or {}, ev.timings or {"prompt_ms": 0.0, "predicted_ms": 0.0}
        timings = {"cache_n": cached, "prompt_n": prompt - cached, "prompt_ms": t["prompt_ms"],
                   "prompt_per_token_ms": t["prompt_ms"] / max(1, prompt - cached),
                   "prompt_per_second": 1000.0 * (prompt - cached) / t["prompt_ms"] if t["prompt_ms"] else 0.0,
                   "predicted_n": predicted, "predicted_ms": t["predicted_ms"],
                   "predicted_per_token_ms": t["predicted_ms"] / max(1, predicted),
                   "predicted_per_second": 1000.0 * predicted / t["predicted_ms"] if t["predicted_ms"] else 0.0}
        if spec.get("drafted"):
            timings |= {"draft_n": spec["drafted"], "draft_n_accepted": spec["accepted"]}
        reason = ev.finish_reason
        stop_type = ("word" if ev.stop_word else "eos") if reason == "stop" else STOP_TYPES.get(reason, "none")
        out = {"index": 0, "content": content, "tokens": ids if self.body.return_tokens else [], "id_slot": 0,
               "stop": True, "model": self.model_name, "tokens_predicted": predicted, "tokens_evaluated": prompt,
               "generation_settings": self.body.settings(), "prompt": self.prompt_text,
               "has_new_line": "\n" in content, "truncated": False, "stop_type": stop_type,
               "stopping_word": ev.stop_word or "", "tokens_cached": prompt + predicted, "timings": timings,
               "speculative": spec}
        if self.body.n_probs and scored:
            out["completion_probabilities"] = chat_content(scored)
        return out

    async def whole(self, next_event, handle):
        events = await collected(next_event, handle)
        if events is None:
            return Response(status_code=499)
        return self.final("".join(e.text for e in events), [t for e in events for t in e.token_ids],
                          [s for e in events for s in e.logprobs], events[-1])

    async def stream(self, next_event, handle):
        finished, predicted = False, 0
        try:
            while True:
                ev = await next_event()
                if ev is None:
                    return
                if ev.error:
                    yield sse(error_body(ev.error, "server_error", code="engine_error"))
                    break
                predicted += len(ev.token_ids)
                if ev.kind == "done":
                    if ev.text:
                        yield sse(self.chunk(ev.text, [], ev.logprobs, predicted))
                    yield sse(self.final("", [], [], ev))
                    break
                if ev.text:
                    yield sse(self.chunk(ev.text, ev.token_ids, ev.logprobs, predicted))
            finished = True
        finally:
            if not finished:
                handle.cancel()

    def chunk(self, text: str, ids: list[int], scored: list[Scored], predicted: int) -> dict:
        out = {"index": 0, "content": text, "tokens": ids if self.body.return_tokens else [], "stop": False,
               "id_slot": 0, "tokens_predicted": predicted, "tokens_evaluated": len(self.prompt_ids)}
        if self.body.n_probs and scored:
            out["completion_probabilities"] = chat_content(scored)
        return out
