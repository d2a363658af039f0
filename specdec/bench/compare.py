"""Side-by-side runs of methods on one target, interleaved prompt by prompt (A B C, B C A, C A B, ...),
after one untimed warm-up pass.

A method is a drafting kind and its k: our engine (plain, draft, ngram), HF transformers (hf,
hf-assisted, hf-lookup) and llama.cpp's llama-server (llama, llama-spec, llama-lookup). Every record
goes to a JSONL file as it finishes, so an interrupted run resumes where it stopped. The numbers are made in `report.py`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from specdec.bench import report
from specdec.bench.baselines import HFBaseline
from specdec.bench.datasets import Prompt, load_prompts
from specdec.bench.llama_server import LlamaServerPeer, find_binary, parse_spec_pin
from specdec.bench.records import HF_KINDS, LLAMA_KINDS, Record, all_kinds, is_ours  # noqa: F401 (re-exported)
from specdec.config import SAMPLER_ORDER, GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.registry import DraftOptions, Parts, method
from specdec.engine.build import Builder, EnginePlan, draft_options, load_parts, log
from specdec.errors import SpecdecError
from specdec.model.registry import resolve_model
from specdec.model.tokenizer import encode_infill, encode_messages, encode_prompt
from specdec.settings import BenchSettings, ModelSettings

PEER_K_KINDS = ("hf-assisted", "hf-lookup", "llama-lookup")  # the peers that take a draft length
DRAFT_PEERS = ("hf-assisted",)  # the peers whose draft the summary names (--draft)


AUTO_K_MAX = 8  # the largest k an adaptive ('auto') method may pick, unless it names its own ('auto4')
AUTO_FORM = re.compile(r"(auto(?:-k)?)(\d*)")  # 'auto', 'auto-k', or either with its largest k: 'auto4'
AUTO_TREE_BUDGET = 16  # tree:auto: the largest tree; the policy weighs 4, 8 and 16 nodes against chains and plain


def is_auto(k: int | str) -> bool:
    """k (from parse_k_list) names the adaptive policy ('auto', 'auto-k', 'auto4', 'auto-k4'), not a
    fixed draft length."""
    return isinstance(k, str)


def _auto_form(k: str) -> tuple[bool, int]:
    """An adaptive form's (with the confidence rule, largest k): 'auto4' -> (True, 4), 'auto-k' ->
    (False, AUTO_K_MAX)."""
    kind, cap = AUTO_FORM.fullmatch(k).groups()
    return kind == "auto", int(cap) if cap else AUTO_K_MAX


@dataclass(frozen=True)
class MethodSpec:
    label: str  # as it appears in records and tables: 'draft', or 'draft:8' when k varies
    kind: str
    k: int  # the draft length, or the largest one for an adaptive method
    adaptive: bool = False  # k chosen per step by specdec.policy ('draft:auto')
    confidence: bool = True  # adaptive: with the policy's confidence rule ('auto'), or k only ('auto-k')
    p_min: float | None = None  # llama-spec:K@P: llama.cpp's draft-confidence cut


def parse_k_list(text: str) -> list[int | str]:
    """'4', '1,2,3,4,6,8' or '1,2,4,auto,auto-k,auto4' -> [ints, and the adaptive forms as strings];
    anything else is a clear error."""
    values = [v.strip() for v in str(text).split(",") if v.strip()]
    try:
        ks = [v if AUTO_FORM.fullmatch(v) else int(v) for v in values]
    except ValueError:
        raise SpecdecError(f"--k takes integers (or 'auto', 'auto-k', 'auto4') separated by commas, e.g. "
                           f"1,2,4,8,auto; got {text!r}") from None
    if not ks or any((_auto_form(k)[1] if is_auto(k) else k) < 1 for k in ks):
        raise SpecdecError(f"--k values must be integers >= 1, 'auto' or 'auto-k' (with a largest k >= 1), "
                           f"got {text!r}")
    return list(dict.fromkeys(ks))


def _spec(label: str, kind: str, k: int | str) -> MethodSpec:
    if is_auto(k):
        if not is_ours(kind):
            raise SpecdecError(f"'{k}' (the adaptive policy) is for our drafting methods, not {kind!r}")
        confidence, k_max = _auto_form(k)
        return MethodSpec(label, kind, k_max, adaptive=True, confidence=confidence)
    return MethodSpec(label, kind, k)


def takes_k(kind: str) -> bool:
    """A drafting method (ours, or a peer's that drafts) takes a draft length; plain decoding does not."""
    return method(kind).entry.drafts if is_ours(kind) else kind in PEER_K_KINDS


def tree_sizes(kind: str) -> bool:
    """tree:N (the draft model's) and eagle-tree:N: each size its own drafter."""
    return is_ours(kind) and method(kind).tree_sizes


def uses_draft(kind: str) -> bool:
    """The method drafts with the --draft model (ours or a peer's)."""
    return method(kind).entry.draft_model if is_ours(kind) else kind in DRAFT_PEERS


def parse_methods(methods: str, k_list: list[int | str]) -> list[MethodSpec]:
    """'plain,draft,ngram:8' with k list [4] -> specs. A method without ':k' runs every k in the list
    (labelled 'kind:k' when the list has more than one); 'kind:k' pins one k; k 'auto' is adaptive."""
    specs: list[MethodSpec] = []
    for item in (m.strip() for m in methods.split(",") if m.strip()):
        kind, _, pinned = item.partition(":")
        if kind not in all_kinds():
            raise SpecdecError(f"unknown method {kind!r}; choose from {', '.join(all_kinds())} "
                               f"(a drafting method may pin its k, e.g. draft:8)")
        if kind == "llama-spec":  # llama.cpp's defaults, or :K / :K@P pinned
            k, p_min = parse_spec_pin(pinned) if pinned else (0, None)
            specs.append(MethodSpec(item, kind, k, p_min=p_min))
            continue
        if pinned and not takes_k(kind):
            raise SpecdecError(f"method {kind!r} takes no k, got {item!r}")
        if not takes_k(kind):
            specs.append(MethodSpec(kind, kind, 1))
        elif pinned:
            specs.append(_spec(item, kind, parse_k_list(pinned)[0]))
        else:
            specs += [_spec(kind if len(k_list) == 1 and not is_auto(k) else f"{kind}:{k}", kind, k)
                      for k in k_list if not is_auto(k) or is_ours(kind)]
    if not specs:
        raise SpecdecError("no methods given")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise SpecdecError(f"a method is listed twice: {labels}")
    return specs


def encode_turns(tok, messages: list[dict]) -> list[int]:
    """A bench prompt's messages as the target reads them: through its chat template where it has one,
    else their texts joined."""
    if tok.chat_template:
        return encode_messages(tok, messages)
    return encode_prompt(tok, "\n\n".join(m["content"] for m in messages), chat=False)


class Comparison:
    def __init__(self, parts: Parts, specs: list[MethodSpec], max_new_tokens: int,
                 options: DraftOptions = DraftOptions(), hf=None, llama=None,
                 sampling: SamplingParams = SamplingParams(), cost_profile: str | None = None, tree_depth: int = 4,
                 tree_topk: int = 4, ignore_eos: bool = False):
        """parts: the target and what our methods need (engine.build.load_parts), its cache shared by
        every engine (one method runs at a time; layer skip drafts into it too); options: how the
        drafters are built; sampling: every method's (its seed the base: per prompt, seed + index);
        ignore_eos: our methods always generate max_new_tokens."""
        self.ignore_eos = ignore_eos
        self.parts, self.target, self.draft, self.cache = parts, parts.target, parts.draft, parts.cache
        self.specs, self.hf, self.llama = specs, hf, llama
        self.max_new_tokens, self.sampling, self.seed, self.tree_depth = (max_new_tokens, sampling, sampling.seed,
                                                                          tree_depth)
        drafters = {}  # kind -> its drafter, shared by the engines of that kind (tree sizes: one each)
        self.engines = {}  # label -> engine
        for s in (s for s in specs if is_ours(s.kind)):
            m = method(s.kind)
            if m.tree_sizes:  # each tree size its own drafter (and draft cache)
                tree = TreeConfig(AUTO_TREE_BUDGET if s.adaptive else s.k, min(tree_depth, s.k), tree_topk)
                drafter = m.build(parts, replace(options, tree=tree), log)
            else:
                if s.kind not in drafters:
                    drafters[s.kind] = m.build(parts, options, log)
                drafter = drafters[s.kind]
            plan = EnginePlan(s.k, s.adaptive, s.confidence, cost_profile)
            self.engines[s.label] = Builder(parts, options).engine(m, plan, drafter=drafter)

    def encode(self, messages: list[dict]) -> list[int]:
        return encode_turns(self.target.tokenizer, messages)

    def first_ids(self, prompt: Prompt) -> list[int]:
        """The prompt's first turn as the target reads it: through the chat template, or the raw text
        laid out around the gap where the prompt fills a middle."""
        if prompt.suffix is not None:
            return encode_infill(self.target.tokenizer, prompt.turns[0], prompt.suffix)
        return self.encode([{"role": "user", "content": prompt.turns[0]}])

    def generate(self, ids: list[int], spec: MethodSpec, seed: int | None) -> tuple[list[int], float, dict | None]:
        if spec.label in self.engines:
            # a fixed tree's k caps its depth; tree:auto may also choose chains up to AUTO_K_MAX
            k = min(self.tree_depth, spec.k) if tree_sizes(spec.kind) and not spec.adaptive else spec.k
            cfg = GenerationConfig(self.max_new_tokens, k, replace(self.sampling, seed=seed),
                                   stop_at_eos=not self.ignore_eos)
            res = self.engines[spec.label].generate(ids, cfg, self.target.eos_ids)
            return res.tokens, res.stats.seconds, res.stats.summary()
        peer, mode = self._peer(spec)
        extra = {"p_min": spec.p_min} if spec.kind == "llama-spec" else {}
        tokens, seconds = peer.generate(ids, self.max_new_tokens, mode, spec.k, replace(self.sampling, seed=seed),
                                        **extra)
        return tokens, seconds, None

    def _peer(self, spec: MethodSpec) -> tuple:
        """(the peer object, its mode) for a peer method"""
        if spec.kind in HF_KINDS:
            return self.hf, HF_KINDS[spec.kind]
        return self.llama, LLAMA_KINDS[spec.kind]

    def warm_up(self, prompt: Prompt) -> None:
        """One untimed pass over the prompt before the timed runs: a model's first forward faults its weights
        in and makes its first allocations, which would otherwise be charged to whichever method runs first
        (0.6 s of a 3.2 s plain run on the 1.5B model). Our models run one forward; each peer mode generates two
        tokens (a peer that fails here fails again in its timed run, which records it)."""
        import torch
        ids = self.first_ids(prompt)
        with torch.inference_mode():
            for model, cache in ((self.target, self.cache), (self.draft, None)):
                if model is not None:
                    # the draft on its own tokens (it may have another tokenizer than the target)
                    x = ids if model is self.target else encode_prompt(model.tokenizer, prompt.turns[0], chat=False)
                    cache = model.module.new_cache(len(x) + 1) if cache is None else cache
                    model.module(torch.tensor([x], device=cache.k.device), cache, 0, last_only=True)
        for spec in self.specs:
            if not is_ours(spec.kind):
                peer, mode = self._peer(spec)
                try:
                    extra = {"p_min": spec.p_min} if spec.kind == "llama-spec" else {}
                    peer.generate(ids, 2, mode, spec.k, self.sampling, **extra)
                except Exception:  # noqa: BLE001 - recorded by the timed run
                    pass

    def run_one(self, prompt: Prompt, spec: MethodSpec, repeat: int = 0, seed: int | None = None) -> Record:
        """All turns of a prompt; later turns see the method's own earlier answers (Spec-Bench)."""
        messages, tokens, seconds, stats, counts = [], [], 0.0, [], {}
        for turn in prompt.turns:
            messages.append({"role": "user", "content": turn})
            ids = self.encode(messages) if len(messages) > 1 else self.first_ids(prompt)
            new, secs, st = self.generate(ids, spec, seed)
            if spec.kind in LLAMA_KINDS:
                for key, n in self.llama.last_counts.items():
                    counts[key] = counts.get(key, 0) + n
            answer = self.target.tokenizer.decode(new, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
            tokens, seconds = tokens + new, seconds + secs
            stats.append(st)
        return Record(prompt.id, prompt.category, spec.label, tokens, seconds,
                      stats if is_ours(spec.kind) else None, repeat, spec.k, spec.kind, peer=counts or None)

    def run(self, prompts: list[Prompt], out: Path, repeats: int = 1) -> list[Record]:
        """Appends to out (JSONL); (prompt, method, repeat) triples already there are not run again."""
        from tqdm import tqdm
        records = read_records(out)
        done = {(r.prompt_id, r.method, r.repeat) for r in records}
        # interleaved, prompt by prompt (A B C, A B C, ...), so that drift hits every method alike; and each
        # prompt starts one method further on (A B C, B C A, C A B, ...), so that what a method leaves behind
        # (a peer's spinning threads, a cold cache) does not always land on the same next method
        m = len(self.specs)
        jobs = [(rep, i, p, self.specs[(rep * len(prompts) + i + j) % m])
                for rep in range(repeats) for i, p in enumerate(prompts) for j in range(m)]
        todo = [j for j in jobs if (j[2].id, j[3].label, j[0]) not in done]
        if todo:
            self.warm_up(todo[0][2])
        bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), unit="run", desc="bench", dynamic_ncols=True)
        with out.open("a") as f, bar:
            for rep, i, prompt, spec in todo:
                seed = None if self.seed is None else self.seed + 1_000_003 * rep + i
                try:
                    rec = self.run_one(prompt, spec, rep, seed)
                except Exception as e:  # noqa: BLE001 - a peer library's failure must not end the run
                    if is_ours(spec.kind):
                        raise
                    rec = Record(prompt.id, prompt.category, spec.label, [], 0.0, None, rep, spec.k, spec.kind,
                                 error=f"{type(e).__name__}: {e}"[:300])
                    bar.write(f"warning: {spec.label} failed on {prompt.id}: {rec.error}")
                records.append(rec)
                f.write(json.dumps(rec.__dict__) + "\n")
                f.flush()
                bar.update()
                bar.write(f"[{i + 1}/{len(prompts)} r{rep}] {prompt.id} {spec.label:14s} {len(rec.tokens):4d} tok "
                          f"{rec.tokens_per_second:6.2f} tok/s")
        return records


def read_records(path: Path) -> list[Record]:
    if not path.is_file():
        return []
    records = []
    with path.open() as f:
        for line in f:
            if line.strip():
                try:
                    records.append(Record(**json.loads(line)))
                except (ValueError, TypeError):  # a line cut short by an interrupted run: redo that job
                    continue
    return records


def select_prompts(prompts: list[Prompt], categories: str | None, limit: int | None) -> list[Prompt]:
    """Keep the named categories (comma list; None = all) and the first `limit` of each."""
    wanted = None if categories is None else {c.strip() for c in categories.split(",") if c.strip()}
    known = {p.category for p in prompts}
    if wanted is not None and not wanted & known:
        raise SpecdecError(f"no prompts in categories {sorted(wanted)}; the dataset has {sorted(known)}")
    if limit is not None and limit < 1:
        raise SpecdecError(f"--limit must be >= 1, got {limit}")
    seen: dict[str, int] = {}
    kept = []
    for p in prompts:
        if (wanted is None or p.category in wanted) and seen.get(p.category, 0) < (limit or len(prompts)):
            seen[p.category] = seen.get(p.category, 0) + 1
            kept.append(p)
    return kept


@dataclass
class Peers:
    hf: object = None
    llama: object = None
    notes: list[str] = field(default_factory=list)


def make_peers(model: ModelSettings, bench: BenchSettings, target, kinds: set[str]) -> Peers:
    """Load only the peers that still have work (a resumed run may have none)."""
    peers = Peers()
    if kinds & set(HF_KINDS):
        assistant = resolve_model(bench.draft) if "hf-assisted" in kinds else None
        peers.hf = HFBaseline(resolve_model(model.model), target.eos_ids, assistant, share=target.module)
    if kinds & set(LLAMA_KINDS):
        draft_path = resolve_model(bench.draft) if "llama-spec" in kinds else None
        peers.llama = LlamaServerPeer(find_binary(bench.llama_bin), resolve_model(model.model), draft_path,
                                      target.eos_ids, model.max_context, torch.get_num_threads(), Path(bench.out))
    return peers


def complete_prompts(records: list[Record], prompts: list[Prompt], specs: list[MethodSpec],
                     repeats: int) -> tuple[list[Record], list[str]]:
    """Keep the records of prompts that every method finished in every repeat (so all methods are
    compared on the same prompts, also in an interrupted run); return them and those prompt ids."""
    have = {(r.prompt_id, r.method, r.repeat) for r in records}
    complete = [p.id for p in prompts if all((p.id, s.label, rep) in have for s in specs for rep in range(repeats))]
    keep = set(complete)
    labels = {s.label for s in specs}
    return [r for r in records if r.prompt_id in keep and r.method in labels and r.repeat < repeats], complete


def run_comparison(model: ModelSettings, bench: BenchSettings) -> dict:
    """`specdec bench`: load models once, run every method on every prompt, write the results."""
    specs = parse_methods(bench.methods, parse_k_list(bench.k))
    peers = sorted(s.label for s in specs if s.kind in HF_KINDS or s.kind in LLAMA_KINDS)
    if bench.ignore_eos and peers:
        raise SpecdecError(f"--ignore-eos applies to our methods only; drop it or the peers {peers}")
    hf = sorted(s.label for s in specs if s.kind in HF_KINDS)
    if hf and (bench.presence_penalty or bench.frequency_penalty):
        raise SpecdecError(f"HF transformers' generate() has no presence or frequency penalty; drop them or the "
                           f"peers {hf}")
    if hf and bench.order != SAMPLER_ORDER and bench.temperature > 0:
        raise SpecdecError(f"HF transformers' generate() applies its samplers in its own order; drop --samplers or "
                           f"the peers {hf}")
    if hf and bench.penalty_last_n and bench.repetition_penalty != 1.0:
        raise SpecdecError(f"HF transformers' repetition penalty counts the whole text; drop --repeat-last-n or the "
                           f"peers {hf}")
    if {s.kind for s in specs} & set(LLAMA_KINDS) and not bench.report_only:
        find_binary(bench.llama_bin)  # a missing build fails now, not after the models load
    prompts = select_prompts(load_prompts(bench.dataset), bench.categories, bench.limit)
    out = Path(bench.out)
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.jsonl"
    done = {(r.prompt_id, r.method, r.repeat) for r in read_records(records_path)}
    pending = {s.kind for s in specs if any((p.id, s.label, rep) not in done
                                             for p in prompts for rep in range(bench.repeats))}
    t0 = time.time()
    weight_format = None  # what the target's weights were read as (load_model's weight_format), when loaded
    llama_info = None  # the llama.cpp build that ran (its version, compiler, system_info, threads)
    if bench.report_only:  # summarize what the run directory holds; load and run nothing
        records = read_records(records_path)
    else:
        options = draft_options(bench, draft=bench.draft)
        ours = [method(s.kind) for s in specs if is_ours(s.kind)]
        parts = load_parts(model, ours, options)
        weight_format = parts.target.module.weight_format
        peers = make_peers(model, bench, parts.target, pending)
        comparison = Comparison(parts, specs, bench.max_new_tokens, options, peers.hf, peers.llama, bench.sampling,
                                bench.cost_profile, bench.tree_depth, bench.tree_topk, bench.ignore_eos)
        try:
            records = comparison.run(prompts, records_path, bench.repeats)
        finally:
            if peers.llama is not None:
                llama_info = peers.llama.info
                peers.llama.close()
    records, complete = complete_prompts(records, prompts, specs, bench.repeats)
    if not records:
        raise SpecdecError(f"no prompt in {out} has a record for every method yet; nothing to summarize")
    config = {"model": model.model, "draft": bench.draft if any(uses_draft(s.kind) for s in specs) else None, "methods": [s.label for s in specs], "k": parse_k_list(bench.k),
              "draft_vocab": bench.draft_vocab, "draft_p_min": bench.draft_p_min, "draft_window": bench.draft_window,
              "tree_depth": bench.tree_depth, "tree_topk": bench.tree_topk, "max_new_tokens": bench.max_new_tokens, "prompts": len(prompts),
              "categories": sorted({p.category for p in prompts}), "repeats": bench.repeats,
              "prompts_complete": len(complete),
              "dataset": bench.dataset or "specdec/data/code_prompts.jsonl", "temperature": bench.temperature,
              "sampling": {k: v for k, v in asdict(bench.sampling).items() if k not in ("temperature", "seed")},
              "seed": bench.seed, "greedy": bench.temperature == 0, "ignore_eos": bench.ignore_eos,
              "weight_dtype": model.weight_dtype or "auto", "weight_format": weight_format,
              "cost_profile": bench.cost_profile, "llama_cpp": llama_info,
              "wall_seconds_last_invocation": round(time.time() - t0, 1)}
    cost_profile = report.read_cost_profile(bench.cost_profile) if bench.cost_profile else None
    summary = report.build_summary(records, config, cost_profile)
    report.write_outputs(summary, records, out, plots=not bench.no_plots)
    print(report.markdown(summary))
    if bench.theory:
        print(report.theory_table(summary))
    return summary
