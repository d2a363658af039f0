"""The training loop: AdamW on soft cross-entropy against the teacher's top-k distribution (plus a
feature-regression term for EAGLE), resumable checkpoints, and a validation estimate of acceptance
logged to val.jsonl every N steps."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.errors import SpecdecError
from specdec.heads.modules import TargetParts, target_parts
from specdec.training.extract import ChunkRecord
from specdec.training.vocab import DraftVocab

CHECKPOINT = "checkpoint.pt"
VAL_LOG = "val.jsonl"


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 3e-4
    weight_decay: float = 0.0
    batch_tokens: int = 2048
    epochs: float = 2.0
    warmup: int = 20
    feat_weight: float = 0.5      # EAGLE: weight of the smooth-L1 feature regression
    unroll: int = 1               # EAGLE: steps drafted on its own features during training (EAGLE-3's test)
    val_k: int = 4                # validation: draft positions 1..k
    eval_every: int = 200
    save_every: int = 100
    bf16: bool = False
    seed: int = 0
    max_steps: int = 0            # > 0: stop after this many steps (total), whatever the epochs say


@dataclass
class Batch:
    features: torch.Tensor  # [B, T, hidden] float32
    tokens: torch.Tensor    # [B, T] int64
    top_ids: torch.Tensor   # [B, T, top_k] int64 draft ids, -1 outside the draft vocabulary
    top_probs: torch.Tensor  # [B, T, top_k] float32
    top1: torch.Tensor      # [B, T] int64: the teacher's most likely next token (target ids)
    mask: torch.Tensor      # [B, T] bool: real (not padding) positions

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, f).to(device) for f in ("features", "tokens", "top_ids", "top_probs", "top1", "mask")))


def make_batch(records: list[ChunkRecord], to_draft: torch.Tensor) -> Batch:
    """Pad records to one length; to_draft # [vocab] maps target ids to draft ids (-1 outside)."""
    t = max(r.tokens.numel() for r in records)
    b, hidden, k = len(records), records[0].features.shape[1], records[0].top_ids.shape[1]
    out = Batch(torch.zeros(b, t, hidden), torch.zeros(b, t, dtype=torch.int64),
                torch.full((b, t, k), -1, dtype=torch.int64), torch.zeros(b, t, k),
                torch.full((b, t), -1, dtype=torch.int64), torch.zeros(b, t, dtype=torch.bool))
    for i, r in enumerate(records):
        n = r.tokens.numel()
        ids = r.top_ids.long()
        out.features[i, :n] = r.features.float()
        out.tokens[i, :n] = r.tokens
        out.top_ids[i, :n] = to_draft[ids]
        out.top_probs[i, :n] = r.top_probs.float()
        out.top1[i, :n] = ids[:, 0]
        out.mask[i, :n] = True
    return out


def soft_ce(logits, ids, probs):
    """-sum_j p_j log q(id_j): logits [N, draft_vocab], ids [N, k] (-1 = outside), probs [N, k] -> [N]
    (the teacher's mass inside the draft vocabulary, renormalized)."""
    keep = ids >= 0
    p = probs * keep
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    logq = F.log_softmax(logits.float(), dim=-1).gather(-1, ids.clamp_min(0))
    return -(p * logq).sum(-1)


def draft_outputs(head, batch: Batch, parts: TargetParts, steps: int):
    """Per draft position j = 1..steps: (logits [B, n, draft_vocab], pred feature or None, target
    offset j: the teacher row at index t + j is the target of index t)."""
    if head.config.kind == "medusa":
        logits = head(batch.features, parts)  # [heads, B, T, draft_vocab]
        return [(logits[i][:, :logits.shape[2] - i - 1], None, i + 1) for i in range(min(steps, logits.shape[0]))]
    return [(logits, pred, j + 1) for j, (pred, logits) in enumerate(head.unroll(batch.features, batch.tokens, parts, steps))]


def loss_terms(head, batch: Batch, parts: TargetParts, cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    steps = cfg.unroll if head.config.kind == "eagle" else head.config.medusa_heads
    total, ce_sum, feat_sum, n_pos = 0.0, 0.0, 0.0, 0
    for logits, pred, j in draft_outputs(head, batch, parts, steps):
        n = logits.shape[1]
        mask = batch.mask[:, j:j + n]  # [B, n]
        ce = soft_ce(logits[mask], batch.top_ids[:, j:j + n][mask], batch.top_probs[:, j:j + n][mask]).mean()
        term = ce
        if pred is not None and cfg.feat_weight > 0:
            feat = F.smooth_l1_loss(pred[mask].float(), batch.features[:, j:j + n][mask])
            term = term + cfg.feat_weight * feat
            feat_sum += float(feat.detach())
        total = total + term
        ce_sum, n_pos = ce_sum + float(ce.detach()), n_pos + 1
    return total / n_pos, {"ce": ce_sum / n_pos, "feat": feat_sum / n_pos}


@torch.no_grad()
def acceptance(head, records: list[ChunkRecord], parts: TargetParts, to_draft, draft_ids, k: int) -> dict:
    """Greedy acceptance estimate on held-out chunks: per position j = 1..k, how often the head's top
    token (drafting on its own features) equals the teacher's, among the chains that got that far
    (a chain goes on only where the text itself continued with the teacher's top token)."""
    reach, accept = [0] * k, [0] * k
    for r in records:
        if r.tokens.numel() <= k + 1:
            continue
        batch = make_batch([r], to_draft).to(draft_ids.device)
        live = None
        for logits, _, j in draft_outputs(head, batch, parts, k):
            n = logits.shape[1]
            live = torch.ones(n, dtype=torch.bool, device=logits.device) if live is None else live[:n]
            match = draft_ids[logits[0].argmax(-1)] == batch.top1[0, j:j + n]
            reach[j - 1] += int(live.sum())
            accept[j - 1] += int((live & match).sum())
            greedy = torch.zeros_like(live)
            m = min(n, batch.tokens.shape[1] - j - 1)
            greedy[:m] = batch.tokens[0, j + 1:j + 1 + m] == batch.top1[0, j:j + m]
            live = live & match & greedy
    alpha = [a / r if r else 0.0 for a, r in zip(accept, reach)]
    return {"alpha": alpha, "tau": 1.0 + sum(math.prod(alpha[:j + 1]) for j in range(len(alpha))), "positions": reach[0]}


def head_acceptance(head, module, groups: dict[str, list[ChunkRecord]], k: int) -> dict[str, dict]:
    """acceptance() of a loaded head (fp32) for a loaded target module on each group of records, the
    target's parts for its draft vocabulary made once."""
    vocab = DraftVocab.from_d2t(head.d2t.cpu())
    parts, to_draft = target_parts(module, vocab.ids), vocab.target_to_draft(head.config.vocab_size)
    return {name: acceptance(head, records, parts, to_draft, vocab.ids, k) for name, records in groups.items()}


def batch_groups(records: list[ChunkRecord], batch_tokens: int, seed: int) -> list[list[int]]:
    """Groups of record indices of about batch_tokens tokens each (seeded, fixed for the run)."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    groups, current, size = [], [], 0
    for i in order:
        current.append(i)
        size += records[i].tokens.numel()
        if size >= batch_tokens:
            groups.append(current)
            current, size = [], 0
    return groups + ([current] if current else [])


def epoch_order(n_groups: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n_groups))
    random.Random(seed * 100003 + epoch + 1).shuffle(order)
    return order


def lr_at(step: int, total: int, cfg: TrainConfig, resumed: tuple[int, float] | None = None) -> float:
    """The learning rate at `step` of a run to `total` steps: warmup, then a cosine from --lr to a tenth
    of it; resumed = (step, rate): a run resumed to a new total, a cosine from that rate to the floor."""
    if resumed is not None:
        first, rate = resumed
        floor, progress = 0.1 * cfg.lr, (step - first) / max(1, total - first)
        return floor + (rate - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, total - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def save_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: Path, identity: dict) -> dict | None:
    """The training state saved at path (None if there is none); refuses one of another configuration."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a cut-off file raises whatever the unpickler meets
        raise SpecdecError(f"the training checkpoint {path} is unreadable ({type(e).__name__}); delete it to "
                           "train from the start") from None
    saved = state.get("identity", {})
    if saved != identity:
        keys = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
        raise SpecdecError(f"{path} is a checkpoint of another configuration (differs in: {', '.join(keys)}); "
                           "use the same flags to resume, or another --out to start a new head")
    return state


class Trainer:
    """Owns the head, the optimizer and the run's files in `directory`."""

    def __init__(self, head, parts: TargetParts, cfg: TrainConfig, directory: Path, identity: dict):
        self.head, self.parts, self.cfg, self.directory = head, parts, cfg, directory
        self.identity = identity
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.device = parts.lm_weight.device
        self.step, self.tokens = 0, 0
        self.schedule: dict | None = None  # {"total": steps, "resumed": None or (step, rate)}: plan_schedule
        directory.mkdir(parents=True, exist_ok=True)
        state = load_state(directory / CHECKPOINT, identity)
        if state is not None:  # its draft vocabulary too: a grown corpus may count another one
            head.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.step, self.tokens = state["step"], state["tokens"]
            self.schedule = state.get("schedule")
        vocab = DraftVocab.from_d2t(head.d2t.cpu())
        self.draft_ids = vocab.ids.to(self.device)
        self.to_draft = vocab.target_to_draft(head.config.vocab_size)  # on the CPU, where batches are made

    def plan_schedule(self, total: int) -> None:
        """The learning rates of a run to `total` steps. Fresh, or resumed to the total it was saved
        with: warmup and one cosine (lr_at). Resumed to another total (a larger --max-steps, say): a
        cosine from the rate the run had reached down to the same floor at the new total, so the rate
        never jumps back up."""
        saved, rate = self.schedule, self.opt.param_groups[0]["lr"]
        if self.step == 0 or (saved is not None and saved["total"] == total):
            self.schedule = saved if self.step else {"total": total, "resumed": None}
        elif saved is None and math.isclose(lr_at(self.step - 1, total, self.cfg), rate, rel_tol=1e-6):
            self.schedule = {"total": total, "resumed": None}  # saved without a schedule, on this curve
        else:
            self.schedule = {"total": total, "resumed": (self.step, rate)}

    def save(self) -> None:
        save_state(self.directory / CHECKPOINT, {"identity": self.identity, "model": self.head.state_dict(),
                                                 "optimizer": self.opt.state_dict(), "step": self.step,
                                                 "tokens": self.tokens, "train_config": asdict(self.cfg),
                                                 "schedule": self.schedule})

    def autocast(self):
        if not self.cfg.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def train_step(self, records: list[ChunkRecord], total: int) -> dict:
        batch = make_batch(records, self.to_draft).to(self.device)
        plan = self.schedule if self.schedule is not None and self.schedule["total"] == total else None
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, total, self.cfg, plan["resumed"] if plan else None)
        self.head.train()
        with self.autocast():
            loss, terms = loss_terms(self.head, batch, self.parts, self.cfg)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.tokens += int(batch.mask.sum())
        return {"loss": float(loss.detach()), **terms}

    def validate(self, records: list[ChunkRecord]) -> dict:
        self.head.eval()
        with self.autocast():
            result = acceptance(self.head, records, self.parts, self.to_draft, self.draft_ids, self.cfg.val_k)
        entry = {"step": self.step, "tokens": self.tokens, **result}
        with open(self.directory / VAL_LOG, "a") as f:
            f.write(json.dumps(entry) + "\n")
        return entry

    def total_steps(self, n_batches: int) -> int:
        total = max(1, math.ceil(n_batches * self.cfg.epochs))
        return min(total, self.cfg.max_steps) if self.cfg.max_steps > 0 else total

    def run(self, train: list[ChunkRecord], val: list[ChunkRecord], bar=None) -> list[dict]:
        """Train to the planned number of steps from wherever the checkpoint left off; returns the
        validation entries of this run (one at the end at least). Saves on the way and when interrupted."""
        groups = batch_groups(train, self.cfg.batch_tokens, self.cfg.seed)
        total, history, start = self.total_steps(len(groups)), [], time.monotonic()
        self.plan_schedule(total)
        tokens0, order = self.tokens, (-1, [])
        try:
            while self.step < total:
                epoch, index = divmod(self.step, len(groups))
                if order[0] != epoch:
                    order = (epoch, epoch_order(len(groups), self.cfg.seed, epoch))
                group = groups[order[1][index]]
                stats = self.train_step([train[i] for i in group], total)
                self._report(bar, stats, (self.tokens - tokens0) / max(1e-9, time.monotonic() - start))
                if self.step % self.cfg.save_every == 0:
                    self.save()
                if self.step % self.cfg.eval_every == 0:
                    history.append(self.validate(val))
        except KeyboardInterrupt:
            self.save()
            raise
        self.save()
        if not history or history[-1]["step"] != self.step:
            history.append(self.validate(val))
        return history

    def _report(self, bar, stats: dict, tokens_per_s: float) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.3f}", ce=f"{stats['ce']:.3f}", tok_s=f"{tokens_per_s:.0f}")
