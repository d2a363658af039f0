"""Constraints on the real SmolLM2 tokenizer, in a model vocabulary padded past it: masks along valid
and invalid outputs, masks_along against step-by-step masks with exact rollback, forced tokens, every
kind of spec, and a clear SpecdecError for each bad one."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.constraints import ConstraintSpec, Grammars, tree_masks, walk_masks
from specdec.constraints.vocab import pack_bits, padding_ids, usable_ids
from specdec.errors import SpecdecError
from specdec.model.tokenizer import load_tokenizer

A_INT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
KENOBI = {"type": "object", "properties": {"greeting": {"enum": ["hello there, general kenobi"]}},
          "required": ["greeting"]}
ARITH_GBNF = '''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
'''
ARITH_LARK = '''start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: /[0-9]+/ | "(" expr ")"
'''
PAD_ROWS = 64  # the model's vocabulary runs this far past the tokenizer's


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="module")
def grammars(tok):
    return Grammars.for_tokenizer(tok, len(tok) + PAD_ROWS, [tok.eos_token_id, 0])


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_a_valid_instance_walks_through_the_masks_and_ends_on_a_stop_id(tok, grammars):
    c, eos = grammars.constraint(ConstraintSpec("json_schema", A_INT)), tok.eos_token_id
    assert c.vocab_size == len(tok) + PAD_ROWS
    for token in ids(tok, '{"a": 12}'):
        mask = c.allowed()  # [vocab]
        assert mask.shape == (c.vocab_size,) and mask.dtype == torch.bool
        assert mask[token] and not mask[eos] and not mask[len(tok):].any()
        c.advance([token])
    assert c.allowed().nonzero().flatten().tolist() == [0, eos]  # only the stop ids, where it may end
    c.advance([eos])
    assert c.finished and not c.allowed().any()
    with pytest.raises(SpecdecError, match="finished"):
        c.advance(ids(tok, "1"))


def test_a_token_the_schema_forbids_is_masked_and_refused_all_or_none(tok, grammars):
    c = grammars.constraint(ConstraintSpec("json_schema", A_INT))
    tokens = ids(tok, '{"a": 12}')
    bad = ids(tok, "[")[0]
    assert not c.allowed()[bad]
    c.advance(tokens[:-1])  # {"a": 12
    before = c.allowed()
    assert before[tokens[-1]] and not before[ids(tok, "x")[0]] and not before[tok.eos_token_id]
    with pytest.raises(SpecdecError, match=f"token {bad} \\(at 1 of 2\\)"):
        c.advance([tokens[-1], bad])
    assert torch.equal(c.allowed(), before) and not c.finished


def stepwise(grammars, spec, prefix: list[int], draft: list[int]) -> torch.Tensor:
    c = grammars.constraint(spec)
    c.advance(prefix)
    rows = []
    for token in draft:
        rows.append(c.allowed())
        c.advance([token])
    return torch.stack(rows + [c.allowed()])  # [len(draft) + 1, vocab]


def test_masks_along_equals_the_step_by_step_masks_and_rolls_back_exactly(tok, grammars):
    spec = ConstraintSpec("json_schema", A_INT)
    tokens, eos = ids(tok, '{"a": 12}'), tok.eos_token_id
    c = grammars.constraint(spec)
    c.advance(tokens[:2])
    before = c.allowed()
    draft = tokens[2:] + [eos]
    masks = c.masks_along(draft)
    assert masks.shape == (len(draft) + 1, c.vocab_size) and masks.dtype == torch.bool
    assert torch.equal(masks, stepwise(grammars, spec, tokens[:2], draft))
    assert not masks[-1].any()  # after the stop id
    assert torch.equal(c.allowed(), before) and not c.finished
    c.advance(draft)
    assert c.finished


def test_masks_along_stops_at_the_first_token_the_grammar_rejects(tok, grammars):
    spec = ConstraintSpec("json_schema", A_INT)
    tokens = ids(tok, '{"a": 12}')
    c = grammars.constraint(spec)
    before = c.allowed()
    bad = ids(tok, "x")[0]
    masks = c.masks_along(tokens[:2] + [bad] + tokens[2:])
    assert torch.equal(masks, stepwise(grammars, spec, [], tokens[:2]))
    for draft in ([], [tok.eos_token_id], [len(tok) + 3], [bad]):  # a stop too early, a padding row
        assert torch.equal(c.masks_along(draft), before[None])
    assert torch.equal(c.allowed(), before)


def test_mask_after_a_draft_is_the_walks_last_mask_or_none(tok, grammars):
    c = grammars.constraint(ConstraintSpec("json_schema", A_INT))
    tokens, eos = ids(tok, '{"a": 12}'), tok.eos_token_id
    c.advance(tokens[:1])
    before = c.allowed()
    steps = stepwise(grammars, ConstraintSpec("json_schema", A_INT), tokens[:1], tokens[1:])
    for n in range(len(tokens)):
        assert torch.equal(c.mask_after(tokens[1:1 + n]), steps[n])
        assert torch.equal(walk_masks(c, tokens[1:1 + n]), steps[n])
    for drafted in (tokens[1:3] + ids(tok, "x"), tokens[1:] + [eos], [eos]):  # rejected, after a stop, too early
        assert c.mask_after(drafted) is None and walk_masks(c, drafted) is None
    assert torch.equal(c.allowed(), before)


def test_tree_masks_give_each_node_the_mask_after_its_path(tok, grammars):
    spec = ConstraintSpec("json_schema", A_INT)
    t = ids(tok, '{"a": 12}')  # {" a ": ...
    x, eos = ids(tok, "x")[0], tok.eos_token_id
    #   0:t0 -> 1:t1 -> 2:t2 -> 4:x (rejected) -> 6:t3 (under a rejected node)
    #        -> 3:x (rejected)        2 -> 5:t3
    tokens, parents = [t[0], t[1], t[2], x, x, t[3], t[3]], [-1, 0, 1, 0, 2, 2, 4]
    c = grammars.constraint(spec)
    before = c.allowed()
    rows = c.tree_masks(tokens, parents)
    assert rows.shape == (len(tokens) + 1, c.vocab_size)
    steps = stepwise(grammars, spec, [], t[:4])  # now, after t0, t0 t1, t0 t1 t2, t0 t1 t2 t3
    expected = [steps[0], steps[1], steps[2], steps[3], None, None, steps[4], None]
    for row, want in zip(rows, expected):
        assert torch.equal(row, want) if want is not None else not row.any()
    assert torch.equal(tree_masks(c, tokens, parents), rows)
    assert torch.equal(c.tree_masks([], []), before[None]) and torch.equal(c.allowed(), before)


def test_forced_tokens_decode_to_the_forced_text_and_are_allowed_in_turn(tok, grammars):
    c = grammars.constraint(ConstraintSpec("json_schema", KENOBI))
    before = c.allowed()
    forced = c.forced(64)
    text = tok.decode(forced)
    assert len(text) > len('{"greeting": "hello') and '{"greeting": "hello there, general kenobi"}'.startswith(text)
    assert c.forced(3) == forced[:3] and c.forced(0) == []
    assert torch.equal(c.allowed(), before)
    taken = []
    while step := c.forced(4):
        for token in step:
            assert c.allowed()[token]
            c.advance([token])
        taken += step
    assert tok.decode(taken) == text  # the last token is the model's: '"}' may be one token, or two
    c.advance(ids(tok, '"}') + [tok.eos_token_id])
    assert c.finished and c.forced(4) == []


def test_the_tokens_forced_after_a_drafted_prefix_are_those_forced_once_it_is_taken(tok, grammars):
    """forced(n, after): what the grammar forces after drafted tokens, the state unchanged; nothing
    after a prefix it rejects."""
    two = {"type": "object", "properties": {"a": {"type": "integer"}, "bb": {"type": "string"}},
           "required": ["a", "bb"], "additionalProperties": False}
    c = grammars.constraint(ConstraintSpec("json_schema", two))
    before, head = c.allowed(), c.forced(64)
    value = ids(tok, " 12,")  # the model's part: the integer and its end
    after = c.forced(64, head + value)
    assert ' "bb": "'.startswith(tok.decode(after)) and "bb" in tok.decode(after)
    assert c.forced(2, head + value) == after[:2]
    assert torch.equal(c.allowed(), before) and c.forced(64) == head  # the state is unchanged
    assert c.forced(64, head + ids(tok, "x")) == []  # the grammar rejects the prefix
    c.advance(head + value)
    assert c.forced(64) == after


def test_a_fixed_key_is_forced(tok, grammars):
    forced = grammars.constraint(ConstraintSpec("json_schema", A_INT)).forced(8)
    assert forced and '{"a": '.startswith(tok.decode(forced))


CASES = [("regex", r"[a-z]+@[a-z]+\.(com|org)", "ada@example.com", "ada@example.net"),
         ("choice", ["yes", "no", "maybe later"], "maybe later", "maybe"),
         ("grammar", ARITH_GBNF, "(1+2)*34-5", "(1+2*"),
         ("grammar", ARITH_LARK, "(1+2)*34-5", "1+"),
         ("json_object", None, '{"k": [1, {"z": null}], "s": "t"}', "[1, 2]"),
         ("json_schema", json.dumps(A_INT), '{"a": -3}', '{"a": 1, "b": 2}')]


def takes(c, tok, text: str) -> bool:
    """Whether the constraint takes text's tokens and then a stop id."""
    draft = ids(tok, text) + [tok.eos_token_id]
    return c.masks_along(draft).shape[0] == len(draft) + 1


@pytest.mark.parametrize("kind,value,valid,invalid", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_kind_takes_a_valid_output_and_refuses_an_invalid_one(tok, grammars, kind, value, valid, invalid):
    c = grammars.constraint(ConstraintSpec(kind, value))
    assert takes(c, tok, valid) and not takes(c, tok, invalid)
    assert c.masks_along(ids(tok, valid))[-1][tok.eos_token_id]  # the mask allows the stop it takes
    c.advance(ids(tok, valid) + [tok.eos_token_id])
    assert c.finished


BAD = [("json_schema", {"type": "nonsense"}, "nonsense"),
       ("json_schema", "{not json", "not valid JSON"),
       ("json_schema", ["a"], "must be a JSON object"),
       ("json_schema", {"type": "array", "uniqueItems": True}, "uniqueItems"),
       ("regex", "(ab", "unclosed group"),
       ("regex", "", "non-empty"),
       ("grammar", 'root ::= "a" foo', "foo"),
       ("grammar", "start: foo", "foo"),
       ("choice", [], "non-empty list"),
       ("choice", "yes", "non-empty list"),
       ("choice", ["a", 1], "must be a string"),
       ("json_object", {"type": "object"}, "takes no value"),
       ("xml", "<a/>", "unknown constraint kind 'xml'")]


@pytest.mark.parametrize("kind,value,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_spec_is_a_clear_specdec_error(grammars, kind, value, message):
    with pytest.raises(SpecdecError, match=message):
        grammars.constraint(ConstraintSpec(kind, value))


def test_bad_stop_ids_or_a_slow_tokenizer_are_clear_errors(tok):
    with pytest.raises(SpecdecError, match="stop ids"):
        Grammars.for_tokenizer(tok, len(tok), [])
    with pytest.raises(SpecdecError, match="stop ids"):
        Grammars.for_tokenizer(tok, len(tok), [len(tok)])
    with pytest.raises(SpecdecError, match="fast"):
        Grammars.for_tokenizer(object(), 10, [1])


def test_compiled_grammars_are_cached_least_recently_used_out(tok):
    g = Grammars.for_tokenizer(tok, len(tok), [tok.eos_token_id], cache_size=2)
    s1, s2, s3 = (ConstraintSpec("regex", r) for r in ("a+", "b+", "c+"))
    first = g.compile(s1)
    g.compile(s2)
    assert g.compile(s1) is first
    g.compile(s3)
    assert list(g.compiled) == [s1.key, s3.key]
    assert ConstraintSpec("json_schema", json.dumps(A_INT)) == ConstraintSpec("json_schema", A_INT)
    assert hash(ConstraintSpec("json_schema", json.dumps(A_INT))) == hash(ConstraintSpec("json_schema", A_INT))
    one, two = g.constraint(s1), g.constraint(s1)
    one.advance(ids(tok, "aaa"))
    assert torch.equal(two.allowed(), g.constraint(s1).allowed())


def test_a_model_vocabulary_smaller_than_the_tokenizers_cuts_the_mask(tok):
    g = Grammars.for_tokenizer(tok, len(tok) - 16, [tok.eos_token_id])
    c = g.constraint(ConstraintSpec("json_object"))
    tokens = ids(tok, '{"k": 1}')
    assert c.allowed().shape == (len(tok) - 16,) and c.masks_along(tokens).shape == (len(tokens) + 1, len(tok) - 16)
    assert c.masks_along([len(tok) - 8]).shape == (1, len(tok) - 16)


def test_llama_cpp_padding_entries_are_never_allowed():
    from tokenizers import Tokenizer, models
    vocab = {"a": 0, "b": 1, "[PAD2]": 2, "[PAD9]": 3, "c": 4}  # "[PAD9]" at id 3 is an ordinary token
    backend = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    assert padding_ids(backend) == [2]
    usable = usable_ids(backend, 8)
    assert usable.tolist() == [True, True, False, True, True, False, False, False]
    assert pack_bits(usable, 2).tolist() == [0b11011, 0]
