"""The layers contract (.importlinter): imports point down, model -> sampling/constraints (and the heads'
networks) -> drafters -> policy -> engine -> server/bench/training/cli, checked by import-linter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"  # the venv's, from the dev extra


def test_imports_follow_the_layers_contract():
    assert LINT_IMPORTS.is_file(), f"no {LINT_IMPORTS}: install the dev extra (pip install -e '.[dev]')"
    proc = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", str(ROOT / ".importlinter")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"lint-imports found imports against the layers:\n{proc.stdout}\n{proc.stderr}"
