"""Where a model load's time goes, against the libraries' own GGUF paths: torch's import, the header
parse (ours against gguf.GGUFReader), the tokenizer (its metadata decoded, then built: ours,
transformers' GGUF builder on the same metadata, and AutoTokenizer(gguf_file=)), the CPU backend's
model build, and the first prefill of a chat prompt.
One process; each timed once after the imports. Prints JSON.

Usage: python scripts/load_breakdown.py [--model qwen2.5-coder-1.5b-instruct] > runs/load-breakdown.json
"""

import argparse
import json
import subprocess
import sys
import time

import torch


def seconds(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3)


def torch_import_seconds() -> float:
    """`import torch` in a fresh interpreter, less the interpreter's own start."""
    def run(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - t0
    return round(min(run("import torch") for _ in range(3)) - min(run("pass") for _ in range(3)), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    args = ap.parse_args()
    import gguf
    from transformers import AutoTokenizer

    from specdec.model.gguf_file import GGUFFile
    from specdec.model.loading import load_gguf_blocks
    from specdec.model.registry import pull
    from specdec.model.tokenizer import encode_prompt, gguf_metadata, gguf_tokenizer
    path = pull(args.model)
    out = {"model": args.model, "threads": torch.get_num_threads(), "torch_import_s": torch_import_seconds()}
    f, out["header_ours_s"] = seconds(lambda: GGUFFile(path))
    _, out["header_gguf_reader_s"] = seconds(lambda: gguf.GGUFReader(str(path)))
    _, out["tokenizer_metadata_s"] = seconds(lambda: gguf_metadata(f))  # the vocabulary and merges decoded
    tok, out["tokenizer_ours_s"] = seconds(lambda: gguf_tokenizer(f))
    _, out["tokenizer_transformers_builder_s"] = seconds(lambda: gguf_tokenizer(f, transformers_only=True))
    ref, out["tokenizer_auto_gguf_file_s"] = seconds(lambda: AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
    ids = encode_prompt(tok, "Write a Python function that merges two sorted lists into one sorted list.", True)
    out["same_chat_ids"] = ids == encode_prompt(ref, "Write a Python function that merges two sorted lists into one sorted list.", True)
    f.forget_strings()
    model, out["model_build_s"] = seconds(lambda: load_gguf_blocks(f))
    cache = model.new_cache(2048)
    with torch.inference_mode():
        _, out["first_prefill_s"] = seconds(lambda: model(torch.tensor([ids]), cache, 0, last_only=True))
    out["prompt_tokens"] = len(ids)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
