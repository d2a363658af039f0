"""/infill on llama-server and on specdec serve, the same bodies: prompt length, prompt text, greedy content."""
import json, subprocess, sys, time, os
from pathlib import Path
import httpx

HOME = os.environ["SPECDEC_HOME"]
MODEL = f"{HOME}/models/qwen2.5-coder-0.5b-instruct.gguf"
LLAMA = f"{HOME}/llama.cpp/src/build/bin/llama-server"
bodies = [
    {"input_prefix": "def mean(xs):\n    total = 0\n    for x in xs:\n", "input_suffix": "\n\nprint(mean([1, 2, 3]))\n",
     "input_extra": [{"filename": "util.py", "text": "def square(x):\n    return x * x\n"}], "prompt": "",
     "n_predict": 48, "temperature": 0},
    {"input_prefix": "import os\n\ndef list_py(root):\n    out = []\n", "input_suffix": "    return out\n",
     "input_extra": [], "prompt": "    for", "n_predict": 48, "temperature": 0, "n_indent": 4},
    {"input_prefix": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
     "input_suffix": "\n    def pop(self):\n        return self.items.pop()\n",
     "input_extra": [{"filename": "a.py", "text": "x = 1\n"}, {"filename": "b/c.py", "text": "<|fim_prefix|> y = 2\n"}],
     "n_predict": 32, "temperature": 0, "n_indent": 8},
]

def wait(url):
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise SystemExit("no server at " + url)

procs = [subprocess.Popen([LLAMA, "-m", MODEL, "--port", "8099", "-t", "2", "-c", "4096", "-np", "1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
wait("http://127.0.0.1:8099")
rows = []
for b in bodies:
    rows.append({"body": b, "llama": httpx.post("http://127.0.0.1:8099/infill", json=b, timeout=300).json()})
procs[0].terminate(); procs[0].wait()
ours = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--model", MODEL, "--ngram", "--port", "8098",
                         "--max-context", "4096"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wait("http://127.0.0.1:8098")
for row in rows:
    row["specdec"] = httpx.post("http://127.0.0.1:8098/infill", json=row["body"], timeout=300).json()
ours.terminate(); ours.wait()
for row in rows:
    l, s = row["llama"], row["specdec"]
    print(json.dumps({"tokens_evaluated": [l["tokens_evaluated"], s["tokens_evaluated"]],
                      "same_prompt": l["prompt"] == s["prompt"], "same_content": l["content"] == s["content"],
                      "stop_type": [l["stop_type"], s["stop_type"]], "llama": l["content"], "specdec": s["content"]}))
    if l["prompt"] != s["prompt"]:
        print("LLAMA PROMPT", repr(l["prompt"])); print("OURS  PROMPT", repr(s["prompt"]))
json.dump(rows, open(Path(__file__).with_name("compare.json"), "w"), indent=1)
