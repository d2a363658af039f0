"""llama.cpp's llama-server as the bench's peer, where a build is at hand (`scripts/llama_cpp.sh build`)."""

import json

import pytest

from specdec.bench.llama_server import find_binary
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.model.registry import is_present


def _binary():
    try:
        return find_binary()
    except SpecdecError:
        return None


pytestmark = [
    pytest.mark.skipif(_binary() is None, reason="no llama-server build (scripts/llama_cpp.sh build)"),
    pytest.mark.skipif(not is_present("smollm2-135m-instruct"), reason="smollm2-135m-instruct is not installed"),
]


def test_llama_methods_run_side_by_side_with_ours(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "--model", "smollm2-135m-instruct", "--draft", "smollm2-135m-instruct", "--methods",
               "plain,llama,llama-spec,llama-spec:1,llama-spec:3@0.5,llama-lookup:2", "--limit", "1", "--max-new-tokens", "24",
               "--no-plots", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    methods = summary["methods"]
    info = summary["config"]["llama_cpp"]
    assert "commit" in info["version"] and info["threads"] >= 1 and info["system_info"]
    for label in ("llama", "llama-spec", "llama-spec:3@0.5", "llama-lookup:2"):
        assert methods[label]["new_tokens"] > 0 and methods[label]["tokens_per_second_total"] > 0
    # its speculation drafts with the target's own file: nearly every draft passes, and greedy output stays its own
    assert methods["llama-spec:3@0.5"]["drafted"] > 0 and methods["llama-spec:3@0.5"]["alpha"] > 0.5
    assert methods["llama-spec"]["greedy_mismatches"] == [] and methods["llama-spec"]["speedup_vs_own_plain_mean"] > 0
    # a pinned length reaches the server (its flags, not the request): one draft token per step at most, so at
    # most one drafted token per two generated (its draft is its own target: nearly every draft passes)
    one = methods["llama-spec:1"]
    assert 0 < one["drafted"] <= one["new_tokens"] // 2 + one["prompts"]
    assert (out / "llama-server-spec-k1.log").is_file()
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert all(r["error"] is None for r in records)
