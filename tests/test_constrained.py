"""Generation under a grammar (structured output) through the engine: on tiny random models with a toy
grammar of known masks, every drafter gives constrained plain decoding's greedy tokens; every token
obeys the grammar; forced tokens are drafted; and the verifier's masked rejection sampling gives the
target's constrained distribution."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.constraints.base import tree_masks, walk_masks
from specdec.engine.engine import Engine
from specdec.sampling.verify import accept_chain, accept_tree
from specdec.model import load_model
from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
from specdec.tree import DraftTree
from tests.conftest import TINY_VOCAB, make_drafter

STOP = 2  # the toy grammar's stop id (it may end after END_AFTER tokens)
END_AFTER = 18
PROMPTS = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 50))]


class ToyConstraint:
    """A grammar over the tiny vocabulary whose state is (tokens so far, the last one): at n % 6 == 4
    and 5 it forces one token; else it allows t where (t + last + n) % 3 != 0, never the stop id
    before END_AFTER tokens; after the stop id it is finished. The Constraint protocol of
    specdec.constraints, its walking methods from walk_masks."""

    def __init__(self, vocab: int = TINY_VOCAB):
        self.vocab_size, self.n, self.last, self.finished = vocab, 0, 0, False

    def _allowed_at(self, n: int, last: int, finished: bool) -> torch.Tensor:  # [vocab]
        m = torch.zeros(self.vocab_size, dtype=torch.bool)
        if finished:
            return m
        if n % 6 in (4, 5):
            m[(7 * n + last) % (self.vocab_size - 3) + 3] = True
            return m
        t = torch.arange(self.vocab_size)
        m = (t + last + n) % 3 != 0
        m[STOP] = n >= END_AFTER
        return m

    def allowed(self) -> torch.Tensor:
        return self._allowed_at(self.n, self.last, self.finished)

    def masks_along(self, tokens: list[int]) -> torch.Tensor:
        n, last, fin, out = self.n, self.last, self.finished, [self._allowed_at(self.n, self.last, self.finished)]
        for t in tokens:
            if not out[-1][t]:
                break
            n, last, fin = n + 1, t, t == STOP
            out.append(self._allowed_at(n, last, fin))
        return torch.stack(out)

    def advance(self, tokens: list[int]) -> None:
        for t in tokens:
            assert self.allowed()[t], f"the engine emitted {t}, which the grammar rejects"
            self.n, self.last, self.finished = self.n + 1, t, t == STOP

    def forced(self, limit: int, after=()) -> list[int]:
        masks = self.masks_along(list(after))
        if masks.shape[0] <= len(after) or (after and after[-1] == STOP) or self.finished:
            return []
        n, last = self.n + len(after), after[-1] if after else self.last
        out = []
        while len(out) < limit and n % 6 in (4, 5):
            t = int(self._allowed_at(n, last, False).nonzero()[0])
            out.append(t)
            n, last = n + 1, t
        return out

    def mask_after(self, drafted: list[int]) -> torch.Tensor | None:
        return walk_masks(self, drafted)

    def tree_masks(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        return tree_masks(self, tokens, parents)


@pytest.fixture(scope="module")
def target(tiny_llama_dir):
    return load_model(str(tiny_llama_dir), device="cpu")


@pytest.fixture(scope="module")
def draft(tiny_qwen_dir):
    return load_model(str(tiny_qwen_dir), device="cpu")


def generate(target, drafter, prompt, sampling=SamplingParams(), k=3, max_new=30):
    engine = Engine.single(target.module, drafter, 256)
    c = ToyConstraint(target.module.config.vocab_size)
    return engine.generate(prompt, GenerationConfig(max_new, k, sampling), {STOP}, constraint=c), c


@pytest.fixture(scope="module")
def plain(target):
    return [generate(target, make_drafter("none", target, 256), p)[0].tokens for p in PROMPTS]


@pytest.mark.parametrize("method", ["draft", "tree", "hybrid", "ngram", "suffix", "lookahead", "layer-skip"])
def test_every_drafter_gives_constrained_plain_decoding(target, draft, plain, method):
    for prompt, expected in zip(PROMPTS, plain):
        drafter = make_drafter("draft" if method == "tree" else method, target, 256,
                               draft if method in ("draft", "tree", "hybrid") else None,
                               tree=TreeConfig(8, 3, 2) if method == "tree" else None, layers=1)
        result, c = generate(target, drafter, prompt)
        assert result.tokens == expected, f"{method} diverged under the grammar on {prompt}"
        assert c.n == len(expected)  # the grammar moved with every emitted token (advance checks each)


@pytest.mark.parametrize("method", ["draft", "tree", "ngram", "lookahead"])
def test_penalties_under_a_grammar_give_penalised_constrained_plain_decoding(target, draft, plain, method):
    """The rows are penalised first, then masked: every drafter keeps plain decoding's tokens under both."""
    sampling = SamplingParams(repetition_penalty=1.6, presence_penalty=0.5, logit_bias=((7, 1.5),))
    for prompt, unpenalised in zip(PROMPTS, plain):
        expected, _ = generate(target, make_drafter("none", target, 256), prompt, sampling)
        assert expected.tokens != unpenalised
        drafter = make_drafter("draft" if method == "tree" else method, target, 256,
                               draft if method in ("draft", "tree") else None,
                               tree=TreeConfig(8, 3, 2) if method == "tree" else None)
        result, c = generate(target, drafter, prompt, sampling)
        assert result.tokens == expected.tokens, f"{method} diverged under the grammar and penalties on {prompt}"


def test_pooled_drafts_are_masked_as_a_single_sequences_are(target, plain):
    """Sequences drafting together (one draft forward per position over every row, as the server's
    batches do) draft from their grammars' masked distributions as a sequence alone does: the same
    tokens, and the same steps (a draft cut at its first rejected token would take more)."""
    alone = [generate(target, make_drafter("draft", target, 256, target), p)[0] for p in PROMPTS]
    engine = Engine(target.module, lambda: make_drafter("draft", target, 256, target), 256, max_batch=len(PROMPTS))
    assert engine.pool.draft_cache is not None  # the drafters are pooled
    seqs = [engine.add_request(p, GenerationConfig(30, 3), {STOP}, constraint=ToyConstraint(
        target.module.config.vocab_size)) for p in PROMPTS]
    while any(s.finish_reason is None for s in seqs):
        engine.step()
    for seq, one, expected in zip(seqs, alone, plain):
        assert seq.new_tokens == one.tokens == expected
        assert seq.stats.steps == one.stats.steps and seq.stats.drafted == one.stats.drafted


@pytest.mark.parametrize("pooled", [False, True])
def test_an_eagle_head_drafts_only_what_the_grammar_allows(target, plain, monkeypatch, pooled):
    """A head (over its kept ids) drafts from the masked distribution, alone and pooled: no draft is
    ever cut at a token the grammar rejects, and greedy output is constrained plain decoding's."""
    import specdec.engine.step as step_module
    from specdec.drafters.eagle import EagleDrafter
    from tests.test_eagle import eagle_head
    module = target.module
    head = eagle_head(module, list(range(0, module.config.vocab_size, 2)) + [STOP, 3, 5])
    cuts = []
    original = step_module.constrain

    def watched(constraint, draft, limit):
        out, masks = original(constraint, draft, limit)
        cuts.append(draft.is_chain and len(out) < len(draft))
        return out, masks

    monkeypatch.setattr(step_module, "constrain", watched)
    engine = Engine(module, lambda: EagleDrafter(module, head, 256), 256, max_batch=len(PROMPTS) if pooled else 1)
    seqs = [engine.add_request(p, GenerationConfig(30, 3), {STOP}, constraint=ToyConstraint(module.config.vocab_size))
            for p in PROMPTS]
    while any(s.finish_reason is None for s in seqs):
        engine.step()
    assert [s.new_tokens for s in seqs] == plain
    assert cuts and not any(cuts) and sum(s.stats.drafted for s in seqs) > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_model_takes_the_forced_tokens_in_one_forward(target, draft, plain, monkeypatch, temperature):
    """Where the grammar forces the next tokens, a draft model's chain takes them (q one-hot), feeds
    them with its next token in one forward, and drafts past them: fewer draft forwards; greedy
    output stays constrained plain decoding's, sampled output obeys the grammar (its q there is the
    masked draft's own, one-hot; only the random stream differs, as no draw picks a forced token)."""
    from specdec.drafters.draft_model import Chain, DraftModelDrafter
    forwards = []
    original = DraftModelDrafter._logits
    monkeypatch.setattr(DraftModelDrafter, "_logits", lambda self, x: forwards.append(1) or original(self, x))
    sampling = SamplingParams(temperature=temperature, seed=4)
    runs = {}
    for take in (True, False):
        if not take:
            monkeypatch.setattr(Chain, "_force", lambda self: None)
        forwards.clear()
        out = [generate(target, make_drafter("draft", target, 256, draft), p, sampling)[0].tokens for p in PROMPTS]
        runs[take] = (out, len(forwards))
    (tokens, n_forced), (same, n_plain) = runs[True], runs[False]
    assert temperature > 0 or tokens == same == plain  # (generate's grammar checks every emitted token)
    assert n_forced < n_plain


def test_forced_runs_come_inside_a_chain_for_free(target, draft, plain, monkeypatch):
    """A draft model's chain carries the grammar's forced tokens wherever they come, after its own
    tokens too; they are free: its own tokens stay within k while the chain runs past it. Greedy
    output stays constrained plain decoding's."""
    import specdec.engine.step as step_module
    seen, original, k = [], step_module.constrain, 2

    def watched(constraint, d, room):
        out, masks = original(constraint, d, room)
        seen.append(out)
        return out, masks
    monkeypatch.setattr(step_module, "constrain", watched)
    for prompt, expected in zip(PROMPTS, plain):
        assert generate(target, make_drafter("draft", target, 256, draft), prompt, k=k)[0].tokens == expected
    free = [d.free for d in seen if d.free]
    runs = ["".join("F" if x else "m" for x in f) for f in free]
    assert any("mF" in r and "Fm" in r for r in runs)  # a forced run between the model's own tokens
    assert all(sum(not x for x in f) <= k for f in free) and any(len(f) > k for f in free)


def test_the_policy_learns_from_the_drafters_own_tokens_alone():
    """A step whose chain had forced tokens in it reaches the policy as the drafter's tokens alone:
    those drafted and accepted, their confidence rows and the bonus row; the verify at its width."""
    from types import SimpleNamespace
    from specdec.engine.step import _outcome
    from specdec.sampling.verify import Verified
    draft = DraftTree.chain(torch.arange(6), free=[False, True, True, False, False, True])
    conf = (0.9, 1.0, 1.0, 0.8, 0.3, 1.0, 0.7)  # rows 0..6: row 6 the bonus row
    for accepted, mine in ((6, 3), (4, 2), (3, 1), (0, 0)):
        o = _outcome(SimpleNamespace(draft=draft, seconds=0.01, pooled=1), Verified(list(range(accepted)), 0, 7,
                     confidence=conf), 0.05, 1, None)
        assert (o.num_drafted, o.num_accepted) == (3, mine)
        assert o.confidence == [0.9, 0.8, 0.3, 0.7] and o.width == 7 and o.forwards is None
        assert o.free_accepted == accepted - mine  # the forced tokens passed: the answer's length counts them
    # the answer length the policy learns (its admission's horizon) is every token emitted, forced ones too
    policy = AdaptivePolicy(CostModel({1: 1.0, 5: 1.1}, 0.25), PolicyConfig(k_max=4))
    policy.reset()
    policy.observe(_outcome(SimpleNamespace(draft=draft, seconds=0.01, pooled=1), Verified(list(range(6)), 0, 7,
                            confidence=conf), 0.05, 1, None))
    assert policy.request_tokens == 7


def test_plain_decoding_under_the_grammar_obeys_it_and_differs_from_free_decoding(target, plain):
    free = Engine.single(target.module, make_drafter("none", target, 256), 256).generate(
        PROMPTS[0], GenerationConfig(30, 3), {STOP}).tokens
    assert free != plain[0]  # the grammar changed the output (the toy rejects a third of the ids)
    c = ToyConstraint(target.module.config.vocab_size)
    c.advance(plain[0])  # raises on any token the grammar rejects


def test_the_stop_id_ends_the_answer_where_the_grammar_may_end(target):
    result, c = generate(target, make_drafter("draft", target, 256, target), PROMPTS[1], max_new=200)
    if result.finish_reason == "stop":
        assert result.tokens[-1] == STOP and len(result.tokens) > END_AFTER and c.finished
    else:
        assert STOP not in result.tokens


def test_forced_tokens_are_drafted_for_free(target, plain):
    """n-gram lookup finds nothing in a prompt of distinct ids, so what it drafts is the grammar's
    forced runs: steps fewer than tokens, the same output."""
    result, _ = generate(target, make_drafter("ngram", target, 256), PROMPTS[2])
    assert result.tokens == plain[2]
    assert result.stats.drafted > 0 and result.stats.steps < len(result.tokens) - 1


def test_sampled_output_under_the_grammar_obeys_it(target, draft):
    for method in ("draft", "ngram"):
        drafter = make_drafter(method, target, 256, draft if method == "draft" else None)
        result, c = generate(target, drafter, PROMPTS[0], SamplingParams(temperature=1.0, seed=3))
        assert c.n == len(result.tokens)


# ---- the verifier's masked acceptance: the constrained distribution ----

def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def constrained(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)


@pytest.mark.parametrize("drafter_masked", [True, False])
def test_masked_rejection_sampling_gives_the_constrained_distribution(drafter_masked):
    """Chains of 2 drafted from q (masked by the grammar or not) and verified under the grammar's masks:
    the first two emitted tokens are distributed jointly as the target's constrained p. The target's
    and the grammar's second position depend on the first token (tables L1, M1); where a step emits
    one token the second comes from a plain step."""
    torch.manual_seed(0)
    V, n = 5, 40000
    L0, L1, Q0, Q1 = torch.randn(V) * 1.5, torch.randn(V, V) * 1.5, torch.randn(V) * 1.5, torch.randn(V, V) * 1.5
    M0 = torch.tensor([1, 1, 0, 1, 1], dtype=torch.bool)
    M1 = torch.rand(V, V) < 0.6
    M1[:, 0] = True  # every state allows something
    gen = torch.Generator().manual_seed(1)
    q0 = constrained(Q0, M0) if drafter_masked else torch.softmax(Q0, -1)
    joint = torch.zeros(V, V)
    for _ in range(n):
        x0 = int(torch.multinomial(q0, 1, generator=gen))
        q1 = constrained(Q1[x0], M1[x0]) if drafter_masked else torch.softmax(Q1[x0], -1)
        x1 = int(torch.multinomial(q1, 1, generator=gen))
        keep = 0 if not M0[x0] else (1 if not M1[x0, x1] else 2)  # the engine's cut at the grammar
        masks = torch.stack([M0, M1[x0], torch.ones(V, dtype=torch.bool)])[:keep + 1]
        logits = torch.stack([L0, L1[x0], torch.zeros(V)])[:keep + 1]
        v = accept_chain(DraftTree.chain(torch.tensor([x0, x1])[:keep], torch.stack([q0, q1])[:keep]), logits,
                         SamplingParams(temperature=1.0), gen, masks=masks)
        out = [x0, x1][:v.num_accepted] + [v.next_token]
        if len(out) < 2:
            out.append(int(torch.multinomial(constrained(L1[out[0]], M1[out[0]]), 1, generator=gen)))
        joint[out[0], out[1]] += 1
    p0 = constrained(L0, M0)
    expected = torch.stack([p0[a] * constrained(L1[a], M1[a]) for a in range(V)])
    assert joint[~M0].sum() == 0 and float(joint[M1 == 0].sum()) == 0
    assert tv(joint.flatten(), expected.flatten()) < 3 * math.sqrt(V * V / n) / 2


def test_masked_tree_acceptance_under_greedy_takes_the_best_allowed_child():
    """A tree whose greedy-best children the grammar rejects: the accepted path follows the allowed
    argmax, never a rejected node."""
    V = 8
    logits = torch.full((4, V), -5.0)
    logits[0, 3], logits[0, 4] = 5.0, 4.0  # root: 3 best, 4 next
    logits[2, 6] = 3.0  # after node 1 (token 4): 6 best
    tree = DraftTree(torch.tensor([3, 4, 6]), torch.tensor([-1, -1, 1]))
    masks = torch.ones(4, V, dtype=torch.bool)
    masks[0, 3] = False  # the grammar rejects 3 at the root
    acc = accept_tree(tree, logits, SamplingParams(), None, None, masks)
    assert list(acc.path) == [1, 2]


# ---- the real grammar engine on the real SmolLM2-135M ----

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "languages": {"type": "array", "items": {"enum": ["python", "c", "rust"]},
                                                         "maxItems": 3}},
          "required": ["name", "age", "languages"], "additionalProperties": False}


@pytest.mark.real
@pytest.mark.parametrize("method, k", [("self", 4), ("ngram", 3), ("layer-skip", 3)])
def test_smollm2_json_schema_speculative_equals_plain_and_is_valid(smollm2, method, k):
    """Greedy under a JSON Schema: each drafter gives constrained plain decoding's tokens, and the text
    parses and matches the schema."""
    import json

    from specdec.constraints import ConstraintSpec, Grammars
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.model.tokenizer import encode_prompt
    tok, module = smollm2.tokenizer, smollm2.module
    grammars = Grammars.for_tokenizer(tok, module.config.vocab_size, smollm2.eos_ids)
    prompt = encode_prompt(tok, "Describe a programmer as JSON with a name, an age and languages.", chat=True)
    cfg = GenerationConfig(80, k)

    def run(drafter):
        c = grammars.constraint(ConstraintSpec("json_schema", SCHEMA))
        return Engine.single(module, drafter, 512).generate(prompt, cfg, smollm2.eos_ids, constraint=c)

    plain = run(make_drafter("none", smollm2, 512))
    drafter = {"self": lambda: DraftModelDrafter(module, module.config.vocab_size, 512),
               "ngram": lambda: make_drafter("ngram", smollm2, 512),
               "layer-skip": lambda: make_drafter("layer-skip", smollm2, 512, layers=12)}[method]()
    spec = run(drafter)
    assert spec.tokens == plain.tokens
    assert plain.finish_reason == "stop"
    value = json.loads(tok.decode([t for t in plain.tokens if t not in smollm2.eos_ids]))
    assert set(value) == {"name", "age", "languages"} and isinstance(value["age"], int)
    assert set(value["languages"]) <= {"python", "c", "rust"}
    assert spec.stats.steps < len(spec.tokens)  # drafts were accepted (forced keys and punctuation at least)


@pytest.mark.real
def test_smollm2_every_schema_task_speculative_equals_plain_and_stopped_answers_validate(smollm2):
    """The shipped schema tasks (specdec/data/schema_tasks.jsonl) on SmolLM2-135M under their schemas:
    layer skip (drafts that are often rejected) with forced drafts gives constrained plain decoding's
    tokens on every task, and every answer that stopped parses and validates."""
    import json
    from pathlib import Path

    import jsonschema

    from specdec.constraints import ConstraintSpec, Grammars
    from specdec.model.tokenizer import encode_messages
    tasks = [json.loads(line) for line in
             (Path(__file__).resolve().parent.parent / "specdec/data/schema_tasks.jsonl").read_text().splitlines()]
    assert len(tasks) >= 50
    tok, module = smollm2.tokenizer, smollm2.module
    grammars = Grammars.for_tokenizer(tok, module.config.vocab_size, smollm2.eos_ids)
    plain = Engine.single(module, make_drafter("none", smollm2, 1024), 1024)
    spec = Engine.single(module, make_drafter("layer-skip", smollm2, 1024, layers=10), 1024)
    cfg, stopped = GenerationConfig(96, 4), 0
    for task in tasks:
        ids = encode_messages(tok, [{"role": "system", "content": "Answer with JSON only, matching this JSON "
                                     "Schema: " + json.dumps(task["schema"])}, {"role": "user", "content": task["prompt"]}])
        s = ConstraintSpec("json_schema", task["schema"])
        want = plain.generate(ids, cfg, smollm2.eos_ids, constraint=grammars.constraint(s))
        got = spec.generate(ids, cfg, smollm2.eos_ids, constraint=grammars.constraint(s))
        assert got.tokens == want.tokens, task["id"]
        if want.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(tok.decode(want.tokens, skip_special_tokens=True)), task["schema"])
    assert stopped >= len(tasks) // 2  # most answers fit the budget
