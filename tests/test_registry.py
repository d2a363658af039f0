"""Drafters by name: a new drafter is one class and its registration; aliases resolve; the wiring
never picks a drafter by comparing method names."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from specdec.drafters import registry
from specdec.drafters.base import BaseDrafter
from specdec.errors import SpecdecError
from specdec.tree import DraftTree
from tests.test_cli import cli_error

ROOT = Path(__file__).resolve().parent.parent
WIRING = ["specdec/runner.py", "specdec/server/__init__.py", "specdec/bench/compare.py", "specdec/bench/records.py",
          "specdec/settings.py", "specdec/engine/build.py", "specdec/engine/policy_build.py", "specdec/cli.py",
          "specdec/flags.py"]


class RepeatDrafter(BaseDrafter):
    """A toy drafter: proposes the last committed token k times (deterministic, so q is None)."""

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, state):
        return DraftTree.chain(torch.tensor(state.tokens[-1:] * state.k), None)


@pytest.fixture
def toy():
    registry.register(registry.Entry("repeat", lambda parts, options, note: RepeatDrafter()))
    yield "repeat"
    registry.unregister("repeat")


def generate_json(argv, capsys) -> dict:
    from specdec.cli import main
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_a_registered_toy_drafter_runs_in_generate_and_bench(toy, tiny_llama_dir, tmp_path, capsys):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "12", "--json", "--policy", "fixed",
            "w1 w2 w1 w2 w1"]
    plain = generate_json(base[:1] + ["--draft", "none"] + base[1:], capsys)
    got = generate_json(base[:1] + ["--drafter", toy] + base[1:], capsys)
    assert got["text"] == plain["text"] and got["method"] == "repeat k=4"
    assert got["stats"]["drafted"] > 0
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "s", "category": "qa", "prompt": "w5 w6 w5 w6 w5 w6"}) + "\n")
    from specdec.cli import main
    assert main(["bench", "--model", str(tiny_llama_dir), "--methods", f"plain,{toy}", "--k", "3", "--dataset",
                 str(data), "--max-new-tokens", "8", "--no-plots", "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["methods"][toy]["greedy_mismatches"] == []


def test_cli_and_bench_names_resolve_to_one_entry():
    m = registry.method
    assert m("plain").entry is m("none").entry and not m("none").entry.drafts
    assert m("eagle").entry is m("head").entry and m("medusa").head_kind == "medusa"
    assert m("eagle-hybrid").entry is m("head-hybrid").entry
    assert m("tree").entry is m("draft").entry and m("tree").tree_sizes and not m("draft").tree_sizes
    assert m("layer-skip").entry.layers and m("hybrid").entry.draft_model
    with pytest.raises(SpecdecError, match="unknown drafting method 'telepathy'"):
        m("telepathy")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.Entry("ngram", lambda parts, options, note: None))


def test_an_unknown_drafter_flag_is_a_clear_error(tiny_llama_dir, capsys):
    assert "unknown drafting method" in cli_error(["generate", "--model", str(tiny_llama_dir), "--drafter", "nope",
                                                   "hi"], capsys)


def compared_names(path: Path) -> list[str]:
    """String constants that are drafter names, inside comparisons (==, !=, in, not in) in a source file."""
    names, found = set(registry.names()), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [f"{path.name}:{node.lineno}: {v.value!r}" for v in values
                          if isinstance(v, ast.Constant) and v.value in names]
    return found


@pytest.mark.parametrize("name", WIRING)
def test_the_wiring_never_compares_against_a_drafter_name(name):
    assert compared_names(ROOT / name) == []


def test_the_name_check_catches_a_comparison(tmp_path):
    source = tmp_path / "x.py"
    source.write_text('if method == "ngram" or kind in ("tree", "hf"):\n    pass\n')
    assert compared_names(source) == ["x.py:1: 'ngram'", "x.py:1: 'tree'"]
