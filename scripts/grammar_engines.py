"""Which grammar engine should specdec's constraints run on? xgrammar, llguidance and outlines-core,
side by side on this CPU with a real tokenizer (Qwen2.5-Coder's, 151,665 tokens in a 151,936-row
vocabulary): the tokenizer set-up time; per case the compile time; the time to compute the allowed-token
mask at each position while walking a valid instance's tokens (median and p95, microseconds); and
coverage: does the case compile, are the valid instance's tokens (then a stop id) accepted, is the
invalid instance rejected (some token or the final stop masked out). Cases: a dozen JSON Schemas
(required/optional, enum, anyOf, nested arrays of objects, $ref/$defs with recursion, date-time and
email formats, pattern, min/max length, integer/number bounds, additionalProperties false, array
lengths), any JSON object, a regex, a choice and a grammar (GBNF as llama.cpp writes it; llguidance
reads it through its gbnf_to_lark). Prints JSON.

Usage: python scripts/grammar_engines.py [--model PATH.gguf] [--engines xgrammar,llguidance,outlines,specdec] \
    [--repeat 3] > docs/results/raw/grammar-engines.json

The peers are not specdec's dependencies: `pip install --no-deps xgrammar apache-tvm-ffi outlines-core`
(--no-deps: xgrammar asks for triton, which the CPU build does not need); a missing one is skipped.
"specdec" is specdec.constraints itself (the chosen engine, llguidance, as the engine calls it): the
full cost of each mask, the bool [vocab] tensor included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.host import cpu_name  # noqa: E402
from specdec.constraints.vocab import PADDING, backend_of  # noqa: E402
from specdec.model.byte_bpe import byte_alphabet  # noqa: E402
from specdec.model.tokenizer import load_tokenizer  # noqa: E402

VOCAB_SIZE = 151936  # Qwen2.5's logits rows
OBJ = {"type": "object"}


def schema(properties: dict, required: list[str], **extra) -> dict:
    return {**OBJ, "properties": properties, "required": required, **extra}


POINT = schema({"x": {"type": "number"}, "y": {"type": "number"}}, ["x", "y"])
NODE = schema({"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
              ["value"])
ITEM = schema({"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}, ["id", "tags"])
ARITH_GBNF = r'''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
'''

# (name, kind, value, valid text, invalid text)
CASES = [
    ("required-optional", "json_schema", schema({"name": {"type": "string"}, "age": {"type": "integer"},
                                                 "nick": {"type": "string"}}, ["name", "age"]),
     {"name": "Ada", "age": 36}, {"name": "Ada"}),
    ("enum", "json_schema", schema({"color": {"enum": ["red", "green", "blue"]}}, ["color"]),
     {"color": "green"}, {"color": "purple"}),
    ("anyOf", "json_schema", {"anyOf": [{"type": "integer"}, schema({"x": {"type": "string"}}, ["x"])]},
     {"x": "hi"}, "hi"),
    ("nested-arrays-of-objects", "json_schema", schema({"items": {"type": "array", "items": ITEM}}, ["items"]),
     {"items": [{"id": 1, "tags": ["a", "b"]}, {"id": 2, "tags": []}]}, {"items": [{"id": "one", "tags": []}]}),
    ("ref-defs", "json_schema", {"$defs": {"point": POINT}, **schema(
        {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}}, ["a", "b"])},
     {"a": {"x": 1, "y": 2.5}, "b": {"x": -3, "y": 0}}, {"a": {"x": 1}, "b": {"x": 1, "y": 2}}),
    ("ref-recursive", "json_schema", {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
     {"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}, {"value": 1, "children": [{"v": 2}]}),
    ("formats", "json_schema", schema({"when": {"type": "string", "format": "date-time"},
                                       "email": {"type": "string", "format": "email"}}, ["when", "email"]),
     {"when": "2024-05-01T12:30:00Z", "email": "ada@example.com"}, {"when": "yesterday", "email": "ada@example.com"}),
    ("pattern", "json_schema", schema({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}, ["code"]),
     {"code": "ABC-1234"}, {"code": "abc-1234"}),
    ("min-max-length", "json_schema", schema({"s": {"type": "string", "minLength": 3, "maxLength": 5}}, ["s"]),
     {"s": "abcd"}, {"s": "abcdefg"}),
    ("number-bounds", "json_schema", schema({"n": {"type": "integer", "minimum": 1, "maximum": 10},
                                             "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
                                            ["n", "x"]),
     {"n": 7, "x": 0.5}, {"n": 11, "x": 0.5}),
    ("additional-properties-false", "json_schema", schema({"a": {"type": "integer"}}, ["a"],
                                                          additionalProperties=False),
     {"a": 1}, {"a": 1, "b": 2}),
    ("array-min-max-items", "json_schema", {"type": "array", "items": {"type": "integer"}, "minItems": 2,
                                            "maxItems": 3}, [1, 2], [1]),
    ("allOf", "json_schema", {"allOf": [schema({"a": {"type": "integer"}}, ["a"]),
                                        schema({"b": {"type": "integer"}}, ["b"])]}, {"a": 1, "b": 2}, {"a": 1}),
    ("oneOf", "json_schema", {"oneOf": [{"type": "string"}, {"type": "integer"}]}, 5, [5]),
    ("const", "json_schema", schema({"v": {"const": "fixed"}}, ["v"]), {"v": "fixed"}, {"v": "other"}),
    ("formats-date-uuid", "json_schema", schema({"day": {"type": "string", "format": "date"},
                                                 "id": {"type": "string", "format": "uuid"}}, ["day", "id"]),
     {"day": "2024-05-01", "id": "123e4567-e89b-12d3-a456-426614174000"}, {"day": "2024-05-01", "id": "nope"}),
    ("additional-properties-schema", "json_schema", {**OBJ, "additionalProperties": {"type": "integer"}},
     {"x": 1, "y": 2}, {"x": "s"}),
    ("multipleOf", "json_schema", {"type": "integer", "multipleOf": 5}, 15, 7),
    ("uniqueItems", "json_schema", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     [1, 2], [1, 1]),
    ("if-then-else", "json_schema", {**OBJ, "if": schema({"k": {"const": "a"}}, ["k"]),
                                     "then": {"required": ["n"]}}, {"k": "a", "n": 1}, {"k": "a"}),
    ("json-object", "json_object", None, {"k": [1, {"z": None}], "s": "t"}, [1, 2]),
    ("regex", "regex", r"[a-z]+@[a-z]+\.(com|org)", "ada@example.com", "ada@example.net"),
    ("choice", "choice", ["yes", "no", "maybe later"], "maybe later", "maybe"),
    ("grammar-gbnf", "grammar", ARITH_GBNF, "(1+2)*34-5", "(1+2*"),
]


def token_bytes(tok) -> list[bytes]:
    """Every id's bytes (GPT-2's byte alphabet undone); b"" for control tokens and "[PAD<id>]" padding,
    which xgrammar and outlines then never allow."""
    backend, table = backend_of(tok), {c: b for b, c in byte_alphabet().items()}
    added = backend.get_added_tokens_decoder()
    out = [b""] * backend.get_vocab_size(with_added_tokens=True)
    for piece, i in backend.get_vocab(with_added_tokens=True).items():
        if i in added:
            out[i] = b"" if added[i].special else piece.encode("utf-8")
        elif not PADDING.fullmatch(piece):
            out[i] = bytes(table[c] for c in piece) if all(c in table for c in piece) else piece.encode("utf-8")
    return out


def text_of(kind: str, instance) -> str:
    return json.dumps(instance) if kind in ("json_schema", "json_object") else instance


def choice_regex(options: list[str]) -> str:
    return "(" + "|".join(re.sub(r"([\\.^$|?*+()\[\]{}/-])", r"\\\1", o) for o in options) + ")"


def bit(mask: torch.Tensor, token: int) -> bool:  # mask: [words] int32, or [vocab] bool
    if mask.dtype == torch.bool:
        return bool(mask[token])
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


class XGrammar:
    def __init__(self, tok, stops: list[int]):
        import xgrammar as xgr
        self.xgr, self.stops = xgr, stops
        pieces = token_bytes(tok)
        info = xgr.TokenizerInfo(pieces + [b""] * (VOCAB_SIZE - len(pieces)), xgr.VocabType.RAW,
                                 vocab_size=VOCAB_SIZE, stop_token_ids=stops)
        self.compiler = xgr.GrammarCompiler(info, max_threads=os.cpu_count() or 1, cache_enabled=False)
        self.mask = xgr.allocate_token_bitmask(1, VOCAB_SIZE)

    def compile(self, kind, value):
        c = self.compiler
        return {"json_schema": lambda: c.compile_json_schema(value), "json_object": lambda: c.compile_json_schema(OBJ),
                "regex": lambda: c.compile_regex(value), "choice": lambda: c.compile_regex(choice_regex(value)),
                "grammar": lambda: c.compile_grammar(value)}[kind]()

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m) -> torch.Tensor:
        m.fill_next_token_bitmask(self.mask)
        return self.mask[0]

    def consume(self, m, token) -> bool:
        return m.accept_token(token)


class LLGuidance:
    def __init__(self, tok, stops: list[int]):
        import llguidance as llg
        self.llg = llg
        self.tokenizer = llg.LLTokenizer(backend_of(tok).to_str(), n_vocab=VOCAB_SIZE, eos_token=stops)
        self.mask = torch.zeros((VOCAB_SIZE + 31) // 32, dtype=torch.int32)

    def grammar(self, kind, value) -> str:
        text = {"json_object": json.dumps(OBJ), "choice": value}.get(kind, value)
        return self.llg.grammar_from({"json_schema": "json_schema", "json_object": "json_schema"}.get(kind, kind), text)

    def compile(self, kind, value):
        m = self.llg.LLMatcher(self.tokenizer, self.grammar(kind, value), log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def matcher(self, compiled):
        return compiled.deep_copy()

    def fill(self, m) -> torch.Tensor:
        m.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.mask.numel() * 4)
        return self.mask

    def consume(self, m, token) -> bool:
        return m.consume_token(token)


class Outlines:
    def __init__(self, tok, stops: list[int]):
        import outlines_core as oc
        self.oc = oc
        pieces = token_bytes(tok)
        table: dict[bytes, list[int]] = {}
        for i, piece in enumerate(pieces):
            if piece and i not in stops:
                table.setdefault(piece, []).append(i)
        self.vocabulary = oc.Vocabulary(stops[0], table)  # one stop id only
        self.mask = torch.zeros((VOCAB_SIZE + 31) // 32, dtype=torch.int32)

    def compile(self, kind, value):
        regex = {"json_schema": lambda: self.oc.json_schema.build_regex_from_schema(json.dumps(value)),
                 "json_object": lambda: self.oc.json_schema.build_regex_from_schema(json.dumps(OBJ)),
                 "regex": lambda: value, "choice": lambda: choice_regex(value)}
        if kind not in regex:
            raise ValueError("outlines-core takes regular languages only (no context-free grammar)")
        return self.oc.Index(regex[kind](), self.vocabulary)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, m) -> torch.Tensor:
        m.write_mask_into(self.mask.data_ptr(), self.mask.numel(), 4)
        return self.mask

    def consume(self, m, token) -> bool:
        try:
            m.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False


class Specdec:
    """specdec.constraints (over llguidance, its fixed JSON layout) as the engine calls it: each mask
    is allowed(), a bool [vocab] tensor."""

    def __init__(self, tok, stops: list[int]):
        from specdec.constraints import ConstraintSpec, Grammars
        self.spec = ConstraintSpec
        self.grammars = Grammars.for_tokenizer(tok, VOCAB_SIZE, stops)

    def compile(self, kind, value):
        spec = self.spec(kind, None if kind == "json_object" else value)
        self.grammars.compile(spec)
        return spec

    def matcher(self, compiled):
        return self.grammars.constraint(compiled)

    def fill(self, m) -> torch.Tensor:
        return m.allowed()

    def consume(self, m, token) -> bool:
        from specdec.errors import SpecdecError
        try:
            m.advance([token])
            return True
        except SpecdecError:
            return False


ENGINES = {"xgrammar": XGrammar, "llguidance": LLGuidance, "outlines": Outlines, "specdec": Specdec}
PACKAGES = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines": "outlines-core", "specdec": "llguidance"}


def walk(engine, compiled, tokens: list[int], stops: list[int], times: list[float] | None) -> bool:
    """Whether the grammar takes `tokens` and then a stop id, each allowed by the mask before it."""
    m = engine.matcher(compiled)
    for token in [*tokens, None]:
        t0 = time.perf_counter()
        mask = engine.fill(m)
        if times is not None:
            times.append((time.perf_counter() - t0) * 1e6)
        if token is None:
            return any(bit(mask, s) for s in stops)
        if not bit(mask, token) or not engine.consume(m, token):
            return False
    return False


def run_case(engine, tok, case, stops, repeat: int, times: list[float]) -> dict:
    name, kind, value, valid, invalid = case
    row = {"case": name, "kind": kind}
    t0 = time.perf_counter()
    try:
        compiled = engine.compile(kind, value)
    except Exception as e:  # noqa: BLE001 - any engine failure is a coverage result
        return {**row, "compiles": False, "error": str(e).splitlines()[0][:300]}
    row.update(compiles=True, compile_ms=round((time.perf_counter() - t0) * 1e3, 2))
    valid_ids = tok.encode(text_of(kind, valid), add_special_tokens=False)
    case_times: list[float] = []
    row["accepts_valid"] = all([walk(engine, compiled, valid_ids, stops, case_times) for _ in range(repeat)])
    invalid_ids = tok.encode(text_of(kind, invalid), add_special_tokens=False)
    row["rejects_invalid"] = not walk(engine, compiled, invalid_ids, stops, None)
    row["mask_us_median"] = round(statistics.median(case_times), 1)
    times += case_times
    return row


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(name: str, tok, stops: list[int], repeat: int) -> dict:
    t0 = time.perf_counter()
    engine = ENGINES[name](tok, stops)
    setup_s = time.perf_counter() - t0
    times: list[float] = []
    rows = [run_case(engine, tok, case, stops, repeat, times) for case in CASES]
    ok = [r for r in rows if r.get("compiles") and r["accepts_valid"] and r["rejects_invalid"]]
    wrong = [r["case"] for r in rows if r.get("compiles") and not (r["accepts_valid"] and r["rejects_invalid"])]
    compile_ms = [r["compile_ms"] for r in rows if r.get("compiles")]
    return {"version": version(PACKAGES[name]), "tokenizer_setup_s": round(setup_s, 2),
            "coverage": f"{len(ok)}/{len(rows)}", "silently_wrong": wrong,
            "refused": [r["case"] for r in rows if not r.get("compiles")],
            "compile_ms": {"median": round(statistics.median(compile_ms), 1), "max": max(compile_ms)},
            "mask_us": {"median": round(statistics.median(times), 1), "p95": round(percentile(times, 0.95), 1),
                        "n": len(times)},
            "cases": rows}


def unpack_us(repeat: int = 200) -> float:
    """The time to turn one bitmask into a bool [vocab] tensor (numpy's unpackbits; alike for every engine)."""
    import numpy as np
    words = torch.randint(-2**31, 2**31 - 1, ((VOCAB_SIZE + 31) // 32,), dtype=torch.int32)
    t0 = time.perf_counter()
    for _ in range(repeat):
        torch.from_numpy(np.unpackbits(words.numpy().view(np.uint8), bitorder="little")[:VOCAB_SIZE]).view(torch.bool)
    return round((time.perf_counter() - t0) / repeat * 1e6, 1)


def choose(engines: dict) -> dict:
    """Fewest cases compiled but wrong without a word (the worst failure: output that breaks the
    schema, or a valid answer made impossible), then the most cases right, then the lowest p95 mask time."""
    def rank(name):
        e = engines[name]
        return len(e["silently_wrong"]), -int(e["coverage"].split("/")[0]), e["mask_us"]["p95"]
    candidates = [name for name in engines if name != "specdec" and "coverage" in engines[name]]
    return {"engine": min(candidates, key=rank), "rule": " ".join(choose.__doc__.split()),
            "ranks": {name: rank(name) for name in candidates}}


# What each engine's API offers the constraint's verbs (read from its documentation, not measured)
API = {"xgrammar": {"rollback": "GrammarMatcher.rollback(n)", "forced": "find_jump_forward_string() (a string)",
                    "draft_masks": "traverse_draft_tree (a tree, in C++)", "grammar_syntax": "EBNF/GBNF, Lark",
                    "unsupported_keywords": "ignored or a warning on stderr"},
       "llguidance": {"rollback": "LLMatcher.rollback(n)", "forced": "compute_ff_tokens() (tokens, canonical)",
                      "draft_masks": "validate_tokens, try_consume_tokens; LLExecutor masks along draft tokens",
                      "grammar_syntax": "Lark; GBNF converted (gbnf_to_lark)",
                      "unsupported_keywords": "an error naming them"},
       "outlines": {"rollback": "Guide.rollback_state(n), up to max_rollback", "forced": "none",
                    "draft_masks": "accepts_tokens", "grammar_syntax": "none (regular languages only)",
                    "unsupported_keywords": "ignored"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    home = Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec"))
    ap.add_argument("--model", default=str(home / "models" / "qwen2.5-coder-1.5b-instruct.gguf"))
    ap.add_argument("--engines", default="xgrammar,llguidance,outlines,specdec")
    ap.add_argument("--repeat", type=int, default=3, help="walks of each valid instance (mask-time samples)")
    args = ap.parse_args()
    tok = load_tokenizer(Path(args.model))
    stops = sorted({tok.eos_token_id, tok.token_id("<|endoftext|>")} - {None})
    out = {"command": " ".join(["python", "scripts/grammar_engines.py", *sys.argv[1:]]), "cpu": cpu_name(),
           "torch": torch.__version__, "tokenizer": Path(args.model).name, "tokenizer_tokens": len(tok),
           "vocab_size": VOCAB_SIZE, "stop_ids": stops, "engines": {}}
    for name in args.engines.split(","):
        try:
            out["engines"][name] = measure(name, tok, stops, args.repeat)
        except ImportError as e:
            out["engines"][name] = {"missing": str(e)}
            continue
        print(f"{name}: {out['engines'][name]['coverage']} {out['engines'][name]['mask_us']}", file=sys.stderr)
    out["bitmask_to_bool_us"] = unpack_us()
    out["api"] = {name: API[name] for name in out["engines"] if name in API}
    out["choice"] = choose(out["engines"])
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
