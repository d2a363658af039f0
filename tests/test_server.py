"""`specdec serve`: the real server on loopback (uvicorn in a thread), driven by the official openai client
and raw httpx, on the tiny HF-directory models. Greedy output must equal SpeculativeGenerator.generate's."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai
import pytest
import torch

from specdec.flags import add_all_serve_flags, serve_settings
from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.model import load_model
from specdec.model.tokenizer import encode_messages
from specdec.server import build_scheduler
from specdec.server.app import create_app, make_server
from specdec.server.guard import Access, RequestLimits, exposure_warning
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import Scheduler, TextTracker, k_schedule
from tests.conftest import FIM, make_drafter, run_engine

K = 3
CONTEXT = 512
CHAT_TEMPLATE = ("{% for m in messages %}w90 {{ m['content'] }} w91 {% endfor %}"
                 "{% if add_generation_prompt %}w92{% endif %}")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared; the tiny models do not need more
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def chat_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny llama directory plus a chat template (its word-level tokenizer has none)."""
    from transformers import AutoTokenizer
    out = tmp_path_factory.mktemp("tiny-chat") / "model"
    shutil.copytree(tiny_llama_dir, out)
    tok = AutoTokenizer.from_pretrained(str(out))
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    return out


def serve_args(*argv: str) -> tuple:
    """build_scheduler's settings from serve flags: (model, drafting, serve)."""
    p = argparse.ArgumentParser()
    add_all_serve_flags(p)
    return serve_settings(p.parse_args(list(argv)))[:3]


@contextmanager
def running(scheduler: Scheduler, name: str = "tiny", grace: float = 5.0, access: Access = Access(),
            limits: RequestLimits = RequestLimits()):
    """The real server on a free loopback port, in a thread; yields (base_url, uvicorn server)."""
    app = create_app(scheduler, name, access, limits)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(app, scheduler, "127.0.0.1", port, grace=grace, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive()


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)


# ---- the main server: target + a (random, mostly rejected) draft model, 4 slots ----

@pytest.fixture(scope="module")
def main(chat_dir, tiny_qwen_dir):
    sched = build_scheduler(*serve_args("--model", str(chat_dir), "--draft", str(tiny_qwen_dir), "--k", str(K),
                                       "--device", "cpu", "--max-context", str(CONTEXT), "--max-batch", "4",
                                       "--max-queue", "16", "--policy", "fixed"), progress=lambda m: None)
    with running(sched) as (base, server):
        yield base, sched


def reference(sched: Scheduler, ids: list[int], max_tokens: int, temperature: float = 0.0, seed: int | None = None):
    """The engine's own output for the same prompt ids and drafter configuration."""
    engine = Engine.single(sched.engine.target, sched.engine.drafter, CONTEXT)
    return engine.generate(ids, GenerationConfig(max_tokens, K, SamplingParams(temperature, 0, 1.0, seed)),
                           sched.eos_ids)


def text_of(sched: Scheduler, tokens: list[int]) -> str:
    return sched.tokenizer.decode(tokens, skip_special_tokens=True)


def test_models_health_and_stats(main):
    base, sched = main
    assert [m.id for m in client(base).models.list().data] == ["tiny"]
    assert httpx.get(base + "/health").json() == {"status": "ok"}
    stats = httpx.get(base + "/stats").json()
    assert stats["max_batch"] == 4 and stats["context"] == CONTEXT and stats["memory"]["total_bytes"] > 0


def test_completion_greedy_equals_engine(main):
    base, sched = main
    ids = [5, 17, 3, 88, 41]
    ref = reference(sched, ids, 40)
    r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 40,
                                                    "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == text_of(sched, ref.tokens)
    assert body["choices"][0]["finish_reason"] == ref.finish_reason
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (5, len(ref.tokens))
    assert usage["total_tokens"] == 5 + len(ref.tokens)
    spec = usage["speculative"]
    assert (spec["drafted"], spec["accepted"]) == (ref.stats.drafted, ref.stats.accepted) and spec["drafted"] > 0
    assert spec["tau"] == pytest.approx(ref.stats.tau, abs=1e-3)
    assert (spec["drafted_per_position"], spec["accepted_per_position"]) == (ref.stats.drafted_at,
                                                                             ref.stats.accepted_at)
    assert (spec["lookup_drafted"], spec["draft_started_at"]) == (ref.stats.lookup_drafted, ref.stats.draft_started_at)
    assert sum(spec["accepted_per_position"]) == spec["accepted"] and len(spec["drafted_per_position"]) == K


def test_penalties_and_logit_bias_reach_the_engine(main):
    """A request's penalties, bias and min_p give the engine's plain decoding under the same settings,
    greedy token for token (batched with another request), and sampled from the same seed."""
    base, sched = main
    ids = [5, 17, 3, 5, 17, 3, 5]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 30, "presence_penalty": 0.8, "frequency_penalty": 0.4,
            "repeat_penalty": 1.3, "logit_bias": {"9": 3.0, "17": -100}}
    sampling = SamplingParams(0.0, repetition_penalty=1.3, presence_penalty=0.8, frequency_penalty=0.4,
                              logit_bias=((9, 3.0), (17, -100.0)))
    plain = Engine.single(sched.engine.target, NoDrafter(), CONTEXT)
    ref = plain.generate(ids, GenerationConfig(30, K, sampling), sched.eos_ids)
    unpenalised = reference(sched, ids, 30)
    assert ref.tokens != unpenalised.tokens and 17 not in ref.tokens
    with ThreadPoolExecutor(2) as pool:
        other = pool.submit(httpx.post, base + "/v1/completions", json={"model": "tiny", "prompt": [8, 2, 4],
                                                                          "max_tokens": 30, "temperature": 0},
                            timeout=60)
        r = httpx.post(base + "/v1/completions", json=body | {"temperature": 0}, timeout=60)
        assert other.result().status_code == 200
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == text_of(sched, ref.tokens)
    sampled = dataclasses.replace(sampling, temperature=0.9, seed=7, min_p=0.05)
    spec = Engine.single(sched.engine.target, sched.engine.drafter, CONTEXT)  # the same draws as the server's
    ref = spec.generate(ids, GenerationConfig(30, K, sampled), sched.eos_ids)
    r = httpx.post(base + "/v1/completions", json=body | {"temperature": 0.9, "seed": 7, "min_p": 0.05}, timeout=60)
    assert r.json()["choices"][0]["text"] == text_of(sched, ref.tokens)


def test_suffix_fills_the_middle(tiny_fim_dir, main):
    """completions' suffix: the prompt laid out as prefix, suffix, middle through the fill-in-the-middle
    tokens, answered as the engine answers those ids; a model without the tokens, a token-id prompt and
    echo are 400s naming the field."""
    sched = build_scheduler(*serve_args("--model", str(tiny_fim_dir), "--ngram", "--k", str(K), "--device", "cpu",
                                        "--max-context", str(CONTEXT), "--policy", "fixed"), progress=lambda m: None)
    ids = [FIM[0], 5, 17, 3, FIM[1], 9, 5, 17, 3, 40, FIM[2]]
    ref = Engine.single(sched.engine.target, sched.engine.drafter, CONTEXT).generate(
        ids, GenerationConfig(20, K), sched.eos_ids)
    with running(sched) as (base, _):
        out = client(base).completions.create(model="tiny", prompt="w5 w17 w3", suffix="w9 w5 w17 w3 w40",
                                              max_tokens=20, temperature=0)
        assert out.choices[0].text == text_of(sched, ref.tokens)
        assert out.usage.prompt_tokens == len(ids)
    base, _ = main  # a word-level tokenizer without fill-in-the-middle tokens
    for change, param in (({}, "suffix"), ({"prompt": [5, 17]}, "prompt"), ({"echo": True}, "echo")):
        r = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": "w5 w17", "suffix": "w3",
                                                       "max_tokens": 5} | change, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_completion_text_prompt_streaming_matches_non_streaming(main):
    base, sched = main
    c = client(base)
    whole = c.completions.create(model="tiny", prompt="w5 w17 w3 w9", max_tokens=30, temperature=0)
    ref = reference(sched, [5, 17, 3, 9], 30)
    assert whole.choices[0].text == text_of(sched, ref.tokens)
    chunks = list(c.completions.create(model="tiny", prompt="w5 w17 w3 w9", max_tokens=30, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].text) > 1  # it really streamed


def test_chunked_prefill_equals_engine(main):
    """A prompt longer than the 256-token prefill chunk is prefilled over two steps, with the same output."""
    base, sched = main
    ids = [(i * 37) % 90 for i in range(300)]
    ref = reference(sched, ids, 20)
    out = client(base).completions.create(model="tiny", prompt=ids, max_tokens=20, temperature=0)
    assert out.choices[0].text == text_of(sched, ref.tokens)


def test_seed_reproducible_at_temperature_one(main):
    base, sched = main
    c = client(base)
    ids = [7, 8, 9, 10]

    def sampled(seed):
        return c.completions.create(model="tiny", prompt=ids, max_tokens=25, temperature=1.0, seed=seed).choices[0].text

    first, again, other = sampled(1234), sampled(1234), sampled(99)
    assert first == again != other
    assert first == text_of(sched, reference(sched, ids, 25, temperature=1.0, seed=1234).tokens)


def test_stop_strings(main):
    base, sched = main
    c = client(base)
    full = c.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=30, temperature=0).choices[0].text
    words = full.split()
    stop = " " + words[len(words) // 2] + " "
    cut = full[:full.find(stop)]
    out = c.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=30, temperature=0, stop=[stop, "zzz"])
    assert (out.choices[0].text, out.choices[0].finish_reason) == (cut, "stop")
    assert out.usage.completion_tokens < 30
    streamed = c.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=30, temperature=0, stop=stop,
                                    stream=True)
    parts = [(ch.choices[0].text, ch.choices[0].finish_reason) for ch in streamed]
    assert "".join(t for t, _ in parts) == cut and parts[-1][1] == "stop"


def test_chat_non_streaming_and_streaming(main):
    base, sched = main
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w10 w11 w12"}]
    ids = encode_messages(sched.tokenizer, messages)
    ref = reference(sched, ids, 20)
    c = client(base)
    out = c.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == text_of(sched, ref.tokens)
    assert out.usage.prompt_tokens == len(ids)
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=20,
                                            temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == out.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == out.choices[0].finish_reason


BAD = [  # (endpoint, body changes, param named in the error)
    ("completions", {"n": 0}, "n"),
    ("completions", {"n": 21}, "n"),  # more than the server's 4 slots and 16 waiting
    ("completions", {"max_tokens": -1}, "max_tokens"),
    ("completions", {"max_tokens": "many"}, "max_tokens"),
    ("completions", {"temperature": -1}, "temperature"),
    ("completions", {"temperature": "hot"}, "temperature"),
    ("completions", {"top_p": 0}, "top_p"),
    ("completions", {"seed": -5}, "seed"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": []}, "prompt"),
    ("completions", {"prompt": ["w1", "w2"]}, "prompt"),
    ("completions", {"prompt": [1, 2, 500]}, "prompt"),
    ("completions", {"prompt": 12}, "prompt"),
    ("completions", {"stop": [""]}, "stop"),
    ("completions", {"stop": 5}, "stop"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"logprobs": -1}, "logprobs"),
    ("completions", {"echo": "loud"}, "echo"),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("chat/completions", {"frequency_penalty": "lots"}, "frequency_penalty"),
    ("completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {"repeat_penalty": -1}, "repeat_penalty"),
    ("completions", {"min_p": 1.5}, "min_p"),
    ("completions", {"logit_bias": {"w1": 5}}, "logit_bias"),
    ("completions", {"logit_bias": {"3": 101}}, "logit_bias"),
    ("chat/completions", {"logit_bias": {"100000": 1}}, "logit_bias"),  # outside the vocabulary
    ("completions", {"stream": "maybe"}, "stream"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "w1"}]}, "messages.0.role"),
    ("chat/completions", {"messages": [{"role": "user", "content": None}], "max_tokens": None}, "messages.0"),
    ("chat/completions", {"logprobs": "perhaps"}, "logprobs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true, as OpenAI
    ("chat/completions", {"n": 129}, "n"),
    ("chat/completions", {"tools": [{"type": "function"}]}, "tools.0.function"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),  # no tool syntax
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}],
                          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("chat/completions", {"tool_choice": "sometimes"}, "tool_choice"),
    ("chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("completions", {"stop": ["w" * 257]}, "stop"),  # the default limits: 256 characters, 512 messages
    ("chat/completions", {"stop": "w" * 257}, "stop"),
    ("chat/completions", {"messages": [{"role": "user", "content": "w1"}] * 513}, "messages"),
    ("completions", {"speculative.n_max": "many"}, "speculative.n_max"),
    ("chat/completions", {"speculative.n_max": 2.5}, "speculative.n_max"),
    ("chat/completions", {"speculative.p_min": "sure"}, "speculative.p_min"),
]


@pytest.mark.parametrize("endpoint,change,param", BAD, ids=[f"{e}-{p}-{i}" for i, (e, _, p) in enumerate(BAD)])
def test_bad_input_is_400_naming_the_field(main, endpoint, change, param):
    base, _ = main
    body = {"model": "tiny", "max_tokens": 5}
    body |= {"prompt": "w1 w2"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "w1"}]}
    r = httpx.post(f"{base}/v1/{endpoint}", json=body | change, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["type"] == "invalid_request_error" and param.split(".")[0] in err["message"]


def test_other_bad_requests(main):
    base, _ = main
    r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 600})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    for number in ("prompt (3 tokens)", "new_tokens (600)", "max_tokens", "603", "context of 512 tokens"):
        assert number in err["message"], err["message"]
    r = httpx.post(base + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(base + "/v1/completions", json={"model": "gpt-9", "prompt": "w1"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(base + "/v1/completions", json={"prompt": "w1"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert httpx.get(base + "/v1/nothing").json()["error"]["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as exc:
        client(base).completions.create(model="tiny", prompt="w1", max_tokens=4, n=200)
    assert "1..128" in str(exc.value)


def test_n_choices_whole_and_streamed_are_each_what_a_request_alone_gives(main):
    """n > 1: n samples of one prompt, each what a request of its own gives (greedy: the engine's
    output; seeded: choice i as a request with seed + i), the prompt counted once in the usage and
    the completions summed; streamed, each chunk names its choice and the usage comes once, last."""
    base, sched = main
    c = client(base)
    ids = [(7 * i) % 90 + 3 for i in range(50)]
    out = c.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0, n=3)
    want = text_of(sched, reference(sched, ids, 12).tokens)
    assert [ch.index for ch in out.choices] == [0, 1, 2] and all(ch.text == want for ch in out.choices)
    assert out.usage.prompt_tokens == len(ids)
    seeded = c.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=1.0, seed=5, n=3)
    alone = [c.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=1.0, seed=5 + i)
             for i in range(3)]
    assert [ch.text for ch in seeded.choices] == [a.choices[0].text for a in alone]
    assert len({ch.text for ch in seeded.choices}) > 1  # three samples, not one thrice
    assert seeded.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    chunks = list(c.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=1.0, seed=5, n=3,
                                       stream=True, stream_options={"include_usage": True}))
    texts = ["".join(ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].index == i) for i in range(3)]
    assert texts == [ch.text for ch in seeded.choices]
    assert [ch.usage for ch in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].usage.completion_tokens == seeded.usage.completion_tokens and not chunks[-1].choices
    messages = [{"role": "user", "content": "w3 w4 w5"}]
    chat = c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, n=2)
    assert [ch.index for ch in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content
    streamed = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, n=2,
                                              stream=True))
    for i in range(2):
        mine = [ch.choices[0] for ch in streamed if ch.choices[0].index == i]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == chat.choices[i].finish_reason
        assert "".join(m.delta.content or "" for m in mine) == chat.choices[i].message.content


def test_a_requests_usage_over_its_choices_sums_them_position_by_position():
    from specdec.server.app import merge_usage

    def usage(completion, drafted, accepted, steps, plain, at, ok, started):
        return {"prompt_tokens": 9, "completion_tokens": completion, "total_tokens": 9 + completion,
                "prompt_tokens_details": {"cached_tokens": 0},
                "speculative": {"drafted": drafted, "accepted": accepted, "tau": (completion / steps), "steps": steps,
                                "plain_steps": plain, "drafted_per_position": at, "accepted_per_position": ok,
                                "lookup_drafted": drafted - 1, "lookup_accepted": accepted - 1,
                                "draft_started_at": started}}
    merged = merge_usage([usage(12, 7, 5, 4, 1, [3, 3, 1], [3, 2, 0], None), usage(6, 2, 1, 5, 3, [2], [1], 4)])
    assert merged["completion_tokens"] == 18 and merged["total_tokens"] == 27
    spec = merged["speculative"]
    assert (spec["drafted"], spec["accepted"], spec["steps"], spec["plain_steps"]) == (9, 6, 9, 4)
    assert (spec["lookup_drafted"], spec["lookup_accepted"], spec["draft_started_at"]) == (7, 4, 4)
    assert merge_usage([usage(6, 2, 1, 5, 3, [2], [1], None)] * 2)["speculative"]["draft_started_at"] is None
    assert spec["drafted_per_position"] == [5, 3, 1] and spec["accepted_per_position"] == [4, 2, 0]
    assert spec["tau"] == pytest.approx(18 / 9)


def test_concurrent_requests_all_complete_with_engine_outputs(main):
    base, sched = main
    prompts = [[i + 1, (7 * i) % 90, 30 + i, 2 * i + 5] for i in range(6)]
    expected = [text_of(sched, reference(sched, p, 30).tokens) for p in prompts]
    c = client(base)

    def one(p):
        return c.completions.create(model="tiny", prompt=p, max_tokens=30, temperature=0).choices[0].text

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(one, prompts))
    assert got == expected
    assert httpx.get(base + "/stats").json()["active"] == 0


def test_metrics_series(main):
    base, _ = main
    client(base).completions.create(model="tiny", prompt="w3 w4", max_tokens=8, temperature=0)
    text = httpx.get(base + "/metrics").text
    for series in ('specdec_requests_total{status="200"}', 'specdec_requests_total{status="400"}',
                   "specdec_generated_tokens_total", "specdec_queue_depth", "specdec_active_sequences",
                   "specdec_drafted_tokens_total", "specdec_accepted_tokens_total",
                   'specdec_accepted_at_position_total{position="1"}', 'specdec_drafted_at_position_total{position="1"}',
                   "specdec_tau", "specdec_time_per_output_token_seconds_bucket", "specdec_speculation_on 1.0",
                   'specdec_finished_total{reason="length"}', "specdec_draft_k 3.0"):
        assert series in text, series


def test_message_content_is_text(main):
    """A special token's string in a message is text: '</s>' inside a word is part of that word (an
    unknown word here), not the end-of-sequence token; this word-level vocabulary would make the token
    from '</s>' standing alone, so that is refused rather than let through."""
    base, sched = main
    messages = [{"role": "user", "content": "w1</s>w2"}]
    ids = encode_messages(sched.tokenizer, messages)
    assert ids == sched.tokenizer.encode("w90 w1</s>w2 w91 w92", add_special_tokens=False, split_special_tokens=True)
    assert sched.tokenizer.eos_token_id not in ids
    out = client(base).chat.completions.create(model="tiny", messages=messages, max_tokens=2, temperature=0)
    assert out.usage.prompt_tokens == len(ids) == 4
    r = httpx.post(base + "/v1/chat/completions", json={"model": "tiny", "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "w1 </s> w2"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "makes the control token '</s>' from plain text" in r.json()["error"]["message"]


# ---- a server with an API key and small limits ----

@pytest.fixture(scope="module")
def guarded(chat_dir):
    model, drafting, srv = serve_args("--model", str(chat_dir), "--device", "cpu", "--max-context", str(CONTEXT),
                                      "--max-batch", "2", "--api-key", "sekret", "--max-body-bytes", "3000",
                                      "--max-stop-length", "5", "--max-messages", "3")
    sched = build_scheduler(model, drafting, srv, progress=lambda m: None)
    with running(sched, access=srv.access(), limits=srv.limits()) as (base, server):
        yield base, sched


def assert_openai_error(r: httpx.Response, status: int, code: str, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["param"] == param


def test_the_api_key_guards_every_path_but_health(guarded):
    base, _ = guarded
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}
    completion = {"model": "tiny", "prompt": "w1", "max_tokens": 2}
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/completions", completion),
                               ("POST", "/v1/chat/completions", chat), ("GET", "/v1/nothing", None),
                               ("GET", "/openapi.json", None), ("POST", "/tokenize", {"content": "w1 w2"}),
                               ("POST", "/detokenize", {"tokens": [1, 2]}), ("GET", "/tokenizer_info", None)):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sekret"},
                        {"Authorization": "Bearer sekret2"}, {"Authorization": "sekret"}):
            r = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
            assert_openai_error(r, 401, "invalid_api_key")
            assert r.headers["www-authenticate"] == "Bearer"
        r = httpx.request(method, base + path, json=body, headers={"Authorization": "Bearer sekret"}, timeout=60)
        assert r.status_code == (404 if path == "/v1/nothing" else 200), (path, r.text)
    for path in ("/health", "/stats", "/metrics"):  # open without --api-key-protects-stats
        assert httpx.get(base + path).status_code == 200, path
    assert 'specdec_requests_total{status="401"}' in httpx.get(base + "/metrics").text
    out = openai.OpenAI(base_url=base + "/v1", api_key="sekret", max_retries=0, timeout=60).chat.completions.create(
        model="tiny", messages=chat["messages"], max_tokens=2, temperature=0)
    assert out.choices[0].message.content is not None
    with pytest.raises(openai.AuthenticationError):
        client(base).models.list()


def test_stats_and_metrics_need_the_key_with_the_flag(main):
    """Over main's running scheduler in-process (no lifespan: its thread is main's)."""
    base, sched = main
    _, _, srv = serve_args("--api-key", "sekret", "--api-key-protects-stats")
    app = create_app(sched, "tiny", srv.access(), srv.limits())

    async def statuses(headers):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", headers=headers) as c:
            return [(await c.get(p)).status_code for p in ("/health", "/stats", "/metrics", "/v1/models")]

    import asyncio
    assert asyncio.run(statuses({})) == [200, 401, 401, 401]
    assert asyncio.run(statuses({"Authorization": "Bearer sekret"})) == [200, 200, 200, 200]


def test_a_body_over_the_cap_is_413_and_other_limits_are_400s(guarded):
    base, _ = guarded
    key = {"Authorization": "Bearer sekret"}
    big = {"model": "tiny", "prompt": "w1 " * 1200, "max_tokens": 2}
    assert_openai_error(httpx.post(base + "/v1/completions", json=big, headers=key), 413, "request_too_large")
    raw = json.dumps(big).encode()

    def chunks():  # no Content-Length: the cap applies as the body arrives
        for i in range(0, len(raw), 500):
            yield raw[i:i + 500]
    r = httpx.post(base + "/v1/completions", content=chunks(), headers={**key, "content-type": "application/json"})
    assert_openai_error(r, 413, "request_too_large")
    assert httpx.post(base + "/v1/completions", headers=key, timeout=60,
                      json={"model": "tiny", "prompt": "w1 " * 100, "max_tokens": 2}).status_code == 200
    messages = [{"role": "user", "content": "w1"}]
    for body, param in (({"prompt": "w1", "stop": ["w1 w2"]}, None), ({"prompt": "w1", "stop": "w1 w23"}, "stop"),
                        ({"messages": messages * 3, "stop": ["w3", "w1 w2"]}, None),
                        ({"messages": messages * 4}, "messages"),
                        ({"messages": messages, "stop": ["w3", "w1 w23"]}, "stop")):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        r = httpx.post(base + path, json={"model": "tiny", "max_tokens": 2, **body}, headers=key, timeout=60)
        if param is None:
            assert r.status_code == 200, r.text
        else:
            assert_openai_error(r, 400, "limit_exceeded", param)
            assert param in r.json()["error"]["message"]


def test_a_server_beyond_loopback_without_a_key_warns(capsys, monkeypatch):
    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    assert exposure_warning("127.0.0.1", Access()) is None and exposure_warning("::1", Access()) is None
    assert exposure_warning("localhost", Access()) is None and exposure_warning("0.0.0.0", Access("k")) is None
    for host in ("0.0.0.0", "::", "192.168.1.7", "example.org"):
        assert host in exposure_warning(host, Access()) and "--api-key" in exposure_warning(host, Access())
    from specdec.cli import main as cli_main
    assert cli_main(["serve", "--host", "0.0.0.0", "--model", "/nonexistent/model"]) != 0
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("specdec: warning: serving on 0.0.0.0 with no API key")
    assert cli_main(["serve", "--model", "/nonexistent/model"]) != 0
    assert "warning" not in capsys.readouterr().err


# ---- a slow server: 2 slots, a queue of 1, speculation off above 1 active sequence ----

class SlowEngine(Engine):
    """Each step sleeps (so requests overlap reliably); a prompt starting with token 93 fails in decode.
    The slow server has no end-of-sequence ids, so every request runs to its max_tokens."""

    delay = 0.01

    def step(self):
        time.sleep(self.delay)
        return super().step()


class FailingDrafter(DraftModelDrafter):
    """Fails in every step of a sequence whose prompt starts with 93 (observe: drafting or plain)."""

    def start(self, prompt):
        self.failing = prompt[0] == 93
        super().start(prompt)

    def observe(self, num_accepted):
        if self.failing:
            raise RuntimeError("injected failure")
        super().observe(num_accepted)


def slow_scheduler(target, max_batch=2, max_queue=1) -> Scheduler:
    factory = lambda: FailingDrafter(target.module, target.module.config.vocab_size, CONTEXT)  # noqa: E731
    stepper = SlowEngine(target.module, factory, CONTEXT, max_batch)
    return Scheduler(stepper, target.tokenizer, set(), k=K, max_queue=max_queue,  # no EOS: runs to max_tokens
                     k_for_batch=k_schedule(spec_off_batch=1), metrics=ServerMetrics())


@pytest.fixture(scope="module")
def tiny_target_loaded(tiny_llama_dir):
    return load_model(str(tiny_llama_dir), device="cpu")


@pytest.fixture(scope="module")
def slow(tiny_target_loaded):
    sched = slow_scheduler(tiny_target_loaded)
    with running(sched) as (base, server):
        yield base, sched


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_queue_full_is_429_and_speculation_switches_off_under_load(slow, tiny_target_loaded):
    base, sched = slow
    prompts = [[1 + i, 2, 3, 4 + i] for i in range(6)]
    results, seen_off = {}, []

    def post(i):
        results[i] = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": prompts[i],
                                                                "max_tokens": 60, "temperature": 0}, timeout=60)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    assert wait_for(lambda: (s := httpx.get(base + "/stats").json())["active"] == 2
                    and s["speculation_on"] is False and seen_off.append(httpx.get(base + "/metrics").text) is None)
    for t in threads:
        t.join(60)
    assert "specdec_speculation_on 0.0" in seen_off[0]
    codes = sorted(r.status_code for r in results.values())
    assert codes == [200, 200, 200, 429, 429, 429], codes  # 2 slots + 1 queued; the rest refused at once
    for i, r in results.items():
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["code"] == "queue_full"
        else:  # speculation went off and on again between steps; greedy output is still the engine's
            plain = Engine.single(tiny_target_loaded.module,
                                         DraftModelDrafter(tiny_target_loaded.module, 96, CONTEXT), CONTEXT)
            ref = plain.generate(prompts[i], GenerationConfig(60, K))
            assert r.json()["choices"][0]["text"] == text_of(sched, ref.tokens)
    assert wait_for(lambda: httpx.get(base + "/stats").json()["speculation_on"] is True
                    or httpx.get(base + "/stats").json()["active"] == 0)


def test_mid_stream_disconnect_frees_the_slot(slow):
    base, sched = slow
    before = sched.metrics.finished.labels(reason="cancelled")._value.get()
    with httpx.stream("POST", base + "/v1/completions", json={"model": "tiny", "prompt": "w1 w2", "max_tokens": 400,
                                                              "temperature": 0, "stream": True}, timeout=30) as r:
        got = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                got.append(line)
            if len(got) == 3:
                break
    assert len(got) == 3  # and now the client is gone, 400 tokens (4+ s) before the end
    assert wait_for(lambda: httpx.get(base + "/stats").json()["active"] == 0, timeout=3.0)
    assert sched.metrics.finished.labels(reason="cancelled")._value.get() == before + 1


def test_request_timeout(slow):
    base, sched = slow
    sched.request_timeout = 0.3
    try:
        out = client(base).completions.create(model="tiny", prompt="w1 w2", max_tokens=400, temperature=0)
    finally:
        sched.request_timeout = None
    assert out.choices[0].finish_reason == "timeout" and 0 < out.usage.completion_tokens < 400
    assert wait_for(lambda: httpx.get(base + "/stats").json()["active"] == 0)


def test_step_exception_fails_only_that_request(slow):
    base, sched = slow
    c = client(base)
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(httpx.post, base + "/v1/completions",
                          json={"model": "tiny", "prompt": [93, 1, 2], "max_tokens": 10}, timeout=30)
        good = pool.submit(c.completions.create, model="tiny", prompt=[4, 1, 2], max_tokens=10, temperature=0)
        bad, good = bad.result(), good.result()
    assert bad.status_code == 500
    assert "injected failure" in bad.json()["error"]["message"] and bad.json()["error"]["type"] == "server_error"
    assert good.usage.completion_tokens == 10
    with pytest.raises(openai.APIError, match="injected failure"):
        list(c.completions.create(model="tiny", prompt=[93, 5], max_tokens=10, stream=True))
    assert sched.alive and httpx.get(base + "/health").status_code == 200
    assert wait_for(lambda: httpx.get(base + "/stats").json()["active"] == 0)


def test_graceful_shutdown_ends_streams_with_abort(tiny_target_loaded):
    sched = slow_scheduler(tiny_target_loaded, max_batch=1, max_queue=2)
    with running(sched, grace=0.3) as (base, server):
        events = []
        with httpx.stream("POST", base + "/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": "w1", "max_tokens": 400, "stream": True}) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 2:
                    server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler does
                    assert sched.draining
                    # still listening while it drains: new requests get 503, /health says so
                    late = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "w1"}, timeout=10)
                    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
                    assert httpx.get(base + "/health", timeout=10).json() == {"status": "draining"}
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    assert not sched.alive
    with pytest.raises(httpx.TransportError):  # the listening socket is closed
        httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "w1"}, timeout=2)


# ---- units ----

def test_text_tracker_holds_back_stop_prefixes(tiny_target_loaded):
    tok = tiny_target_loaded.tokenizer
    tr = TextTracker(tok, ("w3 w4",))
    assert tr.add([1, 2]) == ("w1 w2", None)
    assert tr.add([3]) == (" ", None)  # "w3" may begin the stop string: held back
    assert tr.add([5]) == ("w3 w5", None)
    assert tr.add([3, 4, 6]) == (" ", "stop")  # cut before the stop string
    assert tr.text == "w1 w2 w3 w5 " and tr.flush() == "" and tr.word == "w3 w4"


def test_k_schedule():
    limit = k_schedule(spec_off_batch=6, schedule={1: 4, 3: 2, 5: 0})
    assert [limit(b) for b in (1, 2, 3, 4, 5, 7)] == [4, 4, 2, 2, 0, 0]
    assert k_schedule(schedule={2: 1})(1) is None and k_schedule()(100) is None


def test_startup_checks(tiny_llama_dir):
    with pytest.raises(SpecdecError, match=r"GiB.*lower --max-batch"):
        build_scheduler(*serve_args("--model", str(tiny_llama_dir), "--device", "cpu", "--memory-budget-gb", "1e-6"),
                        progress=lambda m: None)
    with pytest.raises(SpecdecError, match="schedule"):
        build_scheduler(*serve_args("--model", str(tiny_llama_dir), "--k-schedule", "1-4"), progress=lambda m: None)
    with pytest.raises(SpecdecError, match="--max-batch"):
        build_scheduler(*serve_args("--model", str(tiny_llama_dir), "--max-batch", "0"), progress=lambda m: None)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-sequence"])
@pytest.mark.parametrize("method", ["none", "ngram", "suffix", "lookahead", "draft", "tree", "hybrid", "layer-skip"])
def test_stepper_interleaved_equals_engine(tiny_target_loaded, tiny_qwen_dir, method, batched):
    """Sequences joining and leaving a 3-slot pool, prefilled 4 tokens per step, with the draft length
    limit changing every round (none, 0, 1): each gets exactly the engine's greedy tokens."""
    target = tiny_target_loaded
    draft = load_model(str(tiny_qwen_dir), device="cpu") if method in ("draft", "tree", "hybrid") else None
    tree = TreeConfig(8, 3, 2) if method == "tree" else None

    def factory():
        return make_drafter("draft" if method == "tree" else method, target, CONTEXT, draft, tree=tree, layers=1)

    stepper = assert_stepper_matches_engine(target, factory, STEPPER_PROMPTS, batched)
    assert sorted(stepper.pool.free) == [0, 1, 2]


STEPPER_PROMPTS = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 50)), [7], [9, 9, 9, 9, 9, 9, 9]]


def test_layer_skip_slots_draft_into_their_rows_of_the_target_cache_and_verify_from_layer_l(
        tiny_target_loaded, tiny_llama_dir, monkeypatch):
    """serve --layer-skip L: each slot's drafter writes layers 0..L-1 into its own row of the target's
    batched cache, and its verify starts at layer L there (the output is the engine's)."""
    import specdec.drafters.layer_skip as layer_skip
    target, first_layers = tiny_target_loaded, []
    forward_from_layer = layer_skip.forward_from_layer
    monkeypatch.setattr(layer_skip, "forward_from_layer",
                        lambda *a, **kw: first_layers.append(a[4]) or forward_from_layer(*a, **kw))
    stepper = assert_stepper_matches_engine(target, lambda: make_drafter("layer-skip", target, CONTEXT, layers=1),
                                            STEPPER_PROMPTS, batched=True)
    assert all(d.shared is row and d.cache is None for d, row in zip(stepper.pool.drafters, stepper.pool.rows))
    assert first_layers and set(first_layers) == {1}
    sched = build_scheduler(*serve_args("--model", str(tiny_llama_dir), "--layer-skip", "1", "--policy", "fixed",
                                        "--max-batch", "2"), progress=lambda m: None)
    assert [d.shared for d in sched.engine.pool.drafters] == sched.engine.pool.rows


def assert_stepper_matches_engine(target, factory, prompts, batched):
    """A 3-slot pool prefilling 4 tokens per step gives each prompt the engine's greedy tokens."""
    cfg = GenerationConfig(24, K)
    expected = [Engine.single(target.module, factory(), CONTEXT).generate(p, cfg, target.eos_ids).tokens
                for p in prompts]
    stepper = Engine(target.module, factory, CONTEXT, max_batch=3, prefill_chunk=4, batched=batched)
    got = run_engine(stepper, prompts, cfg, target.eos_ids)
    assert [got[i] for i in range(len(prompts))] == expected
    return stepper


def test_sigterm_drains_and_exits_cleanly(tiny_llama_dir):
    """The real signal path: `specdec serve` in a child process, SIGTERM, exit status 0 and no traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys\nfrom specdec.cli import main\nsys.exit(main(['serve', *sys.argv[1:]]))\n"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", code, "--model", str(tiny_llama_dir), "--device", "cpu",
                             "--ngram", "--max-context", "256", "--port", str(port), "--shutdown-grace", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        base = f"http://127.0.0.1:{port}"

        def up():
            try:
                return httpx.get(base + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return proc.poll() is None and False

        assert wait_for(up, timeout=90), proc.stderr.read() if proc.poll() is not None else "no answer"
        out = client(base).completions.create(model=str(tiny_llama_dir), prompt="w1 w2", max_tokens=5,
                                              temperature=0)
        assert out.usage.prompt_tokens == 2
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err


def test_batched_round_verifies_every_chain_in_one_forward(tiny_target_loaded):
    """3 decoding sequences with n-gram chains: one target forward per round, ragged over 3 rows."""
    target = tiny_target_loaded
    factory = lambda: make_drafter("ngram", target, CONTEXT)  # noqa: E731
    stepper = Engine(target.module, factory, CONTEXT, max_batch=3, prefill_chunk=64)
    for p in ([1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5], list(range(30, 50))):
        stepper.add_request(p, GenerationConfig(12, K), set())
    stepper.step()  # prefills
    calls = []
    original = target.module.forward

    def counting(tokens, *args, **kwargs):
        calls.append(tuple(tokens.shape))
        return original(tokens, *args, **kwargs)

    target.module.forward = counting
    try:
        stepper.step()
    finally:
        del target.module.forward
    assert len(calls) == 1 and calls[0][0] == 3


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_round_drafts_every_chain_together(tiny_target_loaded, tiny_qwen_dir, temperature):
    """3 sequences with a draft model: each round's drafts take k draft forwards over all rows (one
    per position, ragged first catch-up), not 3 k; each row's cache keeps its own tokens, so the
    output is still exact (greedy: the engine's tokens; sampled: valid, seeded runs repeat)."""
    target = tiny_target_loaded
    draft = load_model(str(tiny_qwen_dir), device="cpu")
    factory = lambda: make_drafter("draft", target, CONTEXT, draft)  # noqa: E731
    prompts = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 50))]
    cfg = GenerationConfig(16, K, SamplingParams(temperature=temperature, seed=3))

    def run(count_rounds: int = 0):
        stepper = Engine(target.module, factory, CONTEXT, max_batch=3, prefill_chunk=64)
        seqs = [stepper.add_request(p, cfg, set()) for p in prompts]
        stepper.step()  # prefills (and the draft model's own)
        calls, original = [], draft.module.forward

        def counting(tokens, *args, **kwargs):
            calls.append(tuple(tokens.shape))
            return original(tokens, *args, **kwargs)
        draft.module.forward = counting
        try:
            for _ in range(count_rounds):
                stepper.step()
        finally:
            del draft.module.forward
        while stepper.has_work:
            for seq in stepper.step():
                stepper.abort(seq)
        return [s.new_tokens for s in seqs], calls

    tokens, calls = run(count_rounds=1)
    assert len(calls) == K and all(shape[0] == 3 for shape in calls)  # one forward per draft position, 3 rows
    assert tokens == run()[0]  # seeded: the same tokens again
    if temperature == 0:
        assert tokens == [Engine.single(target.module, factory(), CONTEXT).generate(p, cfg).tokens
                          for p in prompts]


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_a_request_of_k_0_decodes_plain_beside_drafting_ones(tiny_target_loaded, tiny_qwen_dir, method):
    """A request asking for no speculation (k 0: a request's `speculative.n_max` 0) runs plain steps in
    rounds whose other rows draft: its drafter never starts (no draft prefill, no lookup), it drafts
    nothing, and every row's greedy output is plain decoding's."""
    target = tiny_target_loaded
    draft = load_model(str(tiny_qwen_dir), device="cpu") if method == "draft" else None
    started = []

    def factory():
        d = make_drafter(method, target, CONTEXT, draft)
        for name in ("start", "start_lookup_only"):
            original = getattr(d, name)
            setattr(d, name, lambda *a, _o=original, _d=d: (started.append(_d), _o(*a))[1])
        return d
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 4], [7, 8, 9, 7, 8, 9, 7]]
    stepper = Engine(target.module, factory, CONTEXT, max_batch=3, prefill_chunk=64)
    seqs = [stepper.add_request(p, GenerationConfig(16, k), set()) for p, k in zip(prompts, (K, 0, K))]
    while stepper.has_work:
        for seq in stepper.step():
            assert seq.finish_reason in ("stop", "length"), seq.error
    off = seqs[1]
    assert off.drafter not in started and off.stats.draft_started_at is None
    assert off.stats.drafted == 0 and off.stats.k_chosen[0] == off.stats.steps > 0
    assert all(s.drafter in started and s.stats.drafted > 0 for s in (seqs[0], seqs[2]))
    plain = [Engine.single(target.module, make_drafter("none", target, CONTEXT), CONTEXT).generate(
        p, GenerationConfig(16, K)).tokens for p in prompts]
    assert [s.new_tokens for s in seqs] == plain


def test_a_requests_speculative_n_max_caps_its_drafts_and_0_turns_them_off(main):
    """llama-server's `speculative.n_max` per request: 0 decodes plain (nothing drafted, every step plain),
    1 drafts at most one token a step, and the greedy text is the same either way; `n_min` or `p_min`
    other than 0 and a negative `n_max` are 400s naming the field."""
    base, sched = main
    ids = [5, 17, 3, 88, 41]
    texts = []
    for n_max in (0, 1, None):
        extra = {} if n_max is None else {"speculative.n_max": n_max}
        r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 24,
                                                        "temperature": 0} | extra, timeout=60)
        assert r.status_code == 200, r.text
        spec, texts = r.json()["usage"]["speculative"], texts + [r.json()["choices"][0]["text"]]
        if n_max == 0:
            assert spec["drafted"] == 0 and spec["plain_steps"] == spec["steps"] > 0
        elif n_max == 1:
            assert 0 < spec["drafted"] <= spec["steps"]
        else:
            assert spec["drafted"] > spec["steps"]  # the server's --k 3, fixed
    assert texts[0] == texts[1] == texts[2] == text_of(sched, reference(sched, ids, 24).tokens)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "w1"}], "max_tokens": 4}
    for field, value in (("speculative.n_min", 2), ("speculative.p_min", 0.5), ("speculative.n_max", -1)):
        r = httpx.post(base + "/v1/chat/completions", json=body | {field: value}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = httpx.post(base + "/v1/chat/completions", json=body | {"speculative.n_min": 0, "speculative.p_min": 0.0},
                   timeout=30)
    assert r.status_code == 200, r.text


def test_batched_policy_sees_the_round_batch_size(tiny_target_loaded):
    """Verifying 5 positions costs one step, more costs n steps: alone a sequence drafts 4 tokens;
    three decoding together draft nothing (3 plain rows beat any 6+ row verify)."""
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
    target = tiny_target_loaded
    costs = CostModel({1: 1.0, 5: 1.0, 6: 6.0, 100: 100.0})
    factory = lambda: make_drafter("ngram", target, CONTEXT)  # noqa: E731
    stepper = Engine(target.module, factory, CONTEXT, max_batch=3, prefill_chunk=64,
                                policy_factory=lambda: AdaptivePolicy(costs, PolicyConfig(k_max=4)))
    alone = stepper.add_request([1, 2, 3, 1, 2, 3, 1, 2], GenerationConfig(12, 4), set())
    stepper.step()  # prefill
    stepper.step()
    assert alone.stats.k_chosen[-1] == 1 and len(alone.stats.k_chosen) == 5  # k = 4
    others = [stepper.add_request(p, GenerationConfig(12, 4), set()) for p in ([4, 5, 4, 5, 4, 5], [7, 8, 9, 7, 8])]
    stepper.step()  # the newcomers prefill; the first sequence decodes alone once more
    stepper.step()  # three decode together
    assert stepper.decode_batch == 3
    for seq in [alone] + others:
        assert seq.stats.k_chosen[0] >= 1  # the shared round was plain for everyone
        # and its plain row reported the target's confidence to the sequence's policy (observe_target)
        assert seq.policy.request_shadow_trials >= 1


def test_a_rented_draft_prefill_is_bought_mid_answer_in_the_server(tiny_target_loaded, tiny_qwen_dir):
    """The server rents as the engine does: a draft prefill that would pay back, but not four times
    over, waits; the sequence decodes plain, the policy is asked each round, and the draft model
    starts mid-answer (prefilling prompt and answer so far). Greedy output stays the engine's."""
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
    target = tiny_target_loaded
    draft = load_model(str(tiny_qwen_dir), device="cpu")
    prompt, cfg = list(range(30, 59)), GenerationConfig(20, 6)  # 29 prompt tokens
    starts = []

    class Counting(DraftModelDrafter):
        def start(self, tokens):
            starts.append(len(tokens))
            super().start(tokens)

    def policy():
        p = AdaptivePolicy(CostModel({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.3}, 0.1, prefill_cost=1.0),
                           PolicyConfig(k_max=6, prior=0.9, target_signal=False))  # the rule alone
        p.reset()
        p.costs.prefill_cost = 6 * p._prefill_terms(29, 20, 1)[1] / 29  # the prompt's prefill: 6 tokens' saving
        return p

    factory = lambda: Counting(draft.module, target.module.config.vocab_size, CONTEXT)  # noqa: E731
    stepper = Engine(target.module, factory, CONTEXT, max_batch=2, prefill_chunk=64, policy_factory=policy)
    seq = stepper.add_request(prompt, cfg, set())
    while seq.finish_reason is None:
        stepper.step()
    plain = Engine.single(target.module, make_drafter("none", target, CONTEXT), CONTEXT).generate(prompt, cfg)
    assert seq.new_tokens == plain.tokens
    started = seq.stats.draft_started_at
    assert started is not None and 0 < started < 20 and starts == [29 + started]  # prompt + answer so far
    assert seq.stats.drafted > 0


def test_a_probe_in_a_full_round_is_capped(tiny_target_loaded):
    """Four plain rows and one probing row: the round stays one token wide (no padded rows)."""
    from specdec.policy import AdaptivePolicy, Ask, CostModel, PolicyConfig
    target = tiny_target_loaded
    # 10 positions cost one step, more cost in proportion: a good drafter could pay in a round of
    # 5 (so a probe is allowed), but 5 rows x 3 positions cost 1.5 steps for one row's guess
    costs = CostModel({1: 1.0, 10: 1.0, 100: 10.0})
    factory = lambda: make_drafter("ngram", target, CONTEXT)  # noqa: E731
    stepper = Engine(target.module, factory, CONTEXT, max_batch=5, prefill_chunk=64,
                                policy_factory=lambda: AdaptivePolicy(costs, PolicyConfig(k_max=4, prior=0.0, probe_k=2)))
    seqs = [stepper.add_request([1, 2, 3, 1, 2, 3, 1 + i], GenerationConfig(12, 4), set()) for i in range(5)]
    stepper.step()  # prefills
    seqs[0].policy.plain_run = 100  # this one is due for a probe
    assert seqs[0].policy.plan(Ask(4, batch=5)).k == 2
    stepper.step()
    assert stepper.round_width == 1 and all(s.stats.k_chosen[0] >= 1 for s in seqs)


def test_prefix_cache_reuses_a_conversations_turns_and_output_is_unchanged(tiny_target_loaded):
    """The second turn of a conversation lands on the slot that holds the first (prompt + answer):
    only the new part is prefilled, and greedy output equals a whole prefill's, for every drafter
    that keeps state per slot (a draft model's cache, n-gram lookup)."""
    target = tiny_target_loaded
    for method in ("none", "ngram", "draft"):
        factory = lambda m=method: make_drafter(m, target, CONTEXT, target)  # noqa: E731
        cfg = GenerationConfig(12, 3)
        turn1 = list(range(40, 60))
        outputs = {}
        for cached in (True, False):
            stepper = Engine(target.module, factory, CONTEXT, max_batch=2, prefill_chunk=8,
                                        prefix_cache=cached)
            first = run_engine(stepper, [turn1, [5, 6, 7, 8]], cfg, set())
            turn2 = turn1 + first[0] + [9, 10, 11]
            seq = stepper.add_request(turn2, cfg, set(), tag=0)
            while seq.finish_reason is None:
                stepper.step()
            outputs[cached] = (first, seq.new_tokens, seq.stats.cached_tokens)
        (first_c, second_c, hit), (first_p, second_p, none) = outputs[True], outputs[False]
        assert first_c == first_p and second_c == second_p, method
        assert none == 0 and hit >= len(turn1) + len(first_c[0]) - 1, method  # the answer's last token was never fed
    stats = Engine(target.module, lambda: make_drafter("none", target, CONTEXT), CONTEXT, max_batch=1)
    stats.pool.held[0] = [1, 2, 3]
    assert stats.pool._slot_for([1, 2, 3]) == (0, 2)  # the prompt's last token is always prefilled


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_requests_with_one_prompt_share_its_prefill_and_output_is_unchanged(tiny_target_loaded, temperature):
    """Several samples of one prompt submitted at once: the first prefills it, the others wait for that
    and copy its keys/values (cached_tokens: all but the prompt's last token); every output, greedy or
    seeded, equals what a prefill of its own gives. A short prompt and one asking for its prompt's
    logprobs do not wait."""
    target = tiny_target_loaded
    prompt = list(range(40, 90))
    for method in ("none", "draft"):
        factory = lambda m=method: make_drafter(m, target, CONTEXT, target)  # noqa: E731
        outputs = {}
        for shared in (True, False):
            stepper = Engine(target.module, factory, CONTEXT, max_batch=4, prefill_chunk=16, prefix_cache=shared)
            seqs = [stepper.add_request(prompt, GenerationConfig(10, 3, SamplingParams(temperature, seed=i)), set())
                    for i in range(4)]
            while any(s.finish_reason is None for s in seqs):
                stepper.step()
            outputs[shared] = ([s.new_tokens for s in seqs], [s.stats.cached_tokens for s in seqs])
        (tokens, cached), (alone, none) = outputs[True], outputs[False]
        assert tokens == alone, method
        assert cached == [0] + [len(prompt) - 1] * 3 and none == [0] * 4, method
    stepper = Engine(target.module, lambda: make_drafter("none", target, CONTEXT), CONTEXT, max_batch=3)
    first = stepper.add_request(prompt, GenerationConfig(4, 3), set())
    short = stepper.add_request(prompt[:20], GenerationConfig(4, 3), set())  # under SHARED_PREFILL tokens
    scored = stepper.add_request(prompt, GenerationConfig(4, 3, logprobs=0, prompt_logprobs=True), set())
    stepper.step()
    assert first in stepper.running and short in stepper.running and scored in stepper.running


def test_the_api_reports_cached_prompt_tokens(main):
    """usage.prompt_tokens_details.cached_tokens: a repeated prompt's beginning came from the prefix cache."""
    base, sched = main
    ids = list(range(10, 40))
    bodies = [httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": ids + [tail], "max_tokens": 4,
                                                         "temperature": 0}, timeout=60).json() for tail in (7, 8)]
    assert bodies[1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(ids)
    assert bodies[0]["choices"][0]["text"] == text_of(sched, reference(sched, ids + [7], 4).tokens)


def test_the_api_under_fuzzing(main):
    """schemathesis drives completions, chat, llama-server's /completion and /infill, Anthropic's
    /v1/messages (and its count_tokens) and the Responses API from /openapi.json with generated bodies
    (bounded):
    every answer is a 2xx or a clear 4xx with an error object; no 5xx, no hang."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    base, _ = main
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.method.upper() == "POST" and op.path.endswith(("completions", "completion", "infill",
                                                                                  "messages", "count_tokens", "responses"))]
    assert {op.path for op in ops} == {"/v1/completions", "/v1/chat/completions", "/completion", "/completions",
                                       "/infill", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"}
    seen, refused = [], []
    for op in ops:
        @settings(max_examples=30, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def fuzz(case):
            if isinstance(case.body, dict):
                case.body["model"] = "tiny"  # past the model check, into the rest of the body
                for cap in ("max_tokens", "max_output_tokens"):
                    if isinstance(case.body.get(cap), int):
                        case.body[cap] = min(case.body[cap], 16)  # bounded generation
                if case.path == "/v1/responses" and case.body.get("max_output_tokens") is None:
                    case.body["max_output_tokens"] = 16
                if not case.path.startswith("/v1/"):  # llama-server's: n_predict -1 (the default) runs to the context
                    n = case.body.get("n_predict")
                    case.body["n_predict"] = min(n, 16) if isinstance(n, int) and n >= 0 else 16
            r = case.call(base_url=base, timeout=60)
            seen.append(r.status_code)
            if r.status_code >= 400 and len(refused) < 3:
                refused.append((case.path, case.body, r.text[:300]))
            assert r.status_code < 500, (case.body, r.text)
            if r.status_code >= 400:
                assert r.json()["error"]["message"], r.text

        fuzz()
    assert len(seen) >= 20 and any(s < 300 for s in seen), (sorted(seen), refused)  # valid bodies were generated too
