"""Next-token log-probabilities of ours against llama-server's on the same GGUF files, after real prompts.

  python logprobs_vs_llama.py OUT.json FILE [FILE ...]   (llama-server from $SPECDEC_LLAMA_BIN or the usual places)

For each file and each of the first 8 shipped code prompts (chat template applied), the largest
difference over llama-server's 8 most likely next tokens, and whether both engines' top token agree."""
import json
import sys
import tempfile
from pathlib import Path

import torch

from specdec.bench.llama_server import LlamaServer, find_binary
from specdec.model import load_model
from specdec.model.tokenizer import encode_messages

ROOT = Path(__file__).resolve().parents[4]
prompts = [json.loads(line)["prompt"] for line in open(ROOT / "specdec/data/code_prompts.jsonl")][:8]
out = {}
for path in sys.argv[2:]:
    loaded = load_model(path, device="cpu", progress=lambda *a: None)
    model, tok = loaded.module, loaded.tokenizer
    model.eval()
    server = LlamaServer(find_binary(), Path(path), None, 1024, 2, Path(tempfile.mkdtemp()) / "llama.log")
    rows = []
    try:
        for text in prompts:
            ids = encode_messages(tok, [{"role": "user", "content": text}])
            with torch.inference_mode():
                mine = torch.log_softmax(model(torch.tensor([ids]), model.new_cache(len(ids) + 8), 0)[0, -1], -1)
            top = server.complete({"prompt": ids, "n_predict": 1, "temperature": 0, "n_probs": 8,
                                   "cache_prompt": False})["completion_probabilities"][0]["top_logprobs"]
            rows.append({"max_diff": max(abs(t["logprob"] - float(mine[t["id"]])) for t in top),
                         "same_top": int(mine.argmax()) == top[0]["id"]})
    finally:
        server.close()
    diffs = [r["max_diff"] for r in rows]
    out[Path(path).name] = {"prompts": len(rows),
                            "mean_max_diff": sum(diffs) / len(diffs), "worst": max(diffs),
                            "same_top": sum(r["same_top"] for r in rows), "rows": rows}
    print(Path(path).name, json.dumps({k: v for k, v in out[Path(path).name].items() if k != "rows"}), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
