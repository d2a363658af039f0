"""Head files in the published layouts, read and written.

- EAGLE:   config.json (a one-layer Llama config) + model.safetensors or pytorch_model.bin with fc.*,
           layers.0.* (EAGLE-1's names); our heads add d2t / t2d (EAGLE-3's draft-vocabulary maps).
- EAGLE-3: fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d.
- Medusa:  config.json (medusa_num_heads, medusa_num_layers) + medusa_head.{i}.{j}.linear.{weight,bias}
           (and medusa_head.{i}.{layers}.weight, a full LM head per head, in Medusa's own files).
Our heads also write specdec_head.json: the head's config and the target's fingerprint, which
load_head checks against the model it is asked to draft for.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.heads.modules import HeadConfig, build_head

META = "specdec_head.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
IGNORED_KEYS = ("embed_tokens.weight",)  # EAGLE-1 files carry the target's embedding; ours is the target's own


def write_json_atomic(path: Path, data) -> None:
    """JSON written aside and renamed into place (a kill leaves the old file or the new, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def target_fingerprint(module, tokenizer) -> dict:
    """What a head must match in its target: hidden size, vocabulary size, the tokenizer's tokens."""
    return {"hidden_size": module.config.hidden_size, "vocab_size": module.config.vocab_size,
            "tokenizer": tokenizer_fingerprint(tokenizer)}


def check_target(head_target: dict, target: dict, where: str) -> None:
    for key, what in (("hidden_size", "hidden size"), ("vocab_size", "vocabulary size"), ("tokenizer", "tokenizer")):
        if key in head_target and key in target and head_target[key] != target[key]:
            raise SpecdecError(f"the head in {where} was made for another model ({what} {head_target[key]}, this "
                               f"model's is {target[key]}); train one for this model with `specdec train-head`")


def export_config(cfg: HeadConfig, dtype: torch.dtype = torch.float32) -> dict:
    """config.json as the published repositories write it."""
    if cfg.kind == "medusa":
        return {"medusa_num_heads": cfg.medusa_heads, "medusa_num_layers": cfg.medusa_layers,
                "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size}
    arch = "LlamaForCausalLMEagle3" if cfg.kind == "eagle3" else "LlamaForCausalLM"
    return {"architectures": [arch], "model_type": "llama", "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "num_hidden_layers": 1,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
            "draft_vocab_size": cfg.draft_vocab_size, "bias": cfg.fc_bias, "attention_bias": cfg.attention_bias,
            "hidden_act": "silu", "torch_dtype": str(dtype).removeprefix("torch.")}


def head_tensors(head, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The head's tensors; dtype: its floating-point ones in that type (the vocabulary maps as they are)."""
    return {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous()
            for k, v in head.state_dict().items()}


def save_head(head, directory: Path, target: dict, extra: dict | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write config.json, model.safetensors and specdec_head.json into directory (replacing a head there);
    dtype: store the weights in that type (bf16 halves a head; load_head reads it back into float32)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "model.safetensors.tmp"
    save_file(head_tensors(head, dtype), str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / "model.safetensors")
    write_json_atomic(directory / "config.json", export_config(head.config, dtype or torch.float32))
    write_json_atomic(directory / META, {"format": 1, "kind": head.config.kind, "head_config": head.config.to_dict(),
                                         "target": target, **(extra or {})})
    return directory


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, SafetensorError, RuntimeError, EOFError, ValueError) as e:
            raise SpecdecError(f"the head file {path} is corrupt or partial ({type(e).__name__}: {str(e)[:120]}); "
                               "train or copy it again") from None
    raise SpecdecError(f"no head weights in {directory} (expected {' or '.join(WEIGHT_FILES)})")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SpecdecError(f"{path} is unreadable ({e}); the head directory is incomplete") from None


def infer_config(config: dict, keys: dict[str, torch.Tensor]) -> HeadConfig:
    """A HeadConfig for a checkpoint trained elsewhere, from its config.json and its tensors."""
    if any(k.startswith("medusa_head.") for k in keys):
        return _medusa_config(config, keys)
    if "fc.weight" not in keys:
        raise SpecdecError("the head file holds neither EAGLE (fc.weight) nor Medusa (medusa_head.*) tensors")
    kind = "eagle3" if any(k.startswith("midlayer.") for k in keys) else "eagle"
    prefix = "midlayer." if kind == "eagle3" else "layers.0."
    if kind == "eagle" and any(k.startswith("layers.1.") for k in keys):
        raise SpecdecError("EAGLE heads of more than one layer are not supported")
    hidden = keys["fc.weight"].shape[0]
    heads = config.get("num_attention_heads") or 1
    vocab = keys["t2d"].numel() if "t2d" in keys else config.get("vocab_size", 0)
    draft = keys["d2t"].numel() if "d2t" in keys else config.get("draft_vocab_size") or vocab
    return HeadConfig(kind, hidden, vocab, draft, heads, config.get("num_key_value_heads") or heads,
                      config.get("head_dim") or hidden // heads,
                      keys[prefix + "mlp.gate_proj.weight"].shape[0], config.get("rms_norm_eps", 1e-6),
                      float(config.get("rope_theta", 10000.0)), prefix + "self_attn.q_proj.bias" in keys,
                      config.get("max_position_embeddings", 4096), "fc.bias" in keys,
                      prefix + "input_layernorm.weight" in keys, final_norm=False)


def _medusa_config(config: dict, keys: dict[str, torch.Tensor]) -> HeadConfig:
    heads = 1 + max(int(m.group(1)) for k in keys if (m := re.match(r"medusa_head\.(\d+)\.", k)))
    layers = config.get("medusa_num_layers") or sum(1 for k in keys if re.fullmatch(r"medusa_head\.0\.\d+\.linear\.weight", k))
    hidden = keys["medusa_head.0.0.linear.weight"].shape[1]
    own = f"medusa_head.0.{layers}.weight" in keys
    vocab = keys[f"medusa_head.0.{layers}.weight"].shape[0] if own else config.get("vocab_size", 0)
    draft = keys["d2t"].numel() if "d2t" in keys else vocab
    return HeadConfig("medusa", hidden, vocab, draft, medusa_heads=heads, medusa_layers=layers, own_lm_head=own)


def load_head(directory, target: dict | None = None):
    """A head directory -> (module, meta). target: the fingerprint of the model it will draft for
    (target_fingerprint), checked against what the head was made for."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SpecdecError(f"no head directory {directory}; `specdec heads` lists the installed heads")
    keys = read_weights(directory)
    config = read_json(directory / "config.json") if (directory / "config.json").is_file() else {}
    meta = read_json(directory / META) if (directory / META).is_file() else {}
    cfg = HeadConfig.from_dict(meta["head_config"]) if "head_config" in meta else infer_config(config, keys)
    made_for = meta.get("target") or {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size or None}
    if target is not None:
        check_target({k: v for k, v in made_for.items() if v}, target, str(directory))
        if not cfg.vocab_size:
            cfg = HeadConfig.from_dict({**cfg.to_dict(), "vocab_size": target["vocab_size"],
                                        "draft_vocab_size": cfg.draft_vocab_size or target["vocab_size"]})
    head = build_head(cfg)
    fill_state(head, {k: v for k, v in keys.items() if k not in IGNORED_KEYS}, directory)
    return head.eval(), meta


def fill_state(head, keys: dict[str, torch.Tensor], directory: Path) -> None:
    """Load tensors into head, or a clear error naming what is missing, extra or misshapen."""
    state = head.state_dict()
    optional = {"d2t", "t2d"}
    missing = sorted(k for k in state if k not in keys and k not in optional)
    extra = sorted(k for k in keys if k not in state)
    bad = sorted(k for k in keys if k in state and keys[k].shape != state[k].shape)
    if missing or extra or bad:
        what = "; ".join(f"{label}: {', '.join(names[:4])}" for label, names in
                         (("missing", missing), ("unexpected", extra), ("wrong shape", bad)) if names)
        raise SpecdecError(f"the head file in {directory} does not fit its config ({what}); it is partial or "
                           "of another layout")
    for k, v in keys.items():
        state[k] = v.to(state[k].dtype)
    if "t2d" not in keys and "d2t" in keys:
        state["t2d"] = torch.zeros_like(state["t2d"])
        state["t2d"][keys["d2t"].long() + torch.arange(keys["d2t"].numel())] = True
    if "d2t" not in keys:
        state["t2d"] = torch.ones_like(state["t2d"])
    head.load_state_dict(state)
