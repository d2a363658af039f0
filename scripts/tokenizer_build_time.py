"""Where building a GGUF's tokenizer goes: decoding the vocabulary and merges from the metadata, the
vocabulary dict, splitting the merges, the tokenizers library's BPE model, and the whole build
(byte_bpe.build_backend). Run it several times; the first run also pays torch's import in "open".

Usage: python scripts/tokenizer_build_time.py [--model qwen2.5-coder-1.5b-instruct]
"""

import argparse
import json
import re
import time

from specdec.model import tokenizer as T
from specdec.model.byte_bpe import build_backend, byte_alphabet
from specdec.model.gguf_file import GGUFFile
from specdec.model.registry import model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    args = ap.parse_args()
    from tokenizers import models
    t = [time.perf_counter()]
    g = GGUFFile(model_path(args.model))
    tokens = g.get("tokenizer.ggml.tokens")
    t.append(time.perf_counter())
    merges = g.get("tokenizer.ggml.merges")
    t.append(time.perf_counter())
    info, _ = T.gguf_metadata(g)
    spelling = byte_alphabet()
    foreign = re.compile("[^" + re.escape("".join(sorted(set(spelling.values())))) + "]").search
    t.append(time.perf_counter())
    vocab = {(s if not foreign(s) else "".join(spelling[b] for b in s.encode("utf-8"))): i for i, s in enumerate(tokens)}
    t.append(time.perf_counter())
    pairs = [tuple(m.split(" ")) for m in merges]
    t.append(time.perf_counter())
    models.BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
               fuse_unk=False)
    t.append(time.perf_counter())
    build_backend(info)
    t.append(time.perf_counter())
    names = ("tokens_decode", "merges_decode", "metadata", "vocab_dict", "merges_split", "bpe_model", "full_build")
    print(json.dumps({n: round(b - a, 3) for n, a, b in zip(names, t, t[1:])}))


if __name__ == "__main__":
    main()
