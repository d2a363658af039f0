"""Load weights, config and tokenizer from a GGUF file or an HF model directory.

A GGUF file is converted once into an HF-layout directory (config.json, model.safetensors in
fp32, tokenizer files) under SPECDEC_HOME/converted; later loads read that directory, which
takes seconds. HF directories load directly. Both paths end in `load_hf_dir`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.model.registry import specdec_home
from specdec.model.transformer import ModelConfig, Transformer, rope_tables

SUPPORTED_ARCHS = {"llama", "qwen2", "mistral"}
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight' (None if unknown)."""
    base, _, kind = gguf_name.rpartition(".")
    if base in GGUF_TOP_NAMES:
        return f"{GGUF_TOP_NAMES[base]}.{kind}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{GGUF_LAYER_NAMES[parts[2]]}.{kind}"
    return None


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> HF rotate-half layout)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_hf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise SpecdecError(f"unsupported GGUF architecture {arch!r}; supported: {sorted(SUPPORTED_ARCHS)}")
    f = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    names = {t.name for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    heads = int(f("attention.head_count"))
    hidden = int(f("embedding_length"))
    return {
        "model_type": arch, "vocab_size": int(embd.shape[1]), "hidden_size": hidden,
        "intermediate_size": int(f("feed_forward_length")), "num_hidden_layers": int(f("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(f("attention.head_count_kv", heads)),
        "head_dim": int(f("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(f("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(f("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(f("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "torch_dtype": "float32",
    }


def _dequantize(tensor) -> np.ndarray:
    from gguf.quants import dequantize
    return np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32, copy=True)


def gguf_state_dict(reader, cfg: dict) -> dict[str, torch.Tensor]:
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        w = _dequantize(t)
        if cfg["model_type"] != "qwen2" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in name else cfg["num_key_value_heads"]
            w = unpermute_qk(w, heads)
        out[name] = torch.from_numpy(w)
    return out


def _open_gguf(path: Path):
    import gguf
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the gguf library raises several types on truncated/corrupt files
        raise SpecdecError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); "
                           "it may be truncated or corrupt: pull or copy it again") from None


def _cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()
    return f"{path.stem}-{hashlib.sha256(raw).hexdigest()[:12]}"


def save_gguf_tokenizer(path: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.save_pretrained(str(out_dir))


def convert_gguf(path: Path, progress=print) -> Path:
    """Convert a GGUF file to an HF-layout directory once; return the directory."""
    from safetensors.torch import save_file
    out = specdec_home() / "converted" / _cache_key(path)
    if (out / "model.safetensors").is_file():
        return out
    reader = _open_gguf(path)
    cfg = gguf_hf_config(reader)
    progress(f"converting {path.name} to fp32 (once; cached in {out})")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(gguf_state_dict(reader, cfg), str(tmp / "model.safetensors"))
    _save_blocks(_blocks_of(reader), tmp / BLOCKS_FILE)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    save_gguf_tokenizer(path, tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def resolve_dtype(device: torch.device, dtype: str | None) -> torch.dtype:
    """fp32 on CPU by default, bf16 on CUDA; refuse a dtype the device cannot run well."""
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in names:
        raise SpecdecError(f"unknown dtype {dtype!r}; choose one of float32, bfloat16, float16")
    if device.type == "cpu" and names[dtype] == torch.float16:
        raise SpecdecError("float16 is not supported on CPU; use float32 or bfloat16")
    return names[dtype]


WEIGHT_DTYPES = ("auto", "float32", "bfloat16", "gguf", "gguf-q8")
GGUF_MODES = ("gguf", "gguf-q8")  # read the GGUF file's blocks: exact fp32 arithmetic, or 8-bit activations


def resolve_weight_dtype(device: torch.device, dtype: torch.dtype, weight_dtype: str | None) -> torch.dtype | None:
    """--weight-dtype: torch.bfloat16 for "bfloat16" (CPU fp32 only: bf16 linear weights), else None
    (weights as loaded; "gguf", "gguf-q8" and "auto" are settled by use_gguf_blocks)."""
    if weight_dtype is None or weight_dtype in ("float32", "fp32", "auto", *GGUF_MODES):
        return None
    if weight_dtype not in ("bfloat16", "bf16"):
        raise SpecdecError(f"unknown --weight-dtype {weight_dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
    if device.type != "cpu" or dtype != torch.float32:
        raise SpecdecError(f"--weight-dtype bfloat16 is for the CPU fp32 path (bf16 weights under fp32 activations); "
                           f"on {device} in {dtype} use --dtype instead")
    return torch.bfloat16


def use_gguf_blocks(device: torch.device, dtype: torch.dtype, weight_dtype: str | None, source: Path,
                    kernel: bool) -> str | None:
    """How the GEMMs read the checkpoint's own quantized blocks, if they do: "gguf" (exact,
    quant_gemm.c) or "gguf-q8" (8-bit activations, quant_q8.c); None for the weights as loaded.
    "gguf" and "gguf-q8" ask for theirs (an error where it cannot be had); None or "auto" takes
    "gguf-q8" wherever it can (a .gguf model on the CPU in fp32 with our kernel); "float32" and
    "bfloat16" take neither."""
    if weight_dtype not in (None, "auto", *GGUF_MODES):
        return None
    possible = device.type == "cpu" and dtype == torch.float32 and source.suffix == ".gguf" and kernel
    if weight_dtype in GGUF_MODES and not possible:
        flag = f"--weight-dtype {weight_dtype}"
        if source.suffix != ".gguf":
            raise SpecdecError(f"{flag} reads a GGUF file's quantized blocks; {source} is not a .gguf file")
        if device.type != "cpu" or dtype != torch.float32:
            raise SpecdecError(f"{flag} is for the CPU fp32 path, not {device} in {dtype}")
        raise SpecdecError(f"{flag} needs our CPU kernel, which is off or unavailable here "
                           "(--no-kernel, or see the message above); use --weight-dtype float32")
    if not possible:
        return None
    return weight_dtype if weight_dtype in GGUF_MODES else "gguf-q8"


# in the converted directory (a subfolder: load_hf_dir reads every *.safetensors at its top): the GGUF's
# quantized rows, their types in the metadata
BLOCKS_FILE = "quant/gguf_blocks.safetensors"


def gguf_blocks(path: Path, directory: Path | None = None) -> dict[str, tuple[int, torch.Tensor]]:
    """The quantized linear weights of a GGUF file in formats our kernel reads: HF weight name (without
    ".weight") -> (ggml type id, uint8 [rows, row bytes]), in the HF row order (llama's q/k rows
    un-permuted as in the conversion). Cached in `directory` (the converted one) on first use, since
    parsing a GGUF file's metadata takes seconds."""
    from safetensors import safe_open
    cached = directory / BLOCKS_FILE if directory is not None else None
    if cached is not None and cached.is_file():
        try:
            with safe_open(str(cached), framework="pt") as f:
                types = f.metadata() or {}
                return {name: (int(types[name]), f.get_tensor(name)) for name in f.keys() if name in types}
        except Exception:  # an unreadable cache file: built again below from the GGUF file
            cached.unlink(missing_ok=True)
    out = _blocks_of(_open_gguf(path))
    if cached is not None:
        _save_blocks(out, cached)
    return out


def _blocks_of(reader) -> dict[str, tuple[int, torch.Tensor]]:
    from specdec.model.cpu_kernels import QUANT_TYPES
    cfg = gguf_hf_config(reader)
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None or not name.endswith(".weight") or t.tensor_type.name not in QUANT_TYPES \
                or len(t.data.shape) != 2:
            continue
        data = np.array(t.data, dtype=np.uint8, copy=True)  # [rows, row bytes]
        if cfg["model_type"] != "qwen2" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in name else cfg["num_key_value_heads"]
            data = np.ascontiguousarray(unpermute_qk(data, heads))
        out[name[:-len(".weight")]] = (int(t.tensor_type), torch.from_numpy(data))
    return out


def _save_blocks(blocks: dict[str, tuple[int, torch.Tensor]], file: Path) -> None:
    from safetensors.torch import save_file
    file.parent.mkdir(exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    save_file({k: v for k, (_, v) in blocks.items()}, str(tmp), metadata={k: str(q) for k, (q, _) in blocks.items()})
    tmp.rename(file)


def resolve_device(device: str | None) -> torch.device:
    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SpecdecError(f"unknown device {name!r}; use cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecdecError("CUDA was asked for but no CUDA device is available; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise SpecdecError(f"unsupported device {name!r}; use cpu or cuda[:N]")
    return dev


def load_hf_dir(directory: Path, device: torch.device, dtype: torch.dtype) -> Transformer:
    from safetensors import safe_open
    cfg_path = directory / "config.json"
    files = sorted(directory.glob("*.safetensors"))
    if not cfg_path.is_file() or not files:
        raise SpecdecError(f"{directory} is not an HF model directory (needs config.json and *.safetensors)")
    hf_cfg = json.loads(cfg_path.read_text())
    if hf_cfg.get("model_type") not in SUPPORTED_ARCHS:
        raise SpecdecError(f"unsupported model_type {hf_cfg.get('model_type')!r} in {cfg_path}")
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_hf(hf_cfg))
    state = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as sf:
            state.update({k: sf.get_tensor(k).to(dtype) for k in sf.keys() if not k.endswith("rotary_emb.inv_freq")})
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise SpecdecError(f"weights in {directory} do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    cfg = model.config
    model.rope_cos, model.rope_sin = (t.to(device) for t in rope_tables(cfg, cfg.max_position_embeddings))
    return model.eval()


def model_directory(path: Path, progress=print) -> Path:
    """A local .gguf file or HF directory -> an HF-layout directory."""
    if path.is_dir():
        return path
    if path.suffix != ".gguf":
        raise SpecdecError(f"{path} is neither a .gguf file nor a model directory")
    return convert_gguf(path, progress)
