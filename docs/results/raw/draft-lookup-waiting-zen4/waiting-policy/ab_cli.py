"""specdec CLI with one extra bench method, 'draftold': the draft model waiting plain (no lookup while it waits)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[5]))  # the repository root
from specdec.drafters.registry import register, Entry
from specdec.drafters.cross_tokenizer import build_draft
register(Entry("draftold", build_draft, lambda p, o, d: f"draft {o.draft} waiting plain", draft_model=True,
               chain_theory=True))
from specdec.cli import main
sys.exit(main())
