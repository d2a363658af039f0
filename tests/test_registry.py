"""Drafters by name: a new drafter is one class and its registration; aliases resolve; the wiring
never picks a drafter by comparing method names."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch

from specdec.drafters import registry
from specdec.errors import SpecdecError
from tests.test_cli import cli_error

ROOT = Path(__file__).resolve().parent.parent
# the wiring: every module that builds, runs, prices, serves or reports drafters (outside specdec/drafters/,
# and outside the heads and training, whose 'eagle' and 'medusa' are head kinds); whole packages by glob,
# so a module added to one is checked too
WIRING_PACKAGES = ["specdec/engine", "specdec/policy", "specdec/server", "specdec/bench"]
WIRING_MODULES = ["specdec/runner.py", "specdec/settings.py", "specdec/cli.py", "specdec/flags.py",
                  "specdec/tune_layer_skip.py", "specdec/metrics.py", "specdec/config.py"]
NOT_WIRING = {  # modules in those packages whose strings only look like drafter names
    "specdec/bench/llama_server.py": "llama-server's own modes (plain, spec, lookup)",
    "specdec/server/protocol.py": "OpenAI's tool_choice 'none'",
    "specdec/server/anthropic_api.py": "Anthropic's tool_choice type 'none'",
    "specdec/server/responses_api.py": "the Responses API's tool_choice 'none'",
}
WIRING = sorted({p.relative_to(ROOT).as_posix() for d in WIRING_PACKAGES for p in (ROOT / d).rglob("*.py")}
                - set(NOT_WIRING)) + [m for m in WIRING_MODULES if (ROOT / m).is_file()]


TOY_MODULE = '''"""A toy drafter in a module of its own: proposes the last committed token (k times, or --repeat-times)."""
from dataclasses import dataclass

import torch

from specdec.drafters.base import BaseDrafter
from specdec.drafters.registry import Entry
from specdec.errors import SpecdecError
from specdec.tree import DraftTree


@dataclass(frozen=True)
class RepeatConfig:
    times: int = 0  # 0: k copies

    def __post_init__(self):
        if self.times < 0:
            raise SpecdecError(f"--repeat-times must be >= 0, got {self.times}")


class RepeatDrafter(BaseDrafter):
    def __init__(self, times: int):
        self.times = times

    def start(self, prompt):
        pass

    def propose(self, state):
        n = min(state.k, self.times) if self.times else state.k
        return DraftTree.chain(torch.tensor(state.tokens[-1:] * n), None)


def add_flags(p):
    p.add_argument("--repeat-times", type=int, default=0, help="repeat: copies proposed (0 = k)")


DRAFTERS = [(Entry("repeat", lambda parts, options, note: RepeatDrafter(options.of("repeat").times),
                   settings=RepeatConfig, flags=add_flags, from_flags=lambda v: RepeatConfig(v["repeat_times"]),
                   switch="draft by repeating the last token"), {"echo": {}})]
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A new drafter as one new file: a module on the drafters package's path, found by the registry
    with its flag, its settings and its switch (the shipped drafters are found again beside it)."""
    import specdec.drafters as package
    (tmp_path / "repeat_toy.py").write_text(TOY_MODULE)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_METHODS", {})
    monkeypatch.setattr(registry, "_FOUND", False)
    yield "repeat"
    sys.modules.pop("specdec.drafters.repeat_toy", None)


def generate_json(argv, capsys) -> dict:
    from specdec.cli import main
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_a_drafter_in_a_new_file_runs_in_generate_and_bench_with_its_own_flags(toy, tiny_llama_dir, tmp_path, capsys):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "12", "--json", "--policy", "fixed",
            "w1 w2 w1 w2 w1"]
    plain = generate_json(base[:1] + ["--draft", "none"] + base[1:], capsys)
    got = generate_json(base[:1] + ["--drafter", toy] + base[1:], capsys)
    assert got["text"] == plain["text"] and got["method"] == "repeat k=4"
    assert got["stats"]["drafted"] > 0
    two = generate_json(base[:1] + ["--repeat", "--repeat-times", "2"] + base[1:], capsys)  # its switch and flag
    assert two["text"] == plain["text"] and two["method"] == "repeat k=4"
    assert 0 < two["stats"]["drafted"] <= 2 * got["stats"]["steps"] and two["stats"]["drafted"] < got["stats"]["drafted"]
    assert "--repeat-times must be >= 0" in cli_error(base[:1] + ["--repeat", "--repeat-times", "-1"] + base[1:], capsys)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "s", "category": "qa", "prompt": "w5 w6 w5 w6 w5 w6"}) + "\n")
    from specdec.cli import main
    assert main(["bench", "--model", str(tiny_llama_dir), "--methods", "plain,echo", "--k", "3", "--repeat-times", "1",
                 "--dataset", str(data), "--max-new-tokens", "8", "--no-plots", "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["methods"]["echo"]["greedy_mismatches"] == []


def test_every_shipped_drafter_is_declared_beside_its_class():
    """The registry holds no table: each entry comes from its drafter's module."""
    for entry in registry.entries():
        assert entry.build.__module__.startswith("specdec.drafters.") and entry.build.__module__ != registry.__name__


def test_a_drafter_s_settings_flag_without_its_switch_is_refused(tiny_llama_dir, capsys):
    assert "--datastore is read by the suffix drafter; add --suffix" in cli_error(
        ["generate", "--model", str(tiny_llama_dir), "--datastore", "x.ds", "hi"], capsys)


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
