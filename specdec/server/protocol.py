"""OpenAI-compatible request and response bodies (pydantic v2) for /v1/completions, /v1/chat/completions,
/tokenize and /detokenize; the error bodies (APIError) and the server-sent events' framing (sse).

Supported: model, prompt / messages, max_tokens (chat: also max_completion_tokens), temperature,
top_p, top_k, min_p, seed, presence_penalty, frequency_penalty, repetition_penalty (or repeat_penalty),
repeat_last_n (llama-server's counting: the penalties over the last n tokens), logit_bias (token id
strings to [-100, 100]; config.SamplingParams says how each acts), stop (a string or a list), stream
(+ stream_options.include_usage), n (1..128 samples of the prompt, prefilled once; with a seed, choice
i draws from seed + i);
logprobs (completions: 0..20 alternatives, and echo; chat: logprobs and top_logprobs 0..20);
completions' max_tokens 0 with echo: the prompt scored (its logprobs, with logprobs), nothing generated;
completions' suffix: fill in the middle, the answer the text between the prompt and the suffix (through
the model's fill-in-the-middle tokens; a 400 for a model without them, a token-id prompt or echo).
Structured output, on both endpoints (one of them a request): response_format {"type": "json_object"}
or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (OpenAI's); vLLM's
structured_outputs {json | regex | grammar | choice} and its older guided_json, guided_regex,
guided_grammar, guided_choice; llama-server's json_schema and grammar (GBNF). The answer is generated
under the grammar (specdec.constraints), speculatively and losslessly.
Refused with a 400 naming the field: n outside 1..128, logprobs or top_logprobs out of range, best_of > 1,
a sampling value out of its range (or a logit_bias id outside the vocabulary), two
structured-output fields at once, a
tool_choice naming no given tool, tools where the model's chat template has none (server/tools.py).
Tools: OpenAI's `tools`, `tool_choice` (none, auto, required, a named function) and
`parallel_tool_calls`; assistant messages' `tool_calls` and `role: "tool"` results.
Other unknown fields are ignored, as OpenAI's own server does with fields it does not know.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, Union

from fastapi.responses import JSONResponse
from pydantic import (AliasChoices, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from specdec.config import SAMPLER_ORDER
from specdec.sampling.logprobs import MAX_TOP_LOGPROBS

MAX_STOP_STRINGS = 8
MAX_CHOICES = 128  # n: samples of one prompt in a request (OpenAI's limit)


def _refuse(value, allowed, what: str):
    if value not in allowed:
        raise ValueError(f"{what} is not supported by this server")
    return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=0, description="0: completions with echo only (the prompt scored)")
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 = off (a common extension)")
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, validation_alias=AliasChoices(
        "repetition_penalty", "repeat_penalty"), description="vLLM's (llama-server's repeat_penalty); 1 = off")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="vLLM's and llama-server's; 0 = off")
    repeat_last_n: int | None = Field(None, ge=-1, description="llama-server's: the penalties count the last n "
                                      "tokens of the prompt and answer (-1: all of them; 0: penalties off); "
                                      "unset: repetition over the whole text, presence and frequency over the answer")
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: dict | None = None
    structured_outputs: dict | None = None  # vLLM: {json | regex | grammar | choice}
    guided_json: dict | str | None = None  # vLLM's older names
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    json_schema: dict | None = None  # llama-server's
    grammar: str | None = None  # llama-server's (GBNF)
    # speculation for this request, under llama-server's names: n_max caps a step's draft length (0: plain
    # decoding, the drafter never starts); the policy drafts no minimum and ends chains by its own rule
    speculative_n_max: int | None = Field(None, alias="speculative.n_max", ge=0,
                                          description="a step's draft length at most (a chain's tokens, a "
                                                      "tree's depth; at most the server's --k); 0: plain "
                                                      "decoding for this request")
    speculative_n_min: int = Field(0, alias="speculative.n_min", description="0 only (no minimum)")
    speculative_p_min: float = Field(0.0, alias="speculative.p_min", description="0 only (the server's --draft-p-min "
                                                                                  "applies)")

    @field_validator("response_format", "structured_outputs")
    @classmethod
    def _structure_shape(cls, v, info: ValidationInfo):
        if v is not None and not (info.field_name == "response_format" and v.get("type", "text") == "text"):
            _structure_of(info.field_name, v)  # ValueError naming what is wrong
        return v

    @model_validator(mode="after")
    def _penalties_off(self):
        if self.repeat_last_n == 0:  # llama.cpp's: 0 turns the penalties off
            self.no_penalties()
        return self

    def no_penalties(self) -> None:
        self.repetition_penalty, self.presence_penalty, self.frequency_penalty = 1.0, 0.0, 0.0

    def penalty_last_n(self, context: int) -> int:
        """config.SamplingParams.penalty_last_n of repeat_last_n (-1: the whole context; unset: 0, whole-text counting)."""
        n = self.repeat_last_n or 0
        return context if n < 0 else n

    @model_validator(mode="after")
    def _one_structure(self):
        given = [name for name, value in self._structures() if value is not None]
        if len(given) > 1:
            raise ValueError(f"give one structured-output field, not {len(given)}: {', '.join(given)}")
        return self

    def _structures(self) -> list[tuple[str, Any]]:
        rf = self.response_format
        return [("response_format", None if not rf or rf.get("type", "text") == "text" else rf),
                ("structured_outputs", self.structured_outputs), ("guided_json", self.guided_json),
                ("guided_regex", self.guided_regex), ("guided_grammar", self.guided_grammar),
                ("guided_choice", self.guided_choice), ("json_schema", self.json_schema), ("grammar", self.grammar)]

    def structure(self) -> tuple[str, Any] | None:
        """(kind, value) of the structured output asked (kinds: json_object, json_schema, regex,
        grammar, choice), or None. ValueError on a malformed field."""
        for name, value in self._structures():
            if value is not None:
                return _structure_of(name, value)
        return None

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int) -> int:
        if not 1 <= v <= MAX_CHOICES:
            raise ValueError(f"n (choices) must be 1..{MAX_CHOICES}, got n={v}")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("speculative_n_min", "speculative_p_min")
    @classmethod
    def _no_floor(cls, v, info: ValidationInfo):
        if v != 0:
            name = info.field_name.replace("speculative_", "speculative.")
            raise ValueError(f"{name} is not supported per request: the adaptive policy drafts no minimum and ends "
                             "each chain by its own confidence rule (and the server's --draft-p-min); give 0 or "
                             "leave it out (speculative.n_max caps the draft, 0 turns it off)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        for key, bias in (v or {}).items():
            if not key.strip().isdigit():
                raise ValueError(f"logit_bias keys must be token ids (decimal strings), got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {key}")
        return v

    @property
    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs, in id order."""
        return tuple(sorted((int(k), float(b)) for k, b in (self.logit_bias or {}).items()))

    @property
    def stop_list(self) -> tuple[str, ...]:
        return tuple(self.stop or ())

    @property
    def sampler_order(self) -> tuple[str, ...]:
        """config.SamplingParams.order: vLLM's (the temperature first) on these endpoints."""
        return SAMPLER_ORDER

    @property
    def line_rules(self) -> tuple[int, float]:
        """(n_indent, t_max_predict_ms): llama-server's ends for code completion (server/llama_api.py); off here."""
        return 0, 0.0

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


_STRUCTURED_KEYS = {"json": "json_schema", "regex": "regex", "grammar": "grammar", "choice": "choice"}


def _structure_of(name: str, value) -> tuple[str, Any]:
    if name == "response_format":
        kind = value.get("type")
        if kind == "json_object":
            return "json_object", None
        if kind != "json_schema":
            raise ValueError(f"response_format type {kind!r} is not one of text, json_object, json_schema")
        schema = (value.get("json_schema") or {}).get("schema")
        if schema is None:
            raise ValueError("response_format json_schema needs json_schema.schema")
        return "json_schema", schema
    if name == "structured_outputs":
        keys = [k for k in _STRUCTURED_KEYS if value.get(k) is not None]
        if len(keys) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(_STRUCTURED_KEYS)}")
        return _STRUCTURED_KEYS[keys[0]], value[keys[0]]
    if name.startswith("output_"):  # Anthropic's output_config.format (output_format): {"type": "json_schema", "schema"}
        if value.get("type") != "json_schema" or not isinstance(value.get("schema"), dict):
            raise ValueError("output_format must be {\"type\": \"json_schema\", \"schema\": {...}}")
        return "json_schema", value["schema"]
    return {"guided_json": "json_schema", "guided_regex": "regex", "guided_grammar": "grammar",
            "guided_choice": "choice", "json_schema": "json_schema", "grammar": "grammar"}[name], value


def each_valid(model: type[BaseModel], items: list, what: str) -> list:
    """`items` validated as `model` one by one, so that an error names the item ("{what} i: ...") and not
    the union of text and a list that the field is (pydantic reports the text branch first)."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(model.model_validate(item))
        except ValidationError as e:
            raise ValueError(f"{what} {i}: {str(e.errors()[0]['msg']).removeprefix('Value error, ')}") from None
    return out


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                 description="each token's logprob and this many top alternatives")
    echo: bool = Field(False, description="the answer starts with the prompt (and its logprobs, with logprobs)")
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"one prompt per request is supported, got a batch of {len(v)}")
            v = v[0]
        if len(v) == 0:
            raise ValueError("the prompt is empty; give some text or token ids")
        if isinstance(v, list) and any(t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v

    @model_validator(mode="after")
    def _zero_needs_echo(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 generates nothing: it scores the prompt with echo: true (and logprobs)")
        return self

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v):
        return _refuse(v, (None, 1), "best_of > 1")



class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str | dict = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolCallFunction


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool result's call

    @model_validator(mode="after")
    def _content_given(self):
        if self.content is None and self.role != "assistant":
            raise ValueError(f"messages[].content is null in a {self.role!r} message; give a string or a list of "
                             "text parts (only an assistant message may leave it out)")
        return self

    def plain(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        out = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.role == "tool":
            out |= {k: v for k, v in (("tool_call_id", self.tool_call_id), ("name", self.name)) if v is not None}
        return out


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, choice, info: ValidationInfo):
        names = [t.function.name for t in info.data.get("tools") or []]
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or name not in names:
                raise ValueError(f"tool_choice names no given tool: {name!r} (tools: {', '.join(names) or 'none'})")
        elif choice not in (None, "none", "auto", "required"):
            raise ValueError(f"tool_choice must be none, auto, required or a named function, not {choice!r}")
        elif choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        return choice

    @model_validator(mode="after")
    def _one_constraint(self):
        if self.max_tokens == 0:
            raise ValueError("max_tokens must be >= 1 in a chat completion (to score a prompt: /v1/completions "
                             "with max_tokens 0 and echo)")
        if self.forced_tools() and self.structure() is not None:
            raise ValueError("a required tool call and a structured-output field cannot both constrain the answer")
        return self

    def offered_tools(self) -> list[dict] | None:
        """The tools the template renders (none where tool_choice is 'none')."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def forced_tools(self) -> list[dict] | None:
        """The tools one of which the answer must call (tool_choice 'required' or a named function), or None."""
        offered = self.offered_tools()
        if not offered or self.tool_choice in (None, "auto"):
            return None
        if isinstance(self.tool_choice, dict):
            return [t for t in offered if t["function"]["name"] == self.tool_choice["function"]["name"]]
        return offered

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def top_n(self) -> int | None:
        """The top alternatives per token where logprobs are asked, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None


def as_chat(source: _Sampling, conversation: str, **fields) -> ChatCompletionRequest:
    """The chat request another API's request is (Anthropic's, the Responses API's): its sampling fields
    (all but max_tokens, stop, n and stream_options) and `fields` (the messages, the tools, ...), validated;
    an APIError (400) where they are not one, naming `conversation` for a problem in the messages."""
    body = source.model_dump(include=set(_Sampling.model_fields) - {"max_tokens", "stop", "n", "stream_options"},
                             by_alias=True, exclude_none=True) | fields
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(x) for x in first.get("loc", ())]
        raise APIError(400, str(first.get("msg", "invalid request")).removeprefix("Value error, "),
                       param=conversation if loc[:1] == ["messages"] else loc[0] if loc else None) from None


class TokenizeRequest(BaseModel):
    """llama-server's {"content"} or vLLM's {"prompt"}: the text to encode."""

    model_config = ConfigDict(extra="ignore")
    content: str | None = None
    prompt: str | None = None
    add_special: bool = Field(True, description="add the tokenizer's special tokens (a BOS, where it has one)")
    add_special_tokens: bool | None = Field(None, description="the same, as vLLM names it (wins where given)")
    model: str | None = None

    @model_validator(mode="after")
    def _text_given(self):
        if self.content is None and self.prompt is None:
            raise ValueError("give the text to tokenize as 'content' (or 'prompt')")
        return self

    @property
    def text(self) -> str:
        return self.content if self.content is not None else self.prompt

    @property
    def special(self) -> bool:
        return self.add_special if self.add_special_tokens is None else self.add_special_tokens


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[int]
    model: str | None = None


# ---- responses ----

class SpeculativeUsage(BaseModel):
    drafted: int = 0
    accepted: int = 0
    tau: float = 0.0
    steps: int = 0  # verify steps
    plain_steps: int = 0  # of those, steps that drafted nothing (speculation off for that step)
    drafted_per_position: list[int] = []  # [i]: steps whose draft reached position i + 1
    accepted_per_position: list[int] = []  # [i]: of those, steps whose token there was accepted
    lookup_drafted: int = 0  # of drafted, tokens prompt lookup drafted while the draft model waited to start
    lookup_accepted: int = 0  # of accepted, those
    draft_started_at: int | None = 0  # completion tokens before the drafter started; null: it never did


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens the prefix cache held (not prefilled)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    speculative: SpeculativeUsage = SpeculativeUsage()


class CompletionLogprobs(BaseModel):
    """Per token: its text, its logprob (null for the prompt's first with echo), a {token: logprob} dict
    of the top alternatives and the token itself, and its character offset in the text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None = None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class TokenizerInfo(BaseModel):
    """The tokenizer's special tokens and chat template (vLLM's /tokenizer_info)."""

    eos_token: str | None = None
    bos_token: str | None = None
    pad_token: str | None = None
    chat_template: str | None = None
    max_model_len: int


class DetokenizeResponse(BaseModel):
    content: str
    prompt: str  # the same text, as vLLM names it


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return ErrorResponse(error=ErrorBody(message=message, type=type, param=param, code=code)).model_dump()


def error_response(e: APIError, path: str = "") -> JSONResponse:
    return error_json(path, e.status, error_body(e.message, e.type, e.param, e.code), e.headers)


ANTHROPIC_PATHS = "/v1/messages"  # Anthropic's API (server/anthropic_api.py): its errors in its shape
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         503: "overloaded_error"}


def anthropic_error(status: int, message: str) -> dict:
    """Anthropic's error body: {"type": "error", "error": {"type", "message"}}, its type by the status."""
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_json(path: str, status: int, body: dict, headers: dict | None = None) -> JSONResponse:
    """An error answer (`body` OpenAI's error_body) in the shape of the API that `path` belongs to."""
    if path.startswith(ANTHROPIC_PATHS):
        body = anthropic_error(status, body["error"]["message"])
    return JSONResponse(body, status_code=status, headers=headers)


def sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def collected(next_event, handle) -> list | None:
    """Every event of one answer (server/scheduler.py's Events) up to its 'done', or None where the client
    went away; an answer that failed in the engine is an APIError (500)."""
    events = []
    try:
        while True:
            ev = await next_event()
            if ev is None:
                return None
            events.append(ev)
            if ev.kind == "done":
                break
    except BaseException:
        handle.cancel()
        raise
    if ev.error:
        raise APIError(500, ev.error, type="server_error", code="engine_error")
    return events
