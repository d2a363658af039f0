"""Head training data: truncated ShareGPT recovery, source specs, the eval-overlap guard, the corpus
plan and the draft vocabulary."""

from __future__ import annotations

import io
import json

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.training.corpus import build_plan, grown, load_plan, plan_or_resume
from specdec.training.data import Document, RecoveryCount, interleave, iter_json_array, open_source, source_files
from specdec.training.overlap import OverlapGuard, default_eval_texts
from specdec.training.vocab import DraftVocab, select_vocab, token_counts


def records(n: int) -> list[dict]:
    return [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"question {i} " * (i + 1)},
                                               {"from": "gpt", "value": f"answer {i} with \"quotes\" and ]"}]}
            for i in range(n)]


def truncated_json(n: int) -> str:
    text = json.dumps(records(n + 1), indent=2)
    last = text.rindex('"id": "r%d"' % n)
    return text[:last + 30]  # cut inside the last record


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_truncated_array_recovers_the_complete_records(chunk):
    count = RecoveryCount()
    got = list(iter_json_array(io.StringIO(truncated_json(5)), count, chunk=chunk))
    assert [r["id"] for r in got] == [f"r{i}" for i in range(5)]
    assert count.complete == 5 and count.truncated


def test_complete_array_is_not_marked_truncated():
    count = RecoveryCount()
    got = list(iter_json_array(io.StringIO(json.dumps(records(3))), count, chunk=5))
    assert len(got) == 3 and not count.truncated


def test_sharegpt_file_source_yields_conversations(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(truncated_json(4))
    count = RecoveryCount()
    docs = list(open_source(f"sharegpt:{path}", None, count))
    assert len(docs) == 4 and docs[0].id == "sharegpt:r0" and docs[0].messages[0][0] == "user"
    assert "question 0" in docs[0].text and "answer 0" in docs[0].text
    assert count.truncated


def test_missing_sources_are_clear_errors(tmp_path):
    with pytest.raises(SpecdecError, match="no such file"):
        open_source(f"sharegpt:{tmp_path / 'absent.json'}", None)
    with pytest.raises(SpecdecError, match="no such file"):
        source_files(str(tmp_path / "nothing-*.py"))
    (tmp_path / "a.py").write_text("x = 1\n")
    assert source_files(str(tmp_path)) == [tmp_path / "a.py"]


class WordTokenizer:
    """Ids by word, enough for planning."""

    def encode(self, text, add_special_tokens=False):
        return [hash(w) % 1000 for w in text.split()]


def test_overlap_guard_refuses_an_eval_prompt():
    texts, names = default_eval_texts()
    assert "specdec/data/code_prompts.jsonl" in names
    guard = OverlapGuard(texts)
    prompt = next(t for t in texts if len(t.split()) > 20)
    assert not guard.admit("Some preamble text here. " + prompt.upper() + " and more after.", "sharegpt")
    assert guard.admit("a perfectly ordinary sentence about gardening in the early spring with tomatoes", "sharegpt")
    assert guard.dropped == {"sharegpt": 1}


def test_plan_drops_overlapping_documents_and_holds_out_validation():
    guard = OverlapGuard(["the quick brown fox jumps over the lazy dog near the river bank today"])
    docs = [Document(f"d{i}", "code", " ".join(f"w{i}x{j}" for j in range(50))) for i in range(30)]
    docs.insert(3, Document("bad", "code", "so the quick brown fox jumps over the lazy dog near the river bank today ok"))
    plan = build_plan(iter(docs), WordTokenizer(), guard, 400, 100, 32, {})
    assert plan.stats["dropped_overlap"] == {"code": 1}
    assert plan.tokens("train") == 400 and plan.tokens("val") == 100
    assert all(len(c.tokens) <= 32 for c in plan.chunks)
    assert not any(c.id.startswith("bad") for c in plan.chunks)


def test_empty_corpus_is_a_clear_error():
    guard = OverlapGuard([])
    with pytest.raises(SpecdecError, match="corpus is empty"):
        build_plan(iter([Document("d", "code", "")]), WordTokenizer(), guard, 100, 10, 32, {})


def test_plan_resumes_only_with_the_same_settings(tmp_path):
    docs = [Document(f"d{i}", "code", " ".join(f"w{j}" for j in range(40))) for i in range(20)]
    make = lambda: build_plan(iter(docs), WordTokenizer(), OverlapGuard([]), 200, 40, 32, {"tokens": 200})  # noqa: E731
    first = plan_or_resume(tmp_path / "plan.json", {"tokens": 200}, make)
    again = plan_or_resume(tmp_path / "plan.json", {"tokens": 200}, lambda: pytest.fail("planned twice"))
    assert [c.tokens for c in again.chunks] == [c.tokens for c in first.chunks]
    with pytest.raises(SpecdecError, match="other settings"):
        plan_or_resume(tmp_path / "plan.json", {"tokens": 300}, make)


def test_a_plan_grows_to_a_larger_budget_keeping_its_chunks(tmp_path):
    docs = [Document(f"file:d{i}.py", "code", " ".join(f"w{j}" for j in range(40))) for i in range(20)]

    def make(tokens):
        return build_plan(iter(docs), WordTokenizer(), OverlapGuard([]), tokens, 40, 32, {"tokens": tokens})

    small = plan_or_resume(tmp_path / "plan.json", {"tokens": 200}, lambda: make(200))
    big = plan_or_resume(tmp_path / "plan.json", {"tokens": 500}, lambda: pytest.fail("planned anew"),
                         lambda previous: grown(previous, make(500)))
    assert [(c.id, c.split, c.tokens) for c in big.chunks[:len(small.chunks)]] == \
           [(c.id, c.split, c.tokens) for c in small.chunks]
    old_docs = {c.id.rpartition("#")[0] for c in small.chunks}
    added = big.chunks[len(small.chunks):]
    assert added and not {c.id.rpartition("#")[0] for c in added} & old_docs
    assert big.stats["train_tokens"] == big.tokens("train") > small.tokens("train")
    assert big.tokens("val") == small.tokens("val")
    assert big.stats["tokens_by_source"] == {"code": big.tokens("train") + big.tokens("val")}
    assert load_plan(tmp_path / "plan.json").settings == {"tokens": 500}
    with pytest.raises(SpecdecError, match="may only grow"):
        plan_or_resume(tmp_path / "plan.json", {"tokens": 300}, lambda: make(300), lambda p: grown(p, make(300)))
    with pytest.raises(SpecdecError, match="other settings \\(seq_len, tokens\\)"):
        plan_or_resume(tmp_path / "plan.json", {"tokens": 900, "seq_len": 16}, lambda: make(900),
                       lambda p: grown(p, make(900)))


def test_a_grown_plan_may_change_the_prompt_families_of_its_new_answers(tmp_path):
    docs = [Document(f"file:d{i}.py", "code", " ".join(f"w{j}" for j in range(40))) for i in range(20)]

    def make(tokens):
        return build_plan(iter(docs), WordTokenizer(), OverlapGuard([]), tokens, 40, 32, {"tokens": tokens})

    plan_or_resume(tmp_path / "plan.json", {"tokens": 200}, lambda: make(200))
    with pytest.raises(SpecdecError, match="other settings \\(self_prompts\\)"):  # nothing grows: nothing added
        plan_or_resume(tmp_path / "plan.json", {"tokens": 200, "self_prompts": "text"}, lambda: make(200),
                       lambda p: grown(p, make(200)))
    big = plan_or_resume(tmp_path / "plan.json", {"tokens": 500, "self_prompts": "text"}, lambda: make(500),
                         lambda p: grown(p, make(500)))
    assert big.tokens("train") > 200 and load_plan(tmp_path / "plan.json").settings["self_prompts"] == "text"


def conversation(cid, *turns):
    return Document(f"sharegpt:{cid}", "sharegpt", "", tuple(turns))


PROSE = ("The river rises in the hills and runs to the sea. " * 12).strip()


def test_text_requests_are_made_from_prose_answers_only():
    from specdec.training.tasks import PASSAGE_CHARS, TEXT_TEMPLATES, text_documents
    code = "```python\nprint(1)\n```\n" + PROSE
    convs = [conversation("c0", ("user", "What does it do?"), ("assistant", code)),  # code: none
             conversation("c1", ("user", "Short?"), ("assistant", "Yes.")),  # too short: none
             *[conversation(f"p{i}", ("user", f"Tell me about river {i}."), ("assistant", PROSE),
                            ("user", "And then?")) for i in range(40)],
             conversation("long", ("user", "x" * 400), ("assistant", PROSE * 3))]
    docs = list(text_documents(iter(convs)))
    assert len(docs) == 41 and all(d.source == "text" for d in docs)
    assert [d.id for d in docs] == [d.id for d in text_documents(iter(convs))]  # the same kinds every run
    kinds = {d.id.rpartition(":")[2] for d in docs}
    assert kinds == {"summary", "translate", "context", "followup"}
    for d in docs:
        kind = d.id.rpartition(":")[2]
        assert d.messages[-1][0] == "user"
        if kind == "followup":
            assert [r for r, _ in d.messages] == ["user", "assistant", "user"] and d.messages[2][1] == "And then?"
        else:
            assert d.messages == (("user", d.text),) and d.text.startswith(TEXT_TEMPLATES[kind].partition("{")[0])
    long = next(d for d in docs if d.id.startswith("text:sharegpt:long:"))
    assert long.id.rpartition(":")[2] in ("summary", "translate")  # its question is too long to ask
    passage = long.text.partition("\n\n")[2]
    assert PASSAGE_CHARS[0] <= len(passage) <= PASSAGE_CHARS[1] and passage.endswith(".")


def test_a_request_prompt_holds_all_its_turns_a_conversation_its_first():
    from specdec.training.extract import self_prompts

    class Words:  # no chat template: a prompt is its words' ids
        def encode(self, text, add_special_tokens=False):
            return [int(w[1:]) for w in text.split()]

    docs = [conversation("r0", ("user", "w1 w2"), ("assistant", "w3"), ("user", "w4")),
            Document("text:sharegpt:r0:followup", "text", "", (("user", "w1 w2"), ("assistant", "w3"), ("user", "w4"))),
            Document("text:sharegpt:r1:followup", "text", "", (("user", "w1"), ("assistant", "w3")))]  # no user turn last
    got = list(self_prompts(Words(), docs, 5, 10, OverlapGuard([]), set()))
    assert got == [("self:sharegpt:r0#0", [1, 2]), ("self:text:sharegpt:r0:followup#0", [1, 2, 3, 4])]


def test_interleave_takes_about_equal_text_from_each_source():
    big = [Document(f"b{i}", "code", "x" * 1000) for i in range(10)]
    small = [Document(f"s{i}", "sharegpt", "y" * 100) for i in range(200)]
    merged = list(interleave([iter(big), iter(small)]))
    assert len(merged) == 210 and merged[0].id == "b0"
    for n in (20, 60, 110):
        chars = {"code": 0, "sharegpt": 0}
        for d in merged[:n]:
            chars[d.source] += len(d.text)
        assert abs(chars["code"] - chars["sharegpt"]) <= 1000
    assert [d.id for d in merged if d.source == "sharegpt"] == [f"s{i}" for i in range(200)]


def test_vocab_takes_the_most_frequent_ids_and_the_end_tokens():
    counts = token_counts([[5, 5, 5, 7, 7, 1, 9], [7, 3]], vocab_size=12)
    vocab = select_vocab(counts, 3, always=[11])
    assert vocab.ids.tolist() == [5, 7, 11]
    assert (vocab.ids - vocab.d2t() == torch.arange(3)).all()
    assert vocab.t2d(12).nonzero().flatten().tolist() == [5, 7, 11]
    assert DraftVocab.from_d2t(vocab.d2t()).ids.tolist() == [5, 7, 11]
    assert vocab.target_to_draft(12)[[5, 7, 11, 0]].tolist() == [0, 1, 2, -1]
    assert select_vocab(counts, 12).size == 12


def test_vocab_larger_than_the_models_is_refused():
    with pytest.raises(SpecdecError, match="larger than the model's vocabulary"):
        select_vocab(torch.zeros(10, dtype=torch.int64), 11)


TASK_SOURCE = '''
def documented(a, b: int = 2) -> int:
    """Add b to a.

    More words that the request leaves out.
    """
    total = a + b
    return total


def undocumented(a):
    total = a * 2
    total += 1
    return total


def _private(a):
    """A private helper."""
    total = a * 2
    return total


class Box:
    def size(self) -> int:
        """The box's size."""
        width = self.width
        height = self.height
        return width * height
'''


def test_documented_functions_become_coding_requests(tmp_path):
    from specdec.training.tasks import TEMPLATES, task_documents
    (tmp_path / "mod.py").write_text(TASK_SOURCE)
    (tmp_path / "broken.py").write_text("def f(:\n")
    docs = list(task_documents(sorted(tmp_path.glob("*.py"))))
    assert [d.id.rpartition(":")[2] for d in docs] == ["documented", "size"]
    again = list(task_documents([tmp_path / "mod.py"]))
    assert [d.text for d in docs] == [d.text for d in again]  # the same template every run
    for doc in docs:
        assert doc.source == "task" and doc.messages == (("user", doc.text),)
        assert any(doc.text.startswith(t.partition("{")[0]) for t in TEMPLATES)
        assert "More words" not in doc.text or "```python" in doc.text


def test_a_request_without_the_docstring_keeps_the_code():
    import ast
    from specdec.training.tasks import bare_code, function_task
    node = ast.parse(TASK_SOURCE).body[0]
    assert bare_code(node) == "def documented(a, b=2):\n    total = a + b\n    return total"
    doc = function_task(__import__("pathlib").Path("m.py"), node, TASK_SOURCE.splitlines())
    assert doc is not None and "documented" in doc.text


def test_take_turns_alternates_until_every_stream_ends():
    from specdec.training.data import take_turns
    doc = lambda name: Document(name, "x", name)  # noqa: E731
    got = [d.id for d in take_turns([iter([doc("a1"), doc("a2"), doc("a3")]), iter([doc("b1")])])]
    assert got == ["a1", "b1", "a2", "a3"]
