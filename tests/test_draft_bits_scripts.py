"""The draft-width scripts refuse bad arguments with one line, before loading any model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, args, says", [
    ("draft_bits_ab.py", ["--bits", "5"], "--bits takes widths among 3, 4 and 8"),
    ("draft_bits_ab.py", ["--bits", "x"], "--bits takes integers"),
    ("draft_bits_ab.py", ["--limit", "0"], "must be >= 1"),
    ("draft_bits_sim.py", ["--encodings", "q5"], "unknown encodings ['q5']"),
    ("draft_bits_sim.py", ["--encodings", "q4-rmse"], "unknown encodings ['q4-rmse']"),
    ("draft_bits_sim.py", ["--limit", "0"], "--limit must be >= 1"),
])
def test_bad_arguments_are_one_line_errors(script, args, says, tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                         timeout=120, env={"SPECDEC_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr
