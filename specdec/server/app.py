"""The FastAPI app: OpenAI-compatible endpoints over a Scheduler; llama-server's own /completion,
/infill and /props (llama_api.py); Anthropic's /v1/messages and its count_tokens (anthropic_api.py);
OpenAI's /v1/responses (responses_api.py);
/tokenize and /detokenize (as llama-server's and vLLM's); plus /health, /metrics and /stats.

Every error body is OpenAI's: {"error": {"message", "type", "param", "code"}} (on Anthropic's paths its
own: {"type": "error", "error": {"type", "message"}}). Validation errors
are 400 and name the field in `param`, the limits on stop strings and messages included. Without the
API key where one is needed: 401; a body over the size cap: 413 (guard.py). A request the queue
cannot take is 429 with Retry-After; a request that arrives while the server shuts down is 503.
Streaming answers are server-sent events (`data: {...}` chunks in OpenAI's format, then
`data: [DONE]`); an error after the stream began is sent as `data: {"error": {...}}` before `[DONE]`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import threading
import time
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec import __version__
from specdec.config import SamplingParams
from specdec.constraints import ConstraintSpec, Grammars
from specdec.errors import SpecdecError
from specdec.model.tokenizer import encode_infill, encode_messages
from specdec.sampling.infill import InfillVocab
from specdec.server.anthropic_api import CountTokensRequest, MessagesAnswer, MessagesRequest
from specdec.server.guard import Access, Guard, RequestLimits
from specdec.server.metrics import CONTENT_TYPE_LATEST
from specdec.server.llama_api import (INFILL_BATCH, InfillRequest, LlamaAnswer, LlamaCompletionRequest, infill_ids,
                                      infill_vocabulary)
from specdec.server.logprobs import CompletionLogprobs, Scored, chat_content
from specdec.server.protocol import (ChatCompletionRequest, ChatCompletionResponse, ChatChoice, ChatLogprobs,
                                     ChatMessageOut, CompletionChoice, CompletionRequest, CompletionResponse,
                                     DetokenizeRequest, DetokenizeResponse, ErrorBody, ErrorResponse,
                                     TokenizeRequest, TokenizeResponse, TokenizerInfo, Usage, new_id, now)
from specdec.server.protocol import APIError, collected, error_body, error_json, error_response, sse
from specdec.server.responses_api import ResponsesAnswer, ResponsesRequest
from specdec.server.scheduler import Event, QueueFull, RequestParams, Scheduler, ShuttingDown
from specdec.server.tools import ToolStream, ToolSyntax, syntax_of, template_messages

log = logging.getLogger("specdec.server")

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
DISCONNECT_POLL_SECONDS = 0.25


TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "literal"}


def _is_type_tag(part: str) -> bool:
    """pydantic puts a union member's type in an error's location (prompt.list[int].0): not a field."""
    return part in TYPE_TAGS or "[" in part or part.startswith("function-")


def _validation_error(exc: RequestValidationError, path: str = "") -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return error_json(path, 400, error_body("the request body is not valid JSON", code="invalid_json"))
    param = ".".join(x for x in loc if not _is_type_tag(x)) or None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "missing":
        msg = "a required field is missing"
    message = f"Invalid value for '{param}': {msg}" if param else msg
    if len(errors) > 1 and param:
        others = sorted({".".join(str(x) for x in e.get("loc", ()) if x != "body") for e in errors[1:]} - {param})
        if others:
            message += f" (also check: {', '.join(others[:4])})"
    return error_json(path, 400, error_body(message, param=param, code="invalid_value"))


class CountRequests:
    """ASGI middleware: counts /v1/ requests by the status code they answered with."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        status = [500]

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(status=str(status[0])).inc()


def create_app(scheduler: Scheduler, model_name: str, access: Access = Access(),
               limits: RequestLimits = RequestLimits()) -> FastAPI:
    """The app around a Scheduler (started with the app, stopped when it shuts down); `access` says
    which paths need the API key, `limits` caps each request."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.scheduler = scheduler
    app.add_middleware(Guard, access=access, max_body_bytes=limits.max_body_bytes)
    app.add_middleware(CountRequests, metrics=scheduler.metrics)  # the outer one: 401s and 413s count too
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    ends = Endpoints(scheduler, model_name, limits)
    app.post("/v1/completions")(ends.completions)
    app.post("/v1/chat/completions")(ends.chat_completions)
    app.post("/completion")(ends.llama_completion)  # llama-server's own (server/llama_api.py)
    app.post("/completions")(ends.llama_completion)
    app.post("/infill")(ends.infill)
    app.post("/v1/messages")(ends.messages)  # Anthropic's (server/anthropic_api.py)
    app.post("/v1/messages/count_tokens")(ends.count_tokens)
    app.post("/v1/responses")(ends.responses)  # OpenAI's Responses API (server/responses_api.py)
    app.get("/props")(ends.props)
    app.get("/v1/models")(ends.models)
    app.post("/tokenize")(ends.tokenize)
    app.post("/detokenize")(ends.detokenize)
    app.get("/tokenizer_info")(ends.tokenizer_info)
    app.get("/health")(ends.health)
    app.get("/stats")(ends.stats)
    app.get("/metrics")(ends.metrics)
    return app


async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _validation_error(exc, request.url.path)


async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return error_response(exc, request.url.path)


async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_json(request.url.path, exc.status_code, error_body(str(exc.detail), kind))


class Endpoints:
    """The routes over one scheduler and model: each request is encoded, submitted, and answered
    whole or as a stream of server-sent events; a client that goes away cancels its request."""

    def __init__(self, scheduler: Scheduler, model_name: str, limits: RequestLimits = RequestLimits()):
        self.scheduler, self.model_name, self.limits = scheduler, model_name, limits
        self.tokenizer = scheduler.tokenizer
        self.vocab_size = scheduler.engine.target.config.vocab_size
        self._grammars: Grammars | None = None  # built at the first structured request (about a second)
        self._infill: InfillVocab | None = None  # built at the first request naming the infill sampler

    async def completions(self, body: CompletionRequest, request: Request):
        self.check_model(body.model)
        self.check_limits(body.stop_list)
        if body.suffix is not None:  # fill in the middle: the prompt is the text before the gap
            if not isinstance(body.prompt, str):
                raise APIError(400, "suffix (fill in the middle) needs the prompt as text, the text before the gap",
                               param="prompt")
            if body.echo:
                raise APIError(400, "echo is not supported with suffix", param="echo")
            try:
                ids = await self.encode(encode_infill, self.tokenizer, body.prompt, body.suffix)
            except SpecdecError as e:
                raise APIError(400, str(e), param="suffix") from None
        else:
            ids = await self.prompt_ids(body.prompt)
        echo = None
        if body.echo:  # the answer starts with the prompt as given (token ids: their text)
            echo = body.prompt if isinstance(body.prompt, str) else await self.encode(self.tokenizer.decode, ids)
        max_tokens = DEFAULT_COMPLETION_TOKENS if body.max_tokens is None else body.max_tokens  # 0: echo alone
        return await self.run(request, body, ids, max_tokens, chat=False, logprobs=body.logprobs, echo=echo,
                              constraints=[await self.constraint_of(body) for _ in range(body.n)])

    async def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A completion prompt's ids: text encoded (its special tokens' strings as those tokens), or ids checked."""
        if isinstance(prompt, str):
            ids = await self.encode(self.tokenizer.encode, prompt)
        else:
            ids = list(prompt)
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise APIError(400, f"Invalid value for 'prompt': token id {bad[0]} is outside the vocabulary "
                                    f"(0..{self.vocab_size - 1})", param="prompt")
        if not ids:
            raise APIError(400, "Invalid value for 'prompt': it encodes to no tokens; give some text", param="prompt")
        return ids

    async def llama_completion(self, body: LlamaCompletionRequest, request: Request):
        """llama-server's /completion, in its shapes (server/llama_api.py)."""
        return await self.llama_run(request, body, await self.prompt_ids(body.prompt))

    async def infill(self, body: InfillRequest, request: Request):
        """llama-server's /infill: the text between input_prefix and input_suffix (server/llama_api.py)."""
        room = self.scheduler.context - INFILL_BATCH - 2 * max(0, body.max_tokens)  # for the extra chunks
        try:
            ids = await self.encode(infill_ids, self.tokenizer, body, room)
        except SpecdecError as e:
            raise APIError(400, str(e), param="input_prefix") from None
        return await self.llama_run(request, body, ids)

    async def llama_run(self, request: Request, body: LlamaCompletionRequest, ids: list[int]):
        if body.model is not None:
            self.check_model(body.model)
        self.check_limits(body.stop_list)
        max_tokens = body.max_tokens if body.max_tokens >= 0 else self.room_left(ids, "prompt")  # -1: the room left
        if "infill" in body.sampler_order:
            await self.infill_sampler()
        answer = LlamaAnswer(self.model_name, body, ids, await self.encode(self.tokenizer.decode, ids))
        return await self.run(request, body, ids, max_tokens, chat=False, logprobs=body.n_probs or None,
                              constraints=[await self.constraint_of(body)], answer=answer)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request):
        self.check_model(body.model)
        self.check_limits(body.stop_list, len(body.messages))
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "Invalid value for 'top_logprobs': it needs 'logprobs': true", param="top_logprobs")
        ids, syntax = await self.chat_prompt(body)
        max_tokens = body.token_budget or self.room_left(ids, "messages")  # OpenAI: unset, the room left
        return await self.run(request, body, ids, max_tokens, chat=True, logprobs=body.top_n, tools=syntax,
                              constraints=[await self.chat_constraint(body, syntax) for _ in range(body.n)])

    async def chat_prompt(self, body: ChatCompletionRequest, continue_final: bool = False):
        """(the conversation's ids through the chat template, with the offered tools; the tool syntax the
        answer's calls are read in, or None); continue_final: the last message is a prefill to go on from."""
        messages = template_messages([m.plain() for m in body.messages])
        tools, syntax = body.offered_tools(), None
        if tools:
            syntax = syntax_of(self.tokenizer.chat_template)
            if syntax is None:
                raise APIError(400, "this model's chat template renders no tools (it has no tool-call syntax); "
                                    "send the request without tools", param="tools")
        try:
            ids = await self.encode(encode_messages, self.tokenizer, messages, tools, continue_final)
        except SpecdecError as e:
            raise APIError(400, str(e).replace("drop --chat to use a plain prompt", "use /v1/completions"),
                           param="messages") from None
        except Exception as e:  # noqa: BLE001 - a template may refuse a conversation (e.g. role order)
            raise APIError(400, f"the chat template rejected the messages: {e}", param="messages") from None
        return ids, syntax

    async def chat_constraint(self, body: ChatCompletionRequest, syntax: ToolSyntax | None):
        """A choice's grammar: a call of the forced tools (tool_choice required or named), else the
        structured-output field's, else None."""
        forced = body.forced_tools()
        if not forced:
            return await self.constraint_of(body)
        vocab = (await asyncio.to_thread(self.grammars)).vocab
        return await self.constraint_of(body, syntax.call_grammar(forced, body.parallel_tool_calls, vocab.term))

    async def messages(self, body: MessagesRequest, request: Request):
        """Anthropic's /v1/messages, in its shapes (server/anthropic_api.py)."""
        self.check_model(body.model)
        chat = body.chat()
        self.check_limits(chat.stop_list, len(chat.messages))
        ids, syntax = await self.chat_prompt(chat, continue_final=body.prefilled)
        return await self.run(request, chat, ids, chat.token_budget, chat=True, tools=syntax,
                              constraints=[await self.chat_constraint(chat, syntax)],
                              answer=MessagesAnswer(self.model_name, len(ids), syntax))

    async def responses(self, body: ResponsesRequest, request: Request):
        """OpenAI's /v1/responses, in its shapes (server/responses_api.py)."""
        self.check_model(body.model)
        chat = body.chat()
        self.check_limits(chat.stop_list, len(chat.messages))
        ids, syntax = await self.chat_prompt(chat)
        return await self.run(request, chat, ids, chat.token_budget or self.room_left(ids, "input"), chat=True,
                              tools=syntax,
                              constraints=[await self.chat_constraint(chat, syntax)],
                              answer=ResponsesAnswer(self.model_name, body, syntax))

    async def count_tokens(self, body: CountTokensRequest):
        """Anthropic's /v1/messages/count_tokens: the prompt's tokens, as /v1/messages would send them."""
        self.check_model(body.model)
        chat = body.chat()
        ids, _ = await self.chat_prompt(chat, continue_final=body.prefilled)
        return {"input_tokens": len(ids)}

    async def constraint_of(self, body, spec: ConstraintSpec | None = None):
        """The grammar state (a fresh specdec.constraints.Constraint) of `spec`, else of the request's
        structured-output field, or None; a 400 on a bad one."""
        structure = (spec.kind, spec.value) if spec is not None else body.structure()
        if structure is None:
            return None

        def compile_it():
            grammars = self.grammars()
            with self.scheduler.tokenizer_lock:
                return grammars.constraint(ConstraintSpec(*structure))
        try:
            return await asyncio.to_thread(compile_it)
        except SpecdecError as e:
            raise APIError(400, str(e), param=structure[0]) from None
        except Exception as e:  # noqa: BLE001 - whatever the grammar engine makes of a hostile constraint
            raise APIError(400, f"the {structure[0]} constraint could not be compiled: {e}", param=structure[0]) from None

    def grammars(self) -> Grammars:
        """The grammar compiler over this model's tokenizer, built at the first structured request."""
        with self.scheduler.tokenizer_lock:
            if self._grammars is None:
                self._grammars = Grammars.for_tokenizer(self.tokenizer, self.vocab_size, self.scheduler.eos_ids)
            return self._grammars

    def infill_vocab(self) -> InfillVocab:
        """llama.cpp's infill sampler's view of this model's vocabulary (the end tokens; each token's text
        as bytes, read through the grammar engine's tokenizer), built at the first request that names it."""
        if self._infill is None:
            self._infill = infill_vocabulary(self.grammars().vocab.tokenizer, self.scheduler.eos_ids,
                                             getattr(self.tokenizer, "eos_token_id", None))
        return self._infill

    async def infill_sampler(self) -> None:
        """The infill sampler's vocabulary built (a 400 where the grammar engine cannot read the tokenizer)."""
        try:
            await asyncio.to_thread(self.infill_vocab)
        except SpecdecError as e:
            raise APIError(400, f"the infill sampler cannot read this model's tokenizer ({e}); leave it out of "
                                "samplers", param="samplers") from None

    async def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        """The text's token ids (with the tokenizer's special tokens unless add_special is false)."""
        if body.model is not None:
            self.check_model(body.model)
        ids = await self.encode(lambda: self.tokenizer.encode(body.text, add_special_tokens=body.special))
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=self.scheduler.context)

    async def tokenizer_info(self) -> TokenizerInfo:
        """The special tokens and the chat template, for a client that tokenizes through this server."""
        tok = self.tokenizer
        named = {name: getattr(tok, name, None) for name in ("eos_token", "bos_token", "pad_token", "chat_template")}
        return TokenizerInfo(**{k: v if isinstance(v, str) else None for k, v in named.items()},
                             max_model_len=self.scheduler.context)

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        """The text of token ids, special tokens included (`prompt`: the same, as vLLM names it)."""
        if body.model is not None:
            self.check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(400, f"Invalid value for 'tokens': token id {bad[0]} is outside the vocabulary "
                                f"(0..{self.vocab_size - 1})", param="tokens")
        try:
            text = await self.encode(self.tokenizer.decode, body.tokens)
        except Exception as e:  # noqa: BLE001 - an id the tokenizer has no text for
            raise APIError(400, f"Invalid value for 'tokens': the tokenizer cannot decode them: {e}",
                           param="tokens") from None
        return DetokenizeResponse(content=text, prompt=text)

    async def props(self):
        """llama-server's /props: the defaults of /completion and /infill, the context, the slots, the template."""
        tok = self.tokenizer
        named = {name: getattr(tok, name, None) for name in ("chat_template", "bos_token", "eos_token")}
        return {"default_generation_settings": {"params": LlamaCompletionRequest().settings(),
                                                "n_ctx": self.scheduler.context},
                "total_slots": self.scheduler.engine.max_batch, "model_alias": self.model_name,
                "model_path": self.model_name, "modalities": {"vision": False, "video": False, "audio": False},
                "build_info": f"specdec {__version__}", "is_sleeping": False, "endpoint_slots": False,
                "endpoint_props": True, "endpoint_metrics": True,
                **{k: v if isinstance(v, str) else "" for k, v in named.items()}}

    async def models(self):
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "specdec", "max_model_len": self.scheduler.context}]}

    async def health(self):
        if not self.scheduler.alive:
            return JSONResponse({"status": "down"}, status_code=503)
        if self.scheduler.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    async def stats(self):
        return self.scheduler.snapshot()

    async def metrics(self):
        return Response(self.scheduler.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def room_left(self, ids: list[int], param: str) -> int:
        """The tokens an answer to `ids` may have where the request sets no limit: as many as the context
        leaves (a 400 naming `param` where that is none)."""
        room = self.scheduler.context - len(ids) - self.scheduler.engine.tree_nodes
        if room < 1:
            raise APIError(400, f"the prompt ({len(ids)} tokens) leaves no room in the context of "
                                f"{self.scheduler.context} tokens", param=param, code="context_length_exceeded")
        return room

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"The model '{name}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found", type="not_found_error")

    def check_limits(self, stops: tuple[str, ...], messages: int = 0) -> None:
        problem = self.limits.violation(stops, messages)
        if problem is not None:
            raise APIError(400, problem[1], param=problem[0], code="limit_exceeded")

    async def encode(self, fn, *args) -> list[int]:
        def run():
            with self.scheduler.tokenizer_lock:
                return fn(*args)
        return await asyncio.to_thread(run)

    def submit(self, ids: list[int], body, max_tokens: int, sink, logprobs: int | None = None, echo: bool = False,
               constraint=None, choice: int = 0):
        """One choice of the request (choice i of n draws from seed + i where a seed is given)."""
        seed = None if body.seed is None else (body.seed + choice) % 2**63
        try:
            order = body.sampler_order
            sampling = SamplingParams(body.temperature, max(0, body.top_k), body.top_p, seed, body.min_p,
                                      body.repetition_penalty, body.presence_penalty, body.frequency_penalty,
                                      body.bias_pairs, body.penalty_last_n(self.scheduler.context), order,
                                      self._infill if "infill" in order else None)
        except SpecdecError as e:
            raise APIError(400, str(e)) from None
        try:
            params = RequestParams(max_tokens, sampling, body.stop_list, logprobs, echo and logprobs is not None,
                                   constraint, body.speculative_n_max, *body.line_rules)
            return self.scheduler.submit(ids, params, sink)
        except QueueFull as e:
            raise APIError(429, str(e), code="queue_full", type="rate_limit_error",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except ShuttingDown as e:
            raise APIError(503, str(e), code="shutting_down", type="server_error") from None
        except SpecdecError as e:
            code = "context_length_exceeded" if "context" in str(e) else None
            param = "max_tokens" if code else "logit_bias" if str(e).startswith("logit_bias") else None
            raise APIError(400, str(e), param=param, code=code) from None

    async def run(self, request: Request, body, ids: list[int], max_tokens: int, chat: bool,
                  logprobs: int | None = None, echo: str | None = None, constraints: list = (None,),
                  tools: ToolSyntax | None = None,
                  answer: LlamaAnswer | MessagesAnswer | ResponsesAnswer | None = None):
        """logprobs: the top alternatives per token where asked; echo: the prompt's text, to start the answer;
        constraints: each choice's grammar (one choice a constraint; None: none); tools: the syntax its tool
        calls are read in, or None; answer: llama-server's, Anthropic's or the Responses API's shapes for the
        one choice (else the chat and completions APIs').
        Choices after the first are submitted with it and wait for its prefill of the prompt, then copy it
        (specdec.engine.Engine.shares_a_prefill)."""
        slots, waiting = self.scheduler.engine.max_batch, self.scheduler.max_queue
        if len(constraints) > slots + waiting:  # never admissible at once: not a 429 to retry
            raise APIError(400, f"n={len(constraints)} choices are more than this server holds at once ({slots} "
                                f"slots and {waiting} waiting: --max-batch, --max-queue)", param="n")
        loop = asyncio.get_running_loop()
        queues: list[asyncio.Queue[Event]] = [asyncio.Queue() for _ in constraints]
        handles = []
        try:
            for i, (events, constraint) in enumerate(zip(queues, constraints)):
                handles.append(self.submit(ids, body, max_tokens,
                                           lambda ev, q=events: loop.call_soon_threadsafe(q.put_nowait, ev),
                                           logprobs, echo is not None, constraint, choice=i))
        except BaseException:
            for handle in handles:
                handle.cancel()
            raise
        rid, created = new_id("chatcmpl" if chat else "cmpl"), now()
        answers = [Answer(self.model_name, rid, created, chat, logprobs is not None, echo, tools, index=i)
                   for i in range(len(handles))]

        def events_of(events: asyncio.Queue, handle):
            async def next_event() -> Event | None:
                """The next event, or None once the client has gone (then the request is cancelled)."""
                while True:
                    try:
                        return await asyncio.wait_for(events.get(), DISCONNECT_POLL_SECONDS)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            handle.cancel()
                            return None
            return next_event

        sources = [events_of(q, h) for q, h in zip(queues, handles)]
        if answer is not None:
            if not body.stream:
                return await answer.whole(sources[0], handles[0])
            return StreamingResponse(answer.stream(sources[0], handles[0]), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        if not body.stream:
            if len(answers) == 1:
                return await answers[0].whole(sources[0], handles[0])
            try:
                outs = await asyncio.gather(*(a.whole(s, h) for a, s, h in zip(answers, sources, handles)))
            finally:
                for handle in handles:  # all of them end together (a failed or abandoned one ends the rest)
                    handle.cancel()
            if any(isinstance(out, Response) for out in outs):  # the client has gone
                return Response(status_code=499)
            first = outs[0]
            first.choices = [out.choices[0] for out in outs]
            first.usage = Usage(**merge_usage([out.usage.model_dump() for out in outs]))
            return first
        if len(answers) == 1:
            stream = answers[0].stream(sources[0], handles[0], body.include_usage)
        else:
            stream = merged(answers, sources, handles, body.include_usage)
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def merge_usage(usages: list[dict]) -> dict:
    """One request's usage over its choices: the prompt once (its cached tokens as the first choice's, the
    one that prefilled it), the completions' tokens and the speculation summed (position by position), tau
    over all steps, the draft's earliest start."""
    completion = sum(u["completion_tokens"] for u in usages)
    spec = [u["speculative"] for u in usages]
    steps = sum(s["steps"] for s in spec)
    started = [s["draft_started_at"] for s in spec if s["draft_started_at"] is not None]  # the earliest start

    def by_position(key: str) -> list[int]:
        return [sum(c) for c in itertools.zip_longest(*(s[key] for s in spec), fillvalue=0)]
    return {"prompt_tokens": usages[0]["prompt_tokens"], "completion_tokens": completion,
            "total_tokens": usages[0]["prompt_tokens"] + completion,
            "prompt_tokens_details": dict(usages[0]["prompt_tokens_details"]),
            "speculative": {"drafted": sum(s["drafted"] for s in spec), "accepted": sum(s["accepted"] for s in spec),
                            "tau": round(sum(s["tau"] * s["steps"] for s in spec) / steps, 4) if steps else 0.0,
                            "steps": steps, "plain_steps": sum(s["plain_steps"] for s in spec),
                            "drafted_per_position": by_position("drafted_per_position"),
                            "accepted_per_position": by_position("accepted_per_position"),
                            "lookup_drafted": sum(s["lookup_drafted"] for s in spec),
                            "lookup_accepted": sum(s["lookup_accepted"] for s in spec),
                            "draft_started_at": min(started, default=None)}}


async def merged(answers: list["Answer"], sources, handles, include_usage: bool):
    """The choices' streams as one, their chunks in the order they come (each names its choice's index),
    then the usage of them all (where asked) and one [DONE]."""
    chunks: asyncio.Queue[str | None] = asyncio.Queue()

    async def pump(answer, source, handle):
        try:
            async for chunk in answer.stream(source, handle, False, last=False):
                await chunks.put(chunk)
        finally:
            await chunks.put(None)

    tasks = [asyncio.create_task(pump(a, s, h)) for a, s, h in zip(answers, sources, handles)]
    try:
        left = len(tasks)
        while left:
            chunk = await chunks.get()
            if chunk is None:
                left -= 1
                continue
            yield chunk
        for task in tasks:
            task.result()  # (an error in one choice's stream ends the request)
        if include_usage and all(a.usage for a in answers):
            yield sse({"id": answers[0].rid, "object": answers[0].object, "created": answers[0].created,
                       "model": answers[0].model_name, "choices": [], "usage": merge_usage([a.usage for a in answers])})
        yield "data: [DONE]\n\n"
    finally:
        for task in tasks:
            task.cancel()
        for handle in handles:
            handle.cancel()


class Answer:
    """One request's answer in OpenAI's shapes: a whole completion, or its stream of chunks; with the
    tokens' logprobs where asked, and the prompt (echo) in front of a completion's text."""

    def __init__(self, model_name: str, rid: str, created: int, chat: bool, logprobs: bool = False,
                 echo: str | None = None, tools: ToolSyntax | None = None, index: int = 0):
        self.model_name, self.rid, self.created, self.chat, self.tools = model_name, rid, created, chat, tools
        self.index = index  # the choice's index in the request (n > 1)
        self.usage: dict | None = None  # the choice's usage once it is done (streams)
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.logprobs, self.echo = logprobs, echo
        self.offsets = CompletionLogprobs(len(echo or ""))  # the answer's tokens start after the prompt's text

    async def whole(self, next_event, handle):
        events = await collected(next_event, handle)
        if events is None:
            return Response(status_code=499)
        ev = events[-1]
        scored: list[Scored] = [s for e in events for s in e.logprobs]
        prompt: list[Scored] = [s for e in events for s in e.prompt_logprobs or []]
        usage, text = Usage(**ev.usage), "".join(e.text for e in events)
        if self.chat:
            logprobs = ChatLogprobs(content=chat_content(scored)) if self.logprobs else None
            content, calls = self.tools.parse(text) if self.tools else (text, [])
            finish = "tool_calls" if calls and ev.finish_reason == "stop" else ev.finish_reason
            message = ChatMessageOut(content=content, tool_calls=calls or None)
            return ChatCompletionResponse(id=self.rid, created=self.created, model=self.model_name, usage=usage,
                                          choices=[ChatChoice(index=self.index, message=message, logprobs=logprobs,
                                                              finish_reason=finish)])
        logprobs = self.completion_logprobs(prompt, scored) if self.logprobs else None
        return CompletionResponse(id=self.rid, created=self.created, model=self.model_name, usage=usage,
                                  choices=[CompletionChoice(index=self.index, text=(self.echo or "") + text,
                                                            logprobs=logprobs, finish_reason=ev.finish_reason)])

    def completion_logprobs(self, prompt: list[Scored], scored: list[Scored]) -> dict:
        """{tokens, token_logprobs, top_logprobs, text_offset} of the prompt's tokens (offsets from 0)
        and then the answer's (offsets going on from the prompt's text)."""
        head, tail = CompletionLogprobs(0).shape(prompt), self.offsets.shape(scored)
        return {key: head[key] + tail[key] for key in tail}

    async def stream(self, next_event, handle, include_usage: bool, last: bool = True):
        """The answer's chunks; last: then the usage chunk (where asked) and [DONE] (not for one choice of several)."""
        finished, first = False, True
        calls = ToolStream(self.tools) if self.tools else None
        try:
            if self.chat:
                yield self.chunk(None, role=True)
            while True:
                ev = await next_event()
                if ev is None:
                    return
                if first and self.echo is not None:  # the prompt, before the answer's first text
                    lp = CompletionLogprobs(0).shape(ev.prompt_logprobs or []) if self.logprobs else None
                    yield self.chunk(self.echo, shaped=lp)
                first = False
                if ev.error:
                    yield sse(error_body(ev.error, "server_error", code="engine_error"))
                    break
                text = calls.feed(ev.text) if calls else ev.text
                if text or (self.logprobs and ev.logprobs):
                    yield self.chunk(text, scored=ev.logprobs)
                if ev.kind == "done":
                    finish = ev.finish_reason
                    if calls:
                        rest, made = calls.finish()
                        if rest:
                            yield self.chunk(rest)
                        if made:
                            yield self.chunk(None, tool_calls=made)
                            finish = "tool_calls" if finish == "stop" else finish
                    yield self.chunk(None, finish=finish)
                    self.usage = ev.usage
                    if include_usage and last:
                        yield sse({"id": self.rid, "object": self.object, "created": self.created,
                                   "model": self.model_name, "choices": [], "usage": ev.usage})
                    break
            if last:
                yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                handle.cancel()  # the client went away (or the server is closing the connection)

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False,
              scored: list[Scored] | None = None, shaped: dict | None = None, tool_calls: list[dict] | None = None) -> str:
        """One chunk; scored: its tokens' logprobs (where asked), or shaped: a completion's, ready;
        tool_calls: the answer's calls, whole, each with its index (OpenAI's delta shape)."""
        asked = self.logprobs and scored is not None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
            if tool_calls:
                delta = {"tool_calls": [{"index": i, **c} for i, c in enumerate(tool_calls)]}
            logprobs = {"content": chat_content(scored), "refusal": None} if asked else None
            choice = {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            logprobs = shaped if shaped is not None else self.offsets.shape(scored) if asked else None
            choice = {"index": self.index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return sse({"id": self.rid, "object": self.object, "created": self.created, "model": self.model_name,
                    "choices": [choice]})


class Server(uvicorn.Server):
    """uvicorn's server with a graceful drain: on SIGTERM/SIGINT the scheduler stops admitting, while
    the server keeps listening, so new requests get 503 and /health says "draining" (a load balancer
    sees it); in-flight requests get `grace` seconds to finish, then end with finish_reason 'abort'.
    Once nothing runs or waits, uvicorn closes the socket and the connections (they have all answered)
    and the app's shutdown stops the scheduler thread. A second SIGINT stops waiting."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler, grace: float = 10.0):
        super().__init__(config)
        self.scheduler = scheduler
        self.grace = grace
        self._draining = False

    def handle_exit(self, sig, frame) -> None:
        # As uvicorn's, but without re-raising the signal after the shutdown: a drained server exits 0.
        if self._draining:  # a second signal
            self.force_exit = self.force_exit or sig == signal.SIGINT
            self.should_exit = True
            return
        self._draining = True
        self.scheduler.drain(self.grace)
        threading.Thread(target=self._exit_when_idle, name="specdec-drain", daemon=True).start()

    def _exit_when_idle(self) -> None:
        deadline = time.monotonic() + self.grace + 5.0  # past the grace the scheduler aborts what still runs
        while time.monotonic() < deadline and not self.should_exit:
            snap = self.scheduler.snapshot()
            if (snap["active"] == 0 and snap["queued"] == 0) or not snap["alive"]:
                break
            time.sleep(0.05)
        self.should_exit = True


def make_server(app: FastAPI, scheduler: Scheduler, host: str = "127.0.0.1", port: int = 8000, grace: float = 10.0,
                log_level: str = "info") -> Server:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=grace + 5.0)
    return Server(config, scheduler, grace)
