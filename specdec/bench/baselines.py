"""HF transformers as a peer, run on the same prompts and token budget as our engine: generate() on the
same checkpoint in fp32 (a GGUF file's tensors dequantized in memory): plain, assisted (assistant_model)
and prompt lookup (prompt_lookup_num_tokens). llama.cpp's peer is its own server: llama_server.py.
"""

from __future__ import annotations

import time

import torch

from specdec.config import SamplingParams
from specdec.errors import SpecdecError
from specdec.model.gguf_config import gguf_hf_config
from specdec.model.loading import gguf_state_dict, hf_state_dict, open_gguf


def hf_model(source, share=None):
    """An HF transformers model of a .gguf file (its tensors dequantized to fp32 in memory, nothing on
    disk) or of an HF directory. share: our loaded torch reference module of the same file; HF then
    uses its very tensors (no second copy)."""
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForCausalLM
    source = Path(source)
    if source.is_dir():
        return AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    gguf = open_gguf(source)
    cfg = gguf_hf_config(gguf)
    config = AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    shared = share is not None and share.weight_format == "torch" and share.dtype == torch.float32
    state = hf_state_dict({k: v for k, v in share.state_dict().items()} if shared else gguf_state_dict(gguf, cfg), cfg)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    rotary = model.model.rotary_emb  # its inv_freq was made on the meta device: make it again
    model.model.rotary_emb = type(rotary)(config=config)
    embed = model.model.embed_tokens
    if getattr(embed, "embed_scale", None) is not None and embed.embed_scale.is_meta:  # Gemma's, made on meta too
        embed.embed_scale = torch.tensor(config.hidden_size ** 0.5)
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
                 sampling: SamplingParams = SamplingParams()) -> tuple[list[int], float]:
        """mode: plain, assisted (assistant_model) or lookup (prompt_lookup_num_tokens); sampling: its
        temperature, top-k, top-p, min-p and repetition penalty (HF's has ours' definition) are passed on,
        the checkpoint's own defaults switched off (run_comparison refuses the other settings for HF)."""
        extra = {"plain": {}, "assisted": {"assistant_model": self.assistant, "num_assistant_tokens": k,
                                           "num_assistant_tokens_schedule": "constant"},
                 "lookup": {"prompt_lookup_num_tokens": k}}[mode]
        extra.update(repetition_penalty=sampling.repetition_penalty)
        if not sampling.greedy:
            extra.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k,
                         top_p=sampling.top_p, min_p=sampling.min_p or None)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        else:
            extra.update(do_sample=False)
        x = torch.tensor([prompt])
        t0 = time.perf_counter()
        out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                  eos_token_id=self.eos, pad_token_id=self.eos[0], **extra)
        seconds = time.perf_counter() - t0
        return out[0, len(prompt):].tolist(), seconds
