"""OpenAI tools through Meta's own Llama 3.1 chat template (the file llama.cpp's source carries,
models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja), on the real SmolLM2-135M behind the server with
the OpenAI SDK as the client: the template's syntax is read as "llama3" (the answer is the call's JSON,
`{"name": ..., "parameters": {...}}`); a required or named call is valid under its schema, whole and
streamed; the call and its result (an `ipython` turn) render back through the template; and a
conversation the template refuses (two calls in one turn) is a 400 that says why."""

from __future__ import annotations

import json

import httpx
import pytest

from specdec.server import build_scheduler
from specdec.server.tools import LLAMA3, syntax_of, template_messages
from tests.test_families import LLAMA_CPP
from tests.test_server import client, running, serve_args
from tests.test_server_tools import ASK, TIME, WEATHER, check_call, check_named_call_streamed_equals_whole

TEMPLATES = LLAMA_CPP / "models" / "templates"
LLAMA31 = TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"
needs_templates = pytest.mark.skipif(not LLAMA31.exists(),
                                     reason=f"llama.cpp's source is absent ({LLAMA31}); run scripts/llama_cpp.sh source")


@pytest.fixture(scope="module")
def llama3_served(smollm2_path):
    if not LLAMA31.exists():
        pytest.skip(f"llama.cpp's source is absent ({LLAMA31})")
    sched = build_scheduler(*serve_args("--model", str(smollm2_path), "--ngram", "--k", "4", "--device", "cpu",
                                       "--max-context", "2048", "--max-batch", "2", "--policy", "fixed"),
                            progress=lambda m: None)
    before = sched.tokenizer.chat_template
    sched.tokenizer.chat_template = LLAMA31.read_text()
    with running(sched, "smol") as (base, _):
        yield base, sched.tokenizer
    sched.tokenizer.chat_template = before


@needs_templates
@pytest.mark.parametrize("name", ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                                  "meta-llama-Llama-3.3-70B-Instruct"])
def test_meta_llama3_templates_speak_llama3(name):
    assert syntax_of((TEMPLATES / f"{name}.jinja").read_text()) is LLAMA3


@pytest.mark.real
def test_required_call_and_its_result_through_the_llama31_template(llama3_served):
    base, tokenizer = llama3_served
    c = client(base)
    out = c.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                    max_tokens=80, temperature=0, logprobs=True)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1  # the template's syntax has one call a turn
    call = choice.message.tool_calls[0]
    args = check_call(call)
    # the answer as generated (its tokens' text) is the call in the template's own form
    raw = json.loads("".join(t.token for t in choice.logprobs.content))
    assert raw == {"name": call.function.name, "parameters": args}
    follow = ASK + [choice.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    # the call goes back in Llama 3's own form, its result as an ipython turn
    text = tokenizer.apply_chat_template(template_messages(follow), tools=[WEATHER, TIME], tokenize=False,
                                         add_generation_prompt=True)
    assert json.dumps({"name": call.function.name, "parameters": args}) in text
    assert "<|start_header_id|>ipython<|end_header_id|>" in text and "temperature" in text
    again = c.chat.completions.create(model="smol", messages=follow, tools=[WEATHER, TIME], tool_choice="none",
                                      max_tokens=24, temperature=0)
    assert again.choices[0].message.content and not again.choices[0].message.tool_calls


@pytest.mark.real
def test_named_call_streamed_equals_whole_llama31(llama3_served):
    base, _ = llama3_served
    c = client(base)
    kw = dict(model="smol", messages=ASK, tools=[WEATHER, TIME], max_tokens=80, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_named_call_streamed_equals_whole(c, kw, "get_time")


@pytest.mark.real
def test_two_calls_in_one_turn_are_a_400_naming_the_templates_reason(llama3_served):
    base, _ = llama3_served
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "get_time", "arguments": json.dumps({"city": c})}}
             for i, c in enumerate(["Rome", "Oslo"])]
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": calls}]
    r = httpx.post(base + "/v1/chat/completions",
                   json={"model": "smol", "messages": messages, "tools": [TIME], "max_tokens": 8})
    assert r.status_code == 400, r.text
    assert "single tool-calls" in r.json()["error"]["message"]
