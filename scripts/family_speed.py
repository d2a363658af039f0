"""Plain decoding speed of each model family against llama.cpp's, on the same GGUF file.

No Llama 3, Qwen3, Phi-3, SmolLM3, Gemma 2, Granite or OLMo 2 GGUF is at hand here, so each is made:
transformers' own class in the real model's shape (Llama-3.2-1B, Qwen3-0.6B, Phi-3-mini, SmolLM3-3B,
Gemma-2-2B, Granite-3.3-2B, OLMo-2-0425-1B) with random weights and SmolLM2's byte-level vocabulary,
converted to Q8_0 by llama.cpp's own convert_hf_to_gguf.py. A decode step's arithmetic does not depend
on the weights' values, so tokens per second compare the engines on the family's code path; what the
random model says means nothing (the tokens are still compared: both engines should mostly agree). Then `specdec bench --methods plain,llama`
on each file, interleaved prompt by prompt.

Usage: python scripts/family_speed.py --families llama3,qwen3,phi3 --limit 3 --max-new-tokens 48 \
           --out runs/family-speed
Writes OUT/FAMILY/ (the bench's records and summary) and OUT/summary.json (tok/s per engine, ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HOME = Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec"))
LLAMA_CPP = HOME / "llama.cpp" / "src"
PHI3_CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
                      "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

SHAPES = {  # transformers config class, model class, the real model's shape
    "llama3": ("LlamaConfig", "LlamaForCausalLM", "Llama-3.2-1B",
               dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, max_position_embeddings=131072,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3-0.6B",
              dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "Phi-3-mini-4k",
             dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, tie_word_embeddings=False, max_position_embeddings=4096,
                  original_max_position_embeddings=4096, sliding_window=None)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", "SmolLM3-3B",  # every fourth layer without RoPE
                dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                     num_key_value_heads=4, head_dim=128, tie_word_embeddings=True, max_position_embeddings=65536,
                     rope_theta=5000000.0, pad_token_id=None, bos_token_id=None, eos_token_id=None)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "Gemma-2-2B",  # soft-capped attention: torch, not the C loop
               dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                    num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True,
                    max_position_embeddings=8192, pad_token_id=None, bos_token_id=None, eos_token_id=None)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", "Granite-3.3-2B",  # the four multipliers
                dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=True, max_position_embeddings=131072,
                     rope_theta=10000000.0, embedding_multiplier=12.0, residual_multiplier=0.22,
                     attention_multiplier=0.015625, logits_scaling=8.0, pad_token_id=None, bos_token_id=None,
                     eos_token_id=None)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "OLMo-2-0425-1B",  # output norms only, q/k norms over all heads
              dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
                   num_key_value_heads=16, tie_word_embeddings=False, max_position_embeddings=4096,
                   rope_theta=500000.0, pad_token_id=None, bos_token_id=None, eos_token_id=None)),
}
# the converter reads a Gemma 2 vocabulary as SentencePiece only; SmolLM2's byte-level BPE goes as GPT-2's
GEMMA2_BPE = ("import sys; sys.argv[0] = 'convert_hf_to_gguf.py'; import convert_hf_to_gguf as c; "
              "from conversion.gemma import Gemma2Model; Gemma2Model.set_vocab = lambda self: self._set_vocab_gpt2(); "
              "c.main()")


def make_gguf(family: str, work: Path) -> Path:
    """The family's random-weight model in its real shape, as a Q8_0 GGUF file converted by llama.cpp."""
    import torch
    import transformers as tf
    from transformers import PreTrainedTokenizerFast

    from specdec.model.gguf_file import GGUFFile
    from specdec.model.registry import pull
    from specdec.model.tokenizer import gguf_tokenizer
    out = work / f"{family}-q8_0.gguf"
    if out.is_file():
        return out
    config_cls, model_cls, _, shape = SHAPES[family]
    d = work / f"{family}-hf"
    tok = gguf_tokenizer(GGUFFile(pull("smollm2-135m-instruct")))  # a byte-level BPE the converter knows
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok.backend, bos_token=tok.bos_token, eos_token=tok.eos_token)
    hf_tok.chat_template = PHI3_CHAT_TEMPLATE if family == "phi3" else tok.chat_template
    hf_tok.save_pretrained(d)
    if family == "phi3":  # the converter takes a Phi-3 vocabulary as byte-level BPE by this class name
        config = json.loads((d / "tokenizer_config.json").read_text())
        config.update(tokenizer_class="GPT2Tokenizer")
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    cfg = getattr(tf, config_cls)(vocab_size=len(tok), **shape)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = getattr(tf, model_cls)(cfg).to(torch.bfloat16)  # its own init: normal(0, 0.02), norms 1
    model.save_pretrained(d)
    del model
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LLAMA_CPP / "gguf-py"), str(LLAMA_CPP)])}
    converter = ["-c", GEMMA2_BPE] if family == "gemma2" else [str(LLAMA_CPP / "convert_hf_to_gguf.py")]
    subprocess.run([sys.executable, *converter, str(d), "--outtype", "q8_0",
                    "--outfile", str(out),
                    "--model-name", "random-weights"], env=env, check=True, stdout=subprocess.DEVNULL)
    for f in d.glob("*.safetensors"):
        f.unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="llama3,qwen3,phi3")
    ap.add_argument("--limit", type=int, default=3, help="code prompts per family")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default="runs/family-speed")
    args = ap.parse_args()
    unknown = sorted(set(args.families.split(",")) - set(SHAPES))
    if unknown:
        ap.error(f"unknown families {unknown}; choose from {', '.join(SHAPES)}")
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"family_speed: llama.cpp's converter is absent ({LLAMA_CPP}); run scripts/llama_cpp.sh build")
    out = Path(args.out)
    work = HOME / "family-speed"
    work.mkdir(parents=True, exist_ok=True)
    summary = {"command": "python scripts/family_speed.py " + " ".join(sys.argv[1:]), "families": {}}
    for family in args.families.split(","):
        t0 = time.time()
        path = make_gguf(family, work)
        print(f"{family}: {path} ({path.stat().st_size / 1e9:.2f} GB, made in {time.time() - t0:.0f} s)", flush=True)
        run = out / family
        subprocess.run([sys.executable, "-m", "specdec.cli", "bench", "--model", str(path), "--methods", "plain,llama",
                        "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens), "--no-plots",
                        "--out", str(run)], check=True, stdout=subprocess.DEVNULL)
        s = json.loads((run / "summary.json").read_text())
        rows = {m: s["methods"][m] for m in ("plain", "llama")}
        speed = {m: r["tokens_per_second_total"] for m, r in rows.items()}
        summary["families"][family] = {"shape": SHAPES[family][2], "file_gb": round(path.stat().st_size / 1e9, 2),
                                       "tok_s": speed, "ours_over_llama": round(speed["plain"] / speed["llama"], 3)}
        print(json.dumps({family: summary["families"][family]}), flush=True)
    info = Path("/proc/cpuinfo").read_text().splitlines()
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in info if ":" in line)}
    summary["cpu"] = f"{os.cpu_count()} cores of {field.get('model name')}, CPU family {field.get('cpu family')}"
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
