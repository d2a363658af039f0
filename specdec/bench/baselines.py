"""Peers on the same fp32 checkpoint: HF transformers generate() plain, assisted and prompt lookup."""

from __future__ import annotations

import time

import torch


class HFBaseline:
    """Runs transformers' generate() on the HF-layout directory our loader reads (same fp32 weights)."""

    def __init__(self, directory, eos_ids: set[int], assistant_directory=None, share=None):
        """share: our loaded module of the same checkpoint; HF then uses its very tensors (no second copy)."""
        from transformers import AutoModelForCausalLM
        self.model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
        if share is not None:
            self.model.load_state_dict(share.state_dict(), strict=False, assign=True)
            self.model.tie_weights()
        self.assistant = None
        if assistant_directory is not None:
            self.assistant = AutoModelForCausalLM.from_pretrained(str(assistant_directory), dtype=torch.float32).eval()
        self.eos = sorted(eos_ids)

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, mode: str = "plain", k: int = 4) -> tuple[list[int], float]:
        """mode: plain, assisted (assistant_model) or lookup (prompt_lookup_num_tokens). Greedy."""
        extra = {"plain": {}, "assisted": {"assistant_model": self.assistant, "num_assistant_tokens": k,
                                           "num_assistant_tokens_schedule": "constant"},
                 "lookup": {"prompt_lookup_num_tokens": k}}[mode]
        x = torch.tensor([prompt])
        t0 = time.perf_counter()
        out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                  do_sample=False, eos_token_id=self.eos, pad_token_id=self.eos[0], **extra)
        seconds = time.perf_counter() - t0
        return out[0, len(prompt):].tolist(), seconds
