"""Peers, run on the same prompts and token budget as our engine.

- HF transformers generate() on the same checkpoint in fp32 (a GGUF file's tensors dequantized in
  memory): plain, assisted (assistant_model) and prompt lookup (prompt_lookup_num_tokens).
- llama.cpp through llama-cpp-python (optional extra) on the original GGUF: plain and its
  prompt-lookup drafter. It runs quantized weights, so it is not the same work; its speedup is
  reported against its own plain decoding.
"""

from __future__ import annotations

import time

import torch

from specdec.errors import SpecdecError


def hf_model(source, share=None):
    """An HF transformers model of a .gguf file (its tensors dequantized to fp32 in memory, nothing on
    disk) or of an HF directory. share: our loaded torch reference module of the same file; HF then
    uses its very tensors (no second copy)."""
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForCausalLM
    source = Path(source)
    if source.is_dir():
        return AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    from specdec.model.loading import gguf_hf_config, gguf_state_dict, open_gguf
    gguf = open_gguf(source)
    cfg = gguf_hf_config(gguf)
    config = AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    shared = share is not None and share.weight_format == "torch" and share.dtype == torch.float32
    state = {k: v for k, v in share.state_dict().items()} if shared else gguf_state_dict(gguf, cfg)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    rotary = model.model.rotary_emb  # its inv_freq was made on the meta device: make it again
    model.model.rotary_emb = type(rotary)(config=config)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise SpecdecError(f"the HF model of {source} lacks weights: {missing[:5]}")
    return model.eval()


class HFBaseline:
    """Runs transformers' generate() on the same checkpoint in fp32."""

    def __init__(self, source, eos_ids: set[int], assistant_source=None, share=None):
        """share: our loaded module of the same checkpoint; HF uses its tensors where it is the fp32 reference."""
        self.model = hf_model(source, share)
        self.assistant = hf_model(assistant_source) if assistant_source is not None else None
        self.eos = sorted(eos_ids)

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, mode: str = "plain", k: int = 4,
                 temperature: float = 0.0, seed: int | None = None) -> tuple[list[int], float]:
        """mode: plain, assisted (assistant_model) or lookup (prompt_lookup_num_tokens)."""
        extra = {"plain": {}, "assisted": {"assistant_model": self.assistant, "num_assistant_tokens": k,
                                           "num_assistant_tokens_schedule": "constant"},
                 "lookup": {"prompt_lookup_num_tokens": k}}[mode]
        if temperature > 0:  # plain temperature sampling: switch off the checkpoint's default top-k/top-p
            extra.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            if seed is not None:
                torch.manual_seed(seed)
        else:
            extra.update(do_sample=False)
        x = torch.tensor([prompt])
        t0 = time.perf_counter()
        out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                  eos_token_id=self.eos, pad_token_id=self.eos[0], **extra)
        seconds = time.perf_counter() - t0
        return out[0, len(prompt):].tolist(), seconds


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class LlamaCppBaseline:
    """llama.cpp on the GGUF file itself, with as many threads as torch uses."""

    def __init__(self, gguf_path, eos_ids: set[int], n_ctx: int, threads: int | None = None):
        if not llama_cpp_available():
            raise SpecdecError("the llama.cpp methods need llama-cpp-python: pip install 'specdec[llamacpp]' "
                               "(it compiles llama.cpp, about 10 minutes)")
        if not str(gguf_path).endswith(".gguf"):
            raise SpecdecError(f"the llama.cpp methods need a .gguf model, got {gguf_path}")
        self.path, self.n_ctx = str(gguf_path), n_ctx
        self.threads = threads or torch.get_num_threads()
        self.eos = set(eos_ids)
        self.instances: dict[str, object] = {}

    def instance(self, mode: str, k: int):
        """One Llama per mode: llama-cpp-python fixes logits_all (needed to verify drafts) at construction,
        and it costs the plain path a full-vocabulary projection of every prompt row."""
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        if mode not in self.instances:
            draft = LlamaPromptLookupDecoding(num_pred_tokens=k) if mode == "lookup" else None
            # logits_all=True for lookup: llama-cpp-python sizes its score buffer from this argument, not
            # from the draft model, so without it prompts longer than n_batch overflow the buffer
            self.instances[mode] = Llama(model_path=self.path, n_ctx=self.n_ctx, n_threads=self.threads,
                                         n_threads_batch=self.threads, draft_model=draft,
                                         logits_all=mode == "lookup", verbose=False)
            self.eos.add(self.instances[mode].token_eos())
        llm = self.instances[mode]
        if mode == "lookup":
            llm.draft_model = LlamaPromptLookupDecoding(num_pred_tokens=k)
        return llm

    def generate(self, prompt: list[int], max_new_tokens: int, mode: str = "plain", k: int = 4,
                 temperature: float = 0.0, seed: int | None = None) -> tuple[list[int], float]:
        """mode: plain or lookup (llama-cpp-python's LlamaPromptLookupDecoding with k tokens)."""
        llm = self.instance(mode, k)
        llm.reset()  # no prompt-prefix reuse from the previous call: every method prefills alike
        if seed is not None:
            llm.set_seed(seed)
        sampling = {"temp": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0} if temperature > 0 else \
            {"temp": 0.0, "top_k": 1}
        tokens: list[int] = []
        t0 = time.perf_counter()
        for tok in llm.generate(prompt, reset=True, repeat_penalty=1.0, **sampling):
            tokens.append(tok)
            if tok in self.eos or len(tokens) >= max_new_tokens:
                break
        return tokens, time.perf_counter() - t0
