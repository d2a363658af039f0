"""Logprobs: every emitted token's logprob (and its top alternatives) is log_softmax of the target's raw
logits at the row that predicted it, for plain, chain and tree steps, drafters with a verify of their own,
and the batched slot pool; the prompt's too where asked. Asking changes neither the tokens nor the
acceptance."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.layer_skip import LayerSkipDrafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.sampling.logprobs import token_logprobs
from specdec.model.tokenizer import encode_messages
from specdec.server import build_scheduler
from tests.conftest import TINY_VOCAB
from tests.test_server import CONTEXT, chat_dir, client, one_thread, running, serve_args  # noqa: F401 - fixtures

PROMPTS = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 60))]
TOL = 1e-4
TOP = 5

DRAFTERS = {
    "plain": lambda t, d: NoDrafter(),
    "ngram": lambda t, d: NgramDrafter(3, 1),
    "chain-self": lambda t, d: DraftModelDrafter(t, TINY_VOCAB, 256),
    "chain-other": lambda t, d: DraftModelDrafter(d, TINY_VOCAB, 256),
    "tree-self": lambda t, d: DraftModelDrafter(t, TINY_VOCAB, 256, tree=TreeConfig(8, 3, 2)),
    "tree-other": lambda t, d: DraftModelDrafter(d, TINY_VOCAB, 256, tree=TreeConfig(8, 3, 2)),
    "lookahead": lambda t, d: LookaheadDrafter(2, 3, 2),
    "layer-skip": lambda t, d: LayerSkipDrafter(t, 1, 256),
}


def direct(target, tokens: list[int]) -> torch.Tensor:
    """log_softmax of one plain forward over `tokens`: row i scores tokens[i + 1] # [T, vocab]."""
    cache = target.new_cache(len(tokens) + 8)
    return torch.log_softmax(target(torch.tensor([tokens]), cache, 0)[0].float(), dim=-1)


def assert_scores(target, prompt: list[int], new: list[int], scores, top: int = TOP) -> None:
    """Each new token's logprob and top alternatives against a direct forward over prompt + new."""
    assert len(scores) == len(new)
    lp = direct(target, prompt + new)
    for i, (tok, s) in enumerate(zip(new, scores)):
        row = lp[len(prompt) + i - 1]
        assert s.token == tok
        assert s.logprob == pytest.approx(float(row[tok]), abs=TOL)
        assert len(s.top) == top
        values, ids = row.topk(top)
        assert [v for _, v in s.top] == pytest.approx(values.tolist(), abs=TOL)
        assert {t for t, _ in s.top} == set(ids.tolist()) or values[-1] - row.topk(top + 1).values[-1] < TOL


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("which", list(DRAFTERS))
def test_logprobs_equal_a_direct_forward(tiny_target, tiny_draft, which, temperature):
    engine = Engine.single(tiny_target, DRAFTERS[which](tiny_target, tiny_draft), 256)
    accepted = 0
    for seed, prompt in enumerate(PROMPTS):
        cfg = GenerationConfig(24, 3, SamplingParams(temperature, 0, 1.0, seed), logprobs=TOP)
        result = engine.generate(prompt, cfg)
        assert_scores(tiny_target, prompt, result.tokens, result.logprobs)
        assert result.prompt_logprobs is None
        accepted += result.stats.accepted
    if which.endswith("-self") or which == "layer-skip":
        assert accepted > 0  # drafts were accepted: multi-token steps were scored


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("which", ["ngram", "chain-other", "tree-other"])
def test_asking_changes_neither_tokens_nor_acceptance(tiny_target, tiny_draft, which, temperature):
    for seed, prompt in enumerate(PROMPTS):
        runs = []
        for logprobs in (None, 0, 3):
            engine = Engine.single(tiny_target, DRAFTERS[which](tiny_target, tiny_draft), 256)
            cfg = GenerationConfig(30, 3, SamplingParams(temperature, 0, 0.95, 100 + seed), logprobs=logprobs)
            r = engine.generate(prompt, cfg)
            runs.append((r.tokens, r.stats.drafted, r.stats.accepted, r.stats.steps))
            assert (r.logprobs is None) == (logprobs is None)
        assert runs[0] == runs[1] == runs[2]


def test_top_zero_gives_the_token_alone_and_eos_cuts_alike(tiny_target):
    engine = Engine.single(tiny_target, NgramDrafter(3, 1), 256)
    full = engine.generate(PROMPTS[1], GenerationConfig(30, 4, logprobs=0))
    assert all(s.top == () for s in full.logprobs)
    eos = full.tokens[7]
    cut = engine.generate(PROMPTS[1], GenerationConfig(30, 4, logprobs=0), {eos})
    assert cut.finish_reason == "stop" and cut.tokens == full.tokens[:full.tokens.index(eos) + 1]
    assert cut.logprobs == full.logprobs[:len(cut.tokens)]


def test_prompt_logprobs_equal_a_direct_forward(tiny_target, tiny_draft):
    engine = Engine.single(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), 256)
    prompt = PROMPTS[2]
    r = engine.generate(prompt, GenerationConfig(6, 3, logprobs=2, prompt_logprobs=True))
    assert len(r.prompt_logprobs) == len(prompt) and r.prompt_logprobs[0] is None
    assert_scores(tiny_target, prompt[:1], prompt[1:], r.prompt_logprobs[1:], top=2)
    assert_scores(tiny_target, prompt, r.tokens, r.logprobs, top=2)


def test_batched_pool_scores_every_row_and_the_prompt_past_the_prefix_cache(tiny_target, tiny_draft):
    """Four sequences in three slots, chains verified together, the prompt prefilled in chunks of 7;
    a repeated prompt that asks for the prompt's logprobs is prefilled whole again."""
    pool = Engine(tiny_target, lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), 256, 3,
                             prefill_chunk=7)
    prompts = PROMPTS + [PROMPTS[2]]
    asks = [GenerationConfig(20, 3, SamplingParams(0.0), logprobs=TOP),
            GenerationConfig(20, 3, SamplingParams(1.0, 0, 1.0, 7), logprobs=TOP),
            GenerationConfig(20, 3, SamplingParams(0.0), logprobs=TOP),
            GenerationConfig(20, 3, SamplingParams(0.0), logprobs=TOP, prompt_logprobs=True)]
    done, pending, widest = {}, list(enumerate(zip(prompts, asks))), 1
    for _ in range(200):
        while pending and pool.pool.free:
            i, (p, cfg) = pending.pop(0)
            pool.add_request(p, cfg, tag=i)
        if not pool.has_work:
            break
        for seq in pool.step():
            done[seq.tag] = seq
            pool.abort(seq)
        widest = max(widest, pool.decode_batch)
    assert len(done) == 4 and widest > 1
    for i, seq in done.items():
        assert_scores(tiny_target, prompts[i], seq.new_tokens, seq.logprobs)
    last = done[3]
    assert last.stats.cached_tokens == 0 and len(last.prompt_logprobs) == len(prompts[3])
    assert_scores(tiny_target, prompts[3][:1], prompts[3][1:], last.prompt_logprobs[1:])
    assert done[2].new_tokens == last.new_tokens


def test_token_logprobs_is_log_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5], [0.0, 0.0, 0.0, 4.0]])
    out = token_logprobs(logits, [0, 3], 2)
    lp = torch.log_softmax(logits, -1)
    assert out[0].logprob == pytest.approx(float(lp[0, 0])) and out[1].logprob == pytest.approx(float(lp[1, 3]))
    assert [t for t, _ in out[0].top] == [2, 1] and out[1].top[0][0] == 3
    with pytest.raises(ValueError):
        token_logprobs(logits, [0], 2)


def test_bad_logprobs_settings_are_refused():
    with pytest.raises(SpecdecError, match="logprobs"):
        GenerationConfig(4, 2, logprobs=-1)
    with pytest.raises(SpecdecError, match="prompt_logprobs"):
        GenerationConfig(4, 2, prompt_logprobs=True)


# ---- the server: OpenAI's shapes over the batched slot pool (a tiny target and a random draft model) ----

@pytest.fixture(scope="module")
def served(chat_dir, tiny_qwen_dir):
    sched = build_scheduler(*serve_args("--model", str(chat_dir), "--draft", str(tiny_qwen_dir), "--k", "3",
                                       "--device", "cpu", "--max-context", str(CONTEXT), "--max-batch", "4",
                                       "--policy", "fixed"), progress=lambda m: None)
    with running(sched) as (base, server):
        yield base, sched


def ids_of(sched, pieces: list[str]) -> list[int]:
    vocab = sched.tokenizer.get_vocab()
    return [vocab[p] for p in pieces]


def assert_server_scores(sched, prompt: list[int], pieces: list[str], logprobs: list[float]) -> None:
    """The answer's tokens (their texts) and logprobs against a direct forward over prompt + answer."""
    new = ids_of(sched, pieces)
    assert [sched.tokenizer.decode([t]) for t in new] == pieces
    lp = direct(sched.engine.target, prompt + new)
    want = [float(lp[len(prompt) + i - 1, t]) for i, t in enumerate(new)]
    assert logprobs == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completion_logprobs_over_concurrent_requests(served, temperature):
    base, sched = served
    prompts = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3], [9, 8, 7], list(range(30, 50))]
    c = client(base)

    def one(p):
        return c.completions.create(model="tiny", prompt=p, max_tokens=16, temperature=temperature, seed=3,
                                    logprobs=3)

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(one, prompts))
    for p, out in zip(prompts, outs):
        lp = out.choices[0].logprobs
        eos = out.choices[0].finish_reason == "stop"  # the end-of-sequence token has no text and no entry
        assert len(lp.tokens) == out.usage.completion_tokens - eos and lp.tokens
        assert_server_scores(sched, p, lp.tokens, lp.token_logprobs)
        for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            assert top[tok] == value and 3 <= len(top) <= 4 and max(top.values()) >= value
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        assert out.usage.speculative["drafted"] > 0  # it drafted while scoring
    again = one(prompts[0])  # greedy and seeded answers do not depend on asking
    plain = c.completions.create(model="tiny", prompt=prompts[0], max_tokens=16, temperature=temperature, seed=3)
    assert plain.choices[0].text == again.choices[0].text == outs[0].choices[0].text
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_whole_and_streamed(served):
    base, sched = served
    messages = [{"role": "user", "content": "w10 w11 w12"}]
    prompt = encode_messages(sched.tokenizer, messages)
    c = client(base)
    out = c.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0, logprobs=True,
                                    top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert_server_scores(sched, prompt, [t.token for t in content], [t.logprob for t in content])
    for t in content:
        assert t.bytes == list(t.token.encode()) and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob >= t.logprob - TOL and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=TOL)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == out.choices[0].message.content
    bare = c.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert bare.choices[0].logprobs is None and bare.choices[0].message.content == out.choices[0].message.content


def test_echo_scores_the_prompt_past_the_prefix_cache(served):
    base, sched = served
    c = client(base)
    text = "w5 w17 w3 w9 w40 w41"
    prompt = sched.tokenizer.encode(text)
    c.completions.create(model="tiny", prompt=text, max_tokens=4, temperature=0)  # the prompt now sits in a slot
    out = c.completions.create(model="tiny", prompt=text, max_tokens=3, temperature=0, echo=True, logprobs=1)
    choice = out.choices[0]
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    assert choice.text.startswith(text) and len(choice.text) > len(text)
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = direct(sched.engine.target, prompt)
    assert lp.token_logprobs[1:len(prompt)] == pytest.approx([float(want[i - 1, t]) for i, t in
                                                              enumerate(prompt) if i], abs=TOL)
    assert lp.text_offset[len(prompt)] == len(text)
    streamed = list(c.completions.create(model="tiny", prompt=text, max_tokens=3, temperature=0, echo=True,
                                         logprobs=1, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == choice.text
    tokens = [t for ch in streamed if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    values = [v for ch in streamed if ch.choices[0].logprobs for v in ch.choices[0].logprobs.token_logprobs]
    assert tokens == lp.tokens and values[0] is None
    assert values[1:] == pytest.approx(lp.token_logprobs[1:], abs=TOL)
    plain = c.completions.create(model="tiny", prompt=text, max_tokens=3, temperature=0, echo=True)
    assert plain.choices[0].text == choice.text and plain.choices[0].logprobs is None


def test_max_tokens_0_with_echo_scores_the_prompt_alone(served):
    """OpenAI's legacy scoring call: the prompt's logprobs and nothing generated, whole and streamed;
    without echo, or on the chat endpoint, max_tokens 0 is a 400 that says why."""
    base, sched = served
    c = client(base)
    text = "w7 w8 w9 w30 w31"
    prompt = sched.tokenizer.encode(text)
    want = direct(sched.engine.target, prompt)
    for stream in (False, True):
        out = c.completions.create(model="tiny", prompt=text, max_tokens=0, temperature=0, echo=True, logprobs=2,
                                   stream=stream)
        chunks = [ch.choices[0] for ch in out] if stream else [out.choices[0]]
        assert "".join(ch.text for ch in chunks) == text and chunks[-1].finish_reason == "length"
        tokens = [t for ch in chunks if ch.logprobs for t in ch.logprobs.tokens]
        values = [v for ch in chunks if ch.logprobs for v in ch.logprobs.token_logprobs]
        assert len(tokens) == len(prompt) and values[0] is None
        assert values[1:] == pytest.approx([float(want[i - 1, t]) for i, t in enumerate(prompt) if i], abs=TOL)
        if not stream:
            assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(prompt)
    bare = c.completions.create(model="tiny", prompt=text, max_tokens=0, echo=True)
    assert bare.choices[0].text == text and bare.choices[0].logprobs is None
    for call, args in ((c.completions.create, {"prompt": text}),
                       (c.chat.completions.create, {"messages": [{"role": "user", "content": text}]})):
        with pytest.raises(openai.BadRequestError, match="max_tokens") as e:
            call(model="tiny", max_tokens=0, **args)
        assert e.value.status_code == 400
    again = c.completions.create(model="tiny", prompt=text, max_tokens=4, temperature=0)  # the server goes on
    assert again.usage.completion_tokens == 4 or again.choices[0].finish_reason == "stop"


def test_logprobs_stop_where_a_stop_string_cuts(served):
    base, sched = served
    c = client(base)
    full = c.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=30, temperature=0).choices[0].text
    words = full.split()
    stop = " " + words[len(words) // 2] + " "
    for stream in (False, True):
        out = c.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=30, temperature=0, stop=stop,
                                   logprobs=0, stream=stream)
        choices = [ch.choices[0] for ch in out] if stream else [out.choices[0]]
        text = "".join(ch.text for ch in choices)
        tokens = [t for ch in choices if ch.logprobs for t in ch.logprobs.tokens]
        assert text == full[:full.find(stop)] and tokens == text.split()


def test_tokenize_round_trips_through_detokenize(served):
    base, sched = served
    for body in ({"content": "w5 w17 w3"}, {"prompt": "w5 w17 w3", "add_special": False},
                 {"prompt": "w5 w17 w3", "add_special_tokens": False}):
        r = httpx.post(base + "/tokenize", json=body)
        assert r.status_code == 200, r.text
        tokens = r.json()["tokens"]
        special = body.get("add_special", body.get("add_special_tokens", True))
        assert tokens == sched.tokenizer.encode("w5 w17 w3", add_special_tokens=special)
        assert r.json()["count"] == len(tokens) and r.json()["max_model_len"] == CONTEXT
        back = httpx.post(base + "/detokenize", json={"tokens": tokens}).json()
        assert back["content"] == back["prompt"] == sched.tokenizer.decode(tokens)
        assert back["content"].split()[-3:] == ["w5", "w17", "w3"]
    info = httpx.get(base + "/tokenizer_info").json()
    assert info["eos_token"] == sched.tokenizer.eos_token and info["chat_template"] == sched.tokenizer.chat_template
    paths = httpx.get(base + "/openapi.json").json()["paths"]
    assert {"/tokenize", "/detokenize", "/tokenizer_info"} <= set(paths)


@pytest.mark.parametrize("path,body,param,named", [
    ("/detokenize", {"tokens": [1, 500]}, "tokens", "500"),
    ("/detokenize", {"tokens": [-3]}, "tokens", "-3"),
    ("/detokenize", {"tokens": "w1"}, "tokens", "tokens"),
    ("/tokenize", {"add_special": True}, None, "content"),
    ("/tokenize", {"content": 5}, "content", "content"),
    ("/tokenize", {"content": "w1", "model": "gpt-9"}, "model", "model"),
])
def test_tokenize_bad_input_is_4xx_naming_it(served, path, body, param, named):
    base, _ = served
    r = httpx.post(base + path, json=body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["param"] == param and named in err["message"]


def test_real_model_echo_and_token_texts(smollm2):
    """SmolLM2 (byte-level BPE): echo's prompt logprobs equal a direct forward, and the tokens' texts
    and bytes spell the answer."""
    from specdec.server.scheduler import Scheduler
    from specdec.engine.engine import Engine as Pool
    pool = Pool(smollm2.module, NoDrafter, 256, 1)
    sched = Scheduler(pool, smollm2.tokenizer, set(), k=2)
    with running(sched, "smol") as (base, _):
        text = "The capital of France is Paris. The capital of Italy is"
        out = client(base).completions.create(model="smol", prompt=text, max_tokens=6, temperature=0, echo=True,
                                              logprobs=2)
    prompt = smollm2.tokenizer.encode(text)
    lp = out.choices[0].logprobs
    want = direct(smollm2.module, prompt)
    assert lp.token_logprobs[1:len(prompt)] == pytest.approx([float(want[i - 1, t]) for i, t in
                                                              enumerate(prompt) if i], abs=TOL)
    assert "".join(lp.tokens) == out.choices[0].text
    assert [out.choices[0].text[o:o + len(t)] for o, t in zip(lp.text_offset, lp.tokens)] == lp.tokens
