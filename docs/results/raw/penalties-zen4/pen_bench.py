"""specdec bench with every method's sampling under the penalties named in SPECDEC_PENALTIES (JSON of
SamplingParams fields), e.g. '{"repetition_penalty": 1.1}'; plain decoding gets the same, so the
greedy-mismatch column compares like with like."""
import functools, json, os, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import specdec.bench.compare as compare
from specdec.config import SamplingParams
extra = json.loads(os.environ.get("SPECDEC_PENALTIES", "{}"))
extra["logit_bias"] = tuple(tuple(p) for p in extra.get("logit_bias", ()))
compare.SamplingParams = functools.partial(SamplingParams, **extra)
from specdec.cli import main
sys.exit(main())
