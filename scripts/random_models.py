"""Random-weight HF directories in Qwen2.5-Coder-1.5B's and 0.5B's shapes (q15, q05), for GPU runs that the
real files cannot reach (a GPU machine here receives at most 64 MiB): speed is real, acceptance is not.

    python3 scripts/random_models.py OUT_DIR --tokenizer TOKENIZER_DIR [--scale 0.25] [--device cuda]

TOKENIZER_DIR: a byte-level BPE tokenizer saved as an HF directory (transformers picks the tokenizer class
by the model type, Qwen2's, which reads a BPE's vocabulary and merges); the models take its vocabulary and
files. --scale < 1: smaller models (a dry run on a CPU); --device: where the random draws run. Before a GPU
session, on this machine, write the target's own tokenizer (11 MB) into the working tree to carry there:

    python3 scripts/random_models.py --export-tokenizer qwen2.5-coder-1.5b-instruct gpu-tokenizer
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdec.errors import SpecdecError

SHAPES = {"q15": (1536, 8960, 28, 12, 2), "q05": (896, 4864, 24, 14, 2)}  # hidden, mlp, layers, heads, kv heads


def export_tokenizer(model: str, out: Path) -> None:
    """A registry model's or GGUF file's tokenizer saved as an HF directory."""
    from transformers import PreTrainedTokenizerFast

    from specdec.model.gguf_file import GGUFFile
    from specdec.model.registry import resolve_model
    from specdec.model.tokenizer import gguf_tokenizer
    tok = gguf_tokenizer(GGUFFile(resolve_model(model)))
    PreTrainedTokenizerFast(tokenizer_object=tok.backend, bos_token=tok.bos_token, eos_token=tok.eos_token,
                            unk_token=tok.unk_token, pad_token=tok.pad_token).save_pretrained(str(out))


def write_model(d: Path, shape: tuple, vocab: int, scale: float, device: str, seed: int) -> float:
    """One Qwen2 HF directory of random bf16 weights; returns its parameters in billions."""
    h, m, n, heads, kv = shape
    hd = h // heads
    if scale < 1:  # fewer heads of the same size (a multiple of the kv heads), fewer layers, a narrower MLP
        heads = max(kv, int(heads * scale) // kv * kv)
        h, m, n = heads * hd, int(m * scale), max(2, int(n * scale))
    g = torch.Generator(device).manual_seed(seed)

    def rnd(*size, std=0.02):
        return (torch.randn(*size, generator=g, device=device) * std).to(torch.bfloat16).cpu()
    ones = lambda: torch.ones(h, dtype=torch.bfloat16)  # noqa: E731
    state = {"model.embed_tokens.weight": rnd(vocab, h), "model.norm.weight": ones()}
    for i in range(n):
        p = f"model.layers.{i}."
        state |= {p + "input_layernorm.weight": ones(), p + "post_attention_layernorm.weight": ones(),
                  p + "self_attn.q_proj.weight": rnd(heads * hd, h), p + "self_attn.q_proj.bias": rnd(heads * hd),
                  p + "self_attn.k_proj.weight": rnd(kv * hd, h), p + "self_attn.k_proj.bias": rnd(kv * hd),
                  p + "self_attn.v_proj.weight": rnd(kv * hd, h), p + "self_attn.v_proj.bias": rnd(kv * hd),
                  p + "self_attn.o_proj.weight": rnd(h, heads * hd), p + "mlp.gate_proj.weight": rnd(m, h),
                  p + "mlp.up_proj.weight": rnd(m, h), p + "mlp.down_proj.weight": rnd(h, m)}
    d.mkdir(parents=True, exist_ok=True)
    save_file(state, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": vocab, "hidden_size": h,
        "intermediate_size": m, "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": kv,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    return sum(v.numel() for v in state.values()) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, help="an HF tokenizer directory: its vocabulary and files")
    ap.add_argument("--export-tokenizer", metavar="MODEL", help="instead: save MODEL's tokenizer (a registry name "
                    "or .gguf) as an HF directory at OUT")
    ap.add_argument("--scale", type=float, default=1.0, help="< 1: smaller models (a dry run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.export_tokenizer:
        try:
            return export_tokenizer(args.export_tokenizer, args.out)
        except SpecdecError as e:
            raise SystemExit(f"random_models: {e}")
    tok = args.tokenizer
    if tok is None:
        raise SystemExit("random_models: give --tokenizer DIR (or --export-tokenizer MODEL to write one)")
    if not tok.is_dir():
        raise SystemExit(f"random_models: {tok} is not a tokenizer directory")
    from transformers import AutoTokenizer
    vocab = len(AutoTokenizer.from_pretrained(str(tok)))
    for name, shape in SHAPES.items():
        t0 = time.time()
        billions = write_model(args.out / name, shape, vocab, args.scale, args.device, len(name) + shape[0])
        for f in tok.iterdir():
            shutil.copy(f, args.out / name / f.name)
        print(f"{name}: {billions:.2f} B parameters in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
