"""The docs a user reads stay true: the README's quick start parses, docs/cli.md is the parsers',
docs/performance.md is what `make results` builds from the committed summaries, and every extracted
summary's rows are its raw run's numbers."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from specdec.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import make_cli_docs  # noqa: E402
import make_iq_grids  # noqa: E402
import make_results  # noqa: E402

README = (ROOT / "README.md").read_text()


def quick_start() -> list[str]:
    block = re.search(r"## Quick start\n\n```bash\n(.*?)```", README, re.S)
    assert block, "the README has a '## Quick start' bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_is_short_and_its_quick_start_has_five_lines():
    assert len(README.splitlines()) <= 150
    assert len(quick_start()) == 5


@pytest.mark.parametrize("line", quick_start())
def test_every_quick_start_command_parses(line):
    argv = shlex.split(line)
    assert argv[0] == "specdec"
    build_parser().parse_args(argv[1:])


def test_cli_md_matches_the_parsers():
    assert (ROOT / "docs" / "cli.md").read_text() == make_cli_docs.render(), "run `make docs`"


def test_the_iq3_s_codebook_header_is_gguf_pys():
    assert make_iq_grids.HEADER.read_text() == make_iq_grids.text(), "run python scripts/make_iq_grids.py"


def test_make_results_reproduces_performance_md():
    page = make_results.render(make_results.load_summaries())
    assert (ROOT / "docs" / "performance.md").read_text() == page, "run `make results`"


SUMMARIES = make_results.load_summaries()


@pytest.mark.parametrize("name,summary", SUMMARIES, ids=[name for name, _ in SUMMARIES])
def test_every_summary_names_its_command_and_its_rows_match_the_raw_run(name, summary):
    assert summary["command"].strip() and summary["rows"]
    assert summary.get("cpu"), f"{name} names no CPU"
    if "extract" in summary:
        assert summary["rows"] == make_results.extracted_rows(summary), f"run make_results.py extract on {name}"


def test_memory_startup_rows_have_the_shared_fields():
    rows = json.loads((ROOT / "docs" / "results" / "memory-startup.json").read_text())["rows"]
    for row in rows:
        assert {"setup", "peak_rss_gb", "start_to_first_token_s", "disk_gb"} <= set(row)


def test_the_page_is_one_hosts_short_page():
    assert len((ROOT / "docs" / "performance.md").read_text().splitlines()) <= 400


def test_the_page_renders_a_new_summary_without_code_changes(tmp_path):
    (tmp_path / "new-table.json").write_text(json.dumps(
        {"command": "specdec bench --methods plain", "rows": [{"method": "plain", "tok/s": 1.5}]}))
    page = make_results.render(make_results.load_summaries(tmp_path))
    assert "### new-table" in page and "| plain | 1.5 |" in page and "specdec bench --methods plain" in page


SESSION, ISSUE = "sess" + "ion", "iss" + "ue"  # spelled apart, so that this file does not match itself
HISTORY = re.compile(rf"{SESSION} [0-9]+|{ISSUE} [0-9]+|_this_{SESSION}|{SESSION}s? [0-9]", re.I)


def test_the_docs_and_scripts_speak_only_of_the_project_itself():
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "results").glob("*.json"),
             *(ROOT / "scripts").rglob("*.*")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in paths if p.is_file()
             for m in HISTORY.finditer(p.read_text(errors="replace"))]
    assert not found
