"""Flags end at the edge: each command's flags are exactly the fields of the settings it builds,
with the same defaults, validated on construction; nothing below the CLI reads a namespace."""

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from specdec.cli import build_parser
from specdec.config import SamplingParams
from specdec.errors import SpecdecError
from specdec.flags import serve_settings, settings
from specdec.settings import (BenchSettings, DraftingSettings, LoadtestSettings, ModelSettings, RaySettings,
                              ServeSettings)

PACKAGE = Path(__file__).parents[1] / "specdec"
# command -> (the settings its flags become, the flags it keeps for itself)
COMMANDS = {
    # generate's structure flags become a ConstraintSpec (flags.structure_of); --chat and --infill say how
    # the prompt is read
    "generate": ((ModelSettings, DraftingSettings, SamplingParams), {"max_new_tokens", "chat", "infill", "json",
                                                                      "prompt", "json_schema", "json_object", "regex",
                                                                      "grammar", "choice"}),
    "serve": ((ModelSettings, DraftingSettings, ServeSettings, RaySettings), set()),
    "bench": ((ModelSettings, BenchSettings), set()),
    "loadtest": ((ModelSettings, LoadtestSettings), set()),
}


def subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def flag_defaults(command: str) -> dict:
    return {a.dest: a.default for a in subparser(command)._actions if a.dest != "help"}


def drafter_flags(command: str) -> set[str]:
    """The dests of the drafters' own flags (each Entry.flags) and of their switches, as `command` has them;
    each entry's settings from those flags' defaults are its settings' defaults."""
    from specdec.drafters import registry
    fields = {f.name for cls in COMMANDS[command][0] for f in dataclasses.fields(cls)}
    defaults, dests = flag_defaults(command), set()
    for entry in registry.entries():
        if entry.flags and "drafters" in fields:
            p = argparse.ArgumentParser()
            entry.flags(p)
            dests |= {a.dest for a in p._actions if a.dest != "help"}
            assert entry.from_flags(defaults) == entry.settings(), f"{entry.name}: flag defaults differ from its settings'"
        if entry.switch and "switches" in fields:
            dests.add(entry.name.replace("-", "_"))
    return dests


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_flag_is_one_settings_field_with_the_same_default(command):
    classes, own = COMMANDS[command]
    defaults = flag_defaults(command)
    owners: dict[str, list] = {}
    own = own | drafter_flags(command)
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.name in ("drafters", "switches"):  # filled from the drafters' own flags (drafter_flags)
                continue
            if f.name == "infill_vocab":  # the server's, for llama-server's infill sampler: no flag names it
                continue
            owners.setdefault(f.name, []).append(cls.__name__)
            assert f.name in defaults, f"{cls.__name__}.{f.name} has no flag in `specdec {command}`"
            assert defaults[f.name] == f.default, f"--{f.name.replace('_', '-')}: flag default {defaults[f.name]!r}, " \
                                                  f"{cls.__name__} default {f.default!r}"
    assert not {n: c for n, c in owners.items() if len(c) > 1}, "a flag feeds two settings"
    assert set(defaults) == set(owners) | own, "flags that no settings field takes"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_default_flags_build_valid_settings(command):
    extra = ["hi"] if command == "generate" else []
    args = build_parser().parse_args([command, *extra])
    for cls in COMMANDS[command][0]:
        made = settings(cls, args)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, dataclasses.fields(cls)[0].name, None)


@pytest.mark.parametrize("argv, message", [
    (["--max-context", "0"], "--max-context must be >= 1"),
    (["--k", "0"], "--k must be >= 1"),
    (["--ngram", "--suffix"], "choose one drafting method"),
    (["--datastore", "x.bin"], "add --suffix"),
    (["--ngram-max", "0"], "n-gram sizes need 1 <= min_n <= max_n"),
    (["--ngram", "--ngram-min", "3", "--ngram-max", "2"], "n-gram sizes need 1 <= min_n <= max_n"),
    (["--suffix-cache-tokens", "-1"], "cache_tokens >= 0"),
    (["--lookahead-window", "0"], "lookahead needs window >= 1"),
    (["--tree-budget", "8"], "need a draft model"),
    (["--layer-skip", "4", "--tree-budget", "8"], "drafts chains"),
    (["--draft-p-min", "1.5"], "p_min must be in"),
    (["--draft-window", "-1"], "--draft-window must be >= 0"),
    (["--max-batch", "0"], "--max-batch must be >= 1"),
    (["--k-schedule", "1-4"], "k schedule"),
    (["--memory-budget-gb", "0"], "--memory-budget-gb must be > 0"),
    (["--ray", "--replicas", "2", "--autoscale", "1:3"], "not both"),
    (["--ray", "--autoscale", "3:1"], "1 <= MIN <= MAX"),
    (["--ray", "--cpus-per-replica", "0"], "--cpus-per-replica must be > 0"),
    (["--max-body-bytes", "0"], "--max-body-bytes must be >= 1"),
    (["--max-stop-length", "0"], "--max-stop-length must be >= 1"),
    (["--max-messages", "0"], "--max-messages must be >= 1"),
    (["--api-key", ""], "must be non-empty printable ASCII without spaces"),
    (["--api-key", "two words"], "must be non-empty printable ASCII without spaces"),
    (["--api-key", "clé"], "must be non-empty printable ASCII without spaces"),
    (["--api-key", "tab\there"], "must be non-empty printable ASCII without spaces"),
    (["--api-key-protects-stats"], "--api-key-protects-stats needs an API key"),
])
def test_bad_serve_values_are_clear_errors_before_anything_loads(argv, message, monkeypatch):
    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    args = build_parser().parse_args(["serve", "--model", "/nonexistent", *argv])
    with pytest.raises(SpecdecError, match=re.escape(message)):
        serve_settings(args)


def test_the_api_key_comes_from_the_flag_or_the_environment_and_never_shows(monkeypatch):
    def key(*argv):
        return serve_settings(build_parser().parse_args(["serve", *argv]))[2].api_key
    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    assert key() is None and key("--api-key", "k1") == "k1"
    monkeypatch.setenv("SPECDEC_API_KEY", "")
    assert key() is None
    monkeypatch.setenv("SPECDEC_API_KEY", "k2")
    assert key() == "k2" and key("--api-key", "k1") == "k1"
    srv = serve_settings(build_parser().parse_args(["serve", "--api-key-protects-stats"]))[2]
    assert srv.access().protects_stats and srv.access().needs_key("/stats")
    assert "k2" not in repr(srv) and "k2" not in repr(srv.access())


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--draft-vocab", "-1"], "--draft-vocab must be >= 0"),
    (["--lookahead-ngram", "1"], "lookahead needs"),
])
def test_bad_bench_values_are_clear_errors(argv, message):
    args = build_parser().parse_args(["bench", *argv])
    with pytest.raises(SpecdecError, match=re.escape(message)):
        settings(BenchSettings, args)


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "0,2"], "--concurrency needs positive integers"),
    (["--modes", "off,fast"], "unknown mode(s) ['fast']"),
    (["--draft", "D", "--ngram"], "choose one drafter"),
])
def test_bad_loadtest_values_are_clear_errors(argv, message):
    args = build_parser().parse_args(["loadtest", *argv])
    with pytest.raises(SpecdecError, match=re.escape(message)):
        settings(LoadtestSettings, args)


def test_the_drafting_method_follows_the_flags():
    assert DraftingSettings().method == "none"
    assert DraftingSettings(draft="none").method == "none"
    assert DraftingSettings(draft="D").method == "draft"
    assert DraftingSettings(draft="D", switches=frozenset({"--ngram"})).method == "hybrid"
    assert DraftingSettings(head="auto").method == "head"
    assert DraftingSettings(layer_skip="4").method == "layer-skip"
    assert DraftingSettings(draft="D", tree_budget=8).tree_config().budget == 8
    assert DraftingSettings(head="h", tree_choices="[[0],[1],[0,0]]").tree_config().choices == ((0,), (1,), (0, 0))


def test_no_module_below_the_cli_reads_an_argparse_namespace():
    edge = {PACKAGE / "cli.py", PACKAGE / "flags.py", PACKAGE / "training" / "cli.py"}
    readers = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if p not in edge and re.search(r"\bargparse\b|\bargs\.\w+|\(args\)|vars\(args\)", p.read_text())]
    assert readers == []
