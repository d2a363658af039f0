"""OpenAI tools behind the server, with the OpenAI SDK as the client, on the real SmolLM2-135M given a
Hermes-style chat template that renders tools (Qwen2.5's syntax: `<tool_call>` blocks): a required
call is a valid call of a given tool with arguments under its schema, whole and streamed; its result
goes back as a `tool` message and the model answers; `auto` and `none` leave the model free; a model
whose template renders no tools gets a 400."""

from __future__ import annotations

import json

import jsonschema
import pytest

from specdec.server import build_scheduler
from specdec.server.tools import HERMES, LLAMA3, ToolStream, syntax_of
from tests.test_server import client, running, serve_args

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou can call these functions:\n<tools>\n"
    "{%- for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\nTo call one, answer with\n<tool_call>\n"
    '{"name": NAME, "arguments": ARGUMENTS}\n</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{%- for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}'
    "<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(smollm2_path):
    sched = build_scheduler(*serve_args("--model", str(smollm2_path), "--ngram", "--k", "4", "--device", "cpu",
                                       "--max-context", "1024", "--max-batch", "2", "--policy", "fixed"),
                            progress=lambda m: None)
    before = sched.tokenizer.chat_template
    sched.tokenizer.chat_template = TEMPLATE
    with running(sched, "smol") as (base, _):
        yield base
    sched.tokenizer.chat_template = before


def check_call(call, tools=(WEATHER, TIME)) -> dict:
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in schema
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema[call.function.name])
    return args


@pytest.mark.real
def test_required_call_round_trip(served):
    """A required call: valid and under its schema; then its result goes back and the model answers in text."""
    c = client(served)
    out = c.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                    max_tokens=80, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) >= 1
    call = choice.message.tool_calls[0]
    check_call(call)
    follow = ASK + [choice.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    again = c.chat.completions.create(model="smol", messages=follow, tools=[WEATHER, TIME], tool_choice="none",
                                      max_tokens=24, temperature=0)
    assert again.choices[0].message.content and not again.choices[0].message.tool_calls


@pytest.mark.real
def test_named_call_streamed_equals_whole(served):
    c = client(served)
    kw = dict(model="smol", messages=ASK, tools=[WEATHER, TIME], max_tokens=80, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    check_named_call_streamed_equals_whole(c, kw, "get_time")


def check_named_call_streamed_equals_whole(c, kw: dict, name: str) -> None:
    """The request kw (a call of `name` forced) gives that call, valid, whole; streamed, one tool_calls
    delta with the same name and arguments, and finish_reason tool_calls."""
    whole = c.chat.completions.create(**kw).choices[0].message
    assert [t.function.name for t in whole.tool_calls] == [name]
    check_call(whole.tool_calls[0])
    deltas, finish = [], None
    for chunk in c.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            deltas += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(deltas) == 1
    assert deltas[0].function.name == name
    assert deltas[0].function.arguments == whole.tool_calls[0].function.arguments


@pytest.mark.real
def test_auto_leaves_the_model_free_and_a_template_without_tools_is_a_400(served, smollm2_path):
    out = client(served).chat.completions.create(model="smol", messages=[{"role": "user", "content": "Say hi."}],
                                                 tools=[WEATHER], tool_choice="auto", max_tokens=8, temperature=0)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    import httpx
    r = httpx.post(served + "/v1/chat/completions", json={"model": "smol", "messages": ASK, "tools": [WEATHER],
                                                          "tool_choice": {"type": "function",
                                                                          "function": {"name": "nope"}}})
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"]


def test_the_syntax_comes_from_the_template():
    assert syntax_of(TEMPLATE) is HERMES
    assert syntax_of("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert syntax_of('{% if tools %}{"name": ..., "parameters": ...}<|python_tag|>{% endif %}') is LLAMA3


def test_calls_are_read_out_of_the_text_whole_and_streamed():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = HERMES.parse(text)
    assert content == "Let me check." and calls[0]["function"] == {"name": "get_weather",
                                                                  "arguments": '{"city": "Oslo"}'}
    stream, sent = ToolStream(HERMES), ""
    for i in range(0, len(text), 3):  # three characters at a time: the marker arrives in pieces
        sent += stream.feed(text[i:i + 3])
    rest, made = stream.finish()
    assert (sent + rest).strip() == "Let me check." and made[0]["function"]["name"] == "get_weather"
    assert HERMES.parse("no calls <tool_call>not json</tool_call>") == ("no calls <tool_call>not json</tool_call>", [])
    content, calls = LLAMA3.parse('{"name": "get_time", "parameters": {"city": "Rome"}}')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}


# ---- Qwen2.5's own template: its call markers are added tokens ----

@pytest.fixture(scope="module")
def qwen_served():
    from specdec.model.registry import pull
    sched = build_scheduler(*serve_args("--model", str(pull("qwen2.5-coder-0.5b-instruct")), "--ngram", "--k", "4",
                                       "--device", "cpu", "--max-context", "1024", "--max-batch", "1",
                                       "--policy", "fixed"), progress=lambda m: None)
    with running(sched, "qwen") as (base, _):
        yield base, sched


@pytest.mark.real
def test_a_required_call_in_qwens_own_markers(qwen_served):
    """Qwen2.5 writes calls between <tool_call> and </tool_call>, which its tokenizer holds as added tokens:
    a forced call is generated in them and read back, whole and streamed."""
    base, _ = qwen_served
    c = client(base)
    out = c.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                    parallel_tool_calls=False, max_tokens=60, temperature=0)
    assert out.choices[0].finish_reason == "tool_calls", out
    check_call(out.choices[0].message.tool_calls[0])
    kw = dict(model="qwen", messages=ASK, tools=[WEATHER, TIME], max_tokens=60, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    check_named_call_streamed_equals_whole(c, kw, "get_time")


@pytest.mark.real
def test_a_marker_that_is_a_special_token_is_written_by_its_id(qwen_served):
    """llguidance lets such a token through its mask for a quoted literal of its text, then refuses it
    when taken; written by its id, the grammar takes the model's own call tokens."""
    from specdec.constraints import Grammars
    from specdec.errors import SpecdecError
    from specdec.model.tokenizer import text_ids
    _, sched = qwen_served
    tok = sched.tokenizer
    grammars = Grammars.for_tokenizer(tok, sched.engine.target.config.vocab_size, sched.eos_ids)
    vocab = grammars.vocab
    open_id, close_id = text_ids(tok, "<tool_call>"), text_ids(tok, "</tool_call>")
    assert [vocab.term("<tool_call>"), vocab.term("</tool_call>")] == [f"<[{open_id[0]}]>", f"<[{close_id[0]}]>"]
    assert vocab.term("\n") == '"\\n"' and vocab.term("<tool") == '"<tool"'
    call = text_ids(tok, "\n" + json.dumps({"name": "get_time", "arguments": {"city": "Oslo"}}) + "\n")
    tokens = open_id + call + close_id
    by_id = grammars.constraint(HERMES.call_grammar([TIME], False, vocab.term))
    by_id.advance(tokens)
    assert by_id.finished or by_id.matcher.is_accepting()
    quoted = grammars.constraint(HERMES.call_grammar([TIME], False))
    assert bool(quoted.allowed()[open_id[0]])  # the mask lets it through ...
    with pytest.raises(SpecdecError, match="breaks the constraint"):
        quoted.advance(open_id)  # ... and taking it is refused
