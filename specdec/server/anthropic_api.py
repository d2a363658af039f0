"""Anthropic's Messages API, for the clients written against it (Claude Code with ANTHROPIC_BASE_URL,
the anthropic SDKs): POST /v1/messages and POST /v1/messages/count_tokens.

A request is read into the OpenAI chat request the rest of the server runs (`MessagesRequest.chat`):
- `system` (text, or text blocks) is the first message;
- a user message's text blocks are its text (joined as they come), each tool_result block a `tool`
  message, in the order given; an assistant's text blocks are its text, its tool_use blocks its calls;
  thinking blocks are dropped;
- a last assistant message is a prefill: the answer goes on from its text (and does not repeat it);
- `tools` (custom tools: name, description, input_schema) are function tools, rendered by the model's
  chat template; `tool_choice` auto, any (some tool must be called), tool (that one), none, with
  disable_parallel_tool_use;
- `stop_sequences`, `temperature`, `top_p`, `top_k`, and this server's other sampling fields (min_p,
  the penalties, seed, speculative.n_max); `output_config.format` (or the older `output_format`)
  {"type": "json_schema", "schema"} constrains the answer to the schema (structured output,
  speculatively and losslessly);
- `thinking` (any type) and output_config.effort are accepted and have no effect: answers carry no
  thinking blocks; `metadata` and cache_control are accepted (the prefix cache is always on).
Refused with a 400 naming the field: image and document blocks (this server reads text) and Anthropic's
own tool types (web search, code execution, bash, ...).

Answers: {id, type "message", role, model, content: [a text block, then a tool_use block per call],
stop_reason, stop_sequence, usage}. stop_reason: end_turn, max_tokens, stop_sequence, tool_use, or
pause_turn where the server ended the turn early (its request timeout, or a drain): send the
conversation back to go on. usage: input_tokens (the prompt's tokens the prefix cache did not hold),
cache_read_input_tokens (those it held), cache_creation_input_tokens 0, output_tokens, and
`speculative` (as the other endpoints'). A stream is Anthropic's events: message_start, ping, per
block content_block_start, its deltas (text_delta; a call's input as one input_json_delta) and
content_block_stop, then message_delta (the stop reason and the usage) and message_stop; an error
after the stream began is an `error` event. Errors are Anthropic's shape (protocol.anthropic_error).

Claude Code's system prompt starts with a billing line whose `cch=` stamp changes with every request;
that stamp is read as a constant (as llama-server does), so the prefix cache reaches past it.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Literal

from fastapi.responses import Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from specdec.server.protocol import (APIError, ChatCompletionRequest, TextPart, _Sampling, _structure_of, as_chat,
                                     each_valid)
from specdec.server.tools import ToolStream, ToolSyntax, delivered, whole_answer

BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
BILLING = re.compile(r"^(x-anthropic-billing-header:[^\n]*?\bcch=)[0-9a-zA-Z]+;")


class Block(BaseModel):
    """One content block of a message: text, tool_use (an assistant's call), tool_result (a user's
    answer to one), or thinking (dropped)."""

    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[dict] | None = None
    is_error: bool = False

    @model_validator(mode="after")
    def _known(self):
        if self.type not in BLOCK_TYPES:
            raise ValueError(f"content blocks of type {self.type!r} are not supported by this server (it reads "
                             "text, tool_use and tool_result blocks, and drops thinking)")
        needs = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",)}
        missing = [f for f in needs.get(self.type, ()) if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type} block needs {', '.join(missing)}")
        if self.type == "tool_result" and isinstance(self.content, list):
            kinds = {part.get("type") for part in self.content} - {"text"}
            if kinds:
                raise ValueError(f"tool_result content may hold text blocks only, not {sorted(map(str, kinds))}")
        return self

    def result_text(self) -> str:
        """A tool_result's content as text."""
        if isinstance(self.content, list):
            return "".join(str(part.get("text", "")) for part in self.content)
        return self.content or ""


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _each_block(cls, v):
        return each_valid(Block, v, "block") if isinstance(v, list) else v

    @model_validator(mode="after")
    def _blocks_of_its_role(self):
        kinds = {b.type for b in self.content} if isinstance(self.content, list) else set()
        wrong = kinds & ({"tool_use"} if self.role == "user" else {"tool_result"})
        if wrong:
            raise ValueError(f"a {self.role} message cannot hold {wrong.pop()} blocks")
        return self

    @property
    def blocks(self) -> list[Block]:
        return [Block(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class CustomTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict | None = None
    type: str | None = None

    @model_validator(mode="after")
    def _custom(self):
        if self.type not in (None, "custom"):
            raise ValueError(f"Anthropic's own tool types ({self.type!r}) are not supported by this server; give "
                             "custom tools (name, description, input_schema)")
        if self.input_schema is None:
            raise ValueError(f"tool {self.name!r} needs an input_schema")
        return self

    def function(self) -> dict:
        fn = {"name": self.name, "parameters": self.input_schema}
        return {"type": "function", "function": fn | ({"description": self.description} if self.description else {})}


class MessagesRequest(_Sampling):
    """Anthropic's /v1/messages body (see the module's text)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextPart] | None = None
    stop: list[str] | None = Field(None, validation_alias=AliasChoices("stop_sequences", "stop"))
    tools: list[CustomTool] | None = None
    tool_choice: dict | None = None
    output_config: dict | None = None  # {format: {type: json_schema, schema}, effort}
    output_format: dict | None = None  # the same format, as the API's beta named it
    thinking: dict | None = None
    metadata: dict | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, choice, info):
        names = [t.name for t in info.data.get("tools") or []]
        kind = choice.get("type") if choice else None
        if choice is not None and kind not in ("auto", "any", "tool", "none"):
            raise ValueError(f"tool_choice type must be auto, any, tool or none, not {kind!r}")
        if kind == "tool" and choice.get("name") not in names:
            raise ValueError(f"tool_choice names no given tool: {choice.get('name')!r} "
                             f"(tools: {', '.join(names) or 'none'})")
        if kind == "any" and not names:
            raise ValueError("tool_choice 'any' needs tools")
        return choice

    @field_validator("output_format")
    @classmethod
    def _output_format(cls, v):
        if v is not None:
            _structure_of("output_format", v)  # ValueError naming what is wrong
        return v

    @field_validator("output_config")
    @classmethod
    def _output_config(cls, v):
        if v is not None and v.get("format") is not None:
            _structure_of("output_format", v["format"])
        return v

    def _structures(self):
        return super()._structures() + [("output_format", self.output_format),
                                        ("output_config.format", (self.output_config or {}).get("format"))]

    @property
    def output_schema(self) -> dict | None:
        """The JSON Schema the answer must follow (output_config.format or output_format), or None."""
        given = (self.output_config or {}).get("format") or self.output_format
        return given["schema"] if given else None

    @property
    def prefilled(self) -> bool:
        """Whether the last message is the assistant's answer begun (with some text to go on from)."""
        last = self.messages[-1]
        return last.role == "assistant" and any(b.type == "text" and b.text for b in last.blocks)

    def openai_messages(self) -> list[dict]:
        """The conversation as the OpenAI chat messages the server renders (see the module's text)."""
        out = []
        if self.system is not None:
            text = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system)
            out.append({"role": "system", "content": BILLING.sub(r"\g<1>00000;", text)})
        names: dict[str, str] = {}  # a call's id -> its tool's name
        for m in self.messages:
            if m is self.messages[-1] and m.role == "assistant" and not self.prefilled:
                break  # an empty last assistant message: nothing to go on from
            text, calls = [], []
            for b in m.blocks:
                if b.type == "text":
                    text.append(b.text)
                elif b.type == "tool_use":
                    names[b.id] = b.name
                    calls.append({"id": b.id, "type": "function",
                                  "function": {"name": b.name, "arguments": json.dumps(b.input)}})
                elif b.type == "tool_result":
                    if text:  # the user's words before this result keep their place
                        out.append({"role": "user", "content": "".join(text)})
                        text = []
                    result = {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.result_text()}
                    out.append(result | ({"name": names[b.tool_use_id]} if b.tool_use_id in names else {}))
            if text or calls:
                out.append({"role": m.role, "content": "".join(text)} | ({"tool_calls": calls} if calls else {}))
        return out

    def chat(self) -> ChatCompletionRequest:
        """The OpenAI chat request this one is; an APIError (400) where it cannot be one."""
        last = self.messages[-1]
        if last.role == "assistant" and any(b.type == "tool_use" for b in last.blocks):
            raise APIError(400, "the last message is the assistant's with tool_use blocks: send their "
                                "tool_result blocks in a user message after it", param="messages")
        body = {"messages": self.openai_messages(), "max_tokens": self.max_tokens, "stop": self.stop}
        if self.output_schema is not None:
            body["json_schema"] = self.output_schema
        if self.tools:
            body["tools"] = [t.function() for t in self.tools]
            kind = (self.tool_choice or {}).get("type", "auto")
            body["tool_choice"] = ({"type": "function", "function": {"name": self.tool_choice["name"]}}
                                   if kind == "tool" else {"any": "required"}.get(kind, kind))
            body["parallel_tool_calls"] = not (self.tool_choice or {}).get("disable_parallel_tool_use", False)
        return as_chat(self, "messages", **body)


class CountTokensRequest(MessagesRequest):
    """/v1/messages/count_tokens: a messages body without max_tokens."""

    max_tokens: int = Field(1, ge=1)


def stop_reason(ev, called: bool) -> str:
    """Anthropic's stop reason of an answer that ended with `ev` (server/scheduler.py's 'done' Event)."""
    if ev.finish_reason == "stop":
        return "stop_sequence" if ev.stop_word else "tool_use" if called else "end_turn"
    return "max_tokens" if ev.finish_reason == "length" else "pause_turn"


def usage_of(usage: dict) -> dict:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": usage["prompt_tokens"] - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": usage["completion_tokens"],
            "speculative": usage.get("speculative", {})}


def tool_use(call: dict) -> dict:
    """A call read from the answer (ToolSyntax's OpenAI shape) as a tool_use block; arguments that are
    not a JSON object stand as {"arguments": their text}."""
    text = call["function"]["arguments"]
    try:
        given = json.loads(text)
    except json.JSONDecodeError:
        given = None
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call["function"]["name"],
            "input": given if isinstance(given, dict) else {"arguments": text}}


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class MessagesAnswer:
    """One request's answer in Anthropic's shapes: whole, or its stream of events (Answer's interface)."""

    def __init__(self, model_name: str, prompt_tokens: int, tools: ToolSyntax | None):
        self.model_name, self.prompt_tokens, self.tools = model_name, prompt_tokens, tools
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    def message(self, content: list[dict], reason: str | None, word: str | None, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_name, "content": content,
                "stop_reason": reason, "stop_sequence": word, "usage": usage}

    async def whole(self, next_event, handle):
        read = await whole_answer(next_event, handle, self.tools)
        if read is None:
            return Response(status_code=499)
        ev, content, calls = read
        blocks = ([{"type": "text", "text": content}] if content else []) + [tool_use(c) for c in calls]
        reason = stop_reason(ev, bool(calls))
        return self.message(blocks or [{"type": "text", "text": ""}], reason,
                            ev.stop_word if reason == "stop_sequence" else None, usage_of(ev.usage))

    async def stream(self, next_event, handle):
        finished, index, text_open = False, 0, False
        calls = ToolStream(self.tools) if self.tools else None
        try:
            yield event("message_start", {"type": "message_start", "message": self.message(
                [], None, None, {"input_tokens": self.prompt_tokens, "output_tokens": 0})})
            yield event("ping", {"type": "ping"})
            while True:
                ev = await next_event()
                if ev is None:
                    return
                if ev.error:
                    yield event("error", {"type": "error", "error": {"type": "api_error", "message": ev.error}})
                    break
                pieces, made = delivered(calls, ev.text, ev.kind == "done")
                for text in filter(None, pieces):
                    if not text_open:
                        yield self.block_start(index, {"type": "text", "text": ""})
                        text_open = True
                    yield event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                        "delta": {"type": "text_delta", "text": text}})
                if ev.kind != "done":
                    continue
                if not text_open and not made:  # an empty answer: one empty text block, as the whole one has
                    yield self.block_start(index, {"type": "text", "text": ""})
                    text_open = True
                if text_open:
                    yield self.block_stop(index)
                    index += 1
                for call in map(tool_use, made):
                    yield self.block_start(index, call | {"input": {}})
                    yield event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(call["input"])}})
                    yield self.block_stop(index)
                    index += 1
                reason = stop_reason(ev, bool(made))
                yield event("message_delta", {"type": "message_delta", "delta": {
                    "stop_reason": reason, "stop_sequence": ev.stop_word if reason == "stop_sequence" else None},
                    "usage": usage_of(ev.usage)})
                yield event("message_stop", {"type": "message_stop"})
                break
            finished = True
        finally:
            if not finished:
                handle.cancel()

    @staticmethod
    def block_start(index: int, block: dict) -> str:
        return event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})

    @staticmethod
    def block_stop(index: int) -> str:
        return event("content_block_stop", {"type": "content_block_stop", "index": index})
