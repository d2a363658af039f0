"""`specdec generate`: one request through the engine the builder (engine.build) makes."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from specdec.config import GenerationConfig
from specdec.constraints import Grammars
from specdec.engine.build import Builder, EnginePlan, log
from specdec.engine.engine import Engine, GenerationResult
from specdec.errors import SpecdecError
from specdec.model import LoadedModel
from specdec.model.tokenizer import encode_infill, encode_prompt
from specdec.settings import DraftingSettings, ModelSettings

__all__ = ["Runner", "log", "stream_printer"]


@dataclass
class Runner:
    target: LoadedModel
    engine: Engine
    cfg: GenerationConfig
    method: str
    grammars: object | None = None  # specdec.constraints.Grammars, built at the first structured answer

    @staticmethod
    def build(model: ModelSettings, drafting: DraftingSettings, cfg: GenerationConfig) -> "Runner":
        # the draft model loads after the answer's first token, when its drafter starts (or never, where
        # the policy keeps the request plain)
        builder, chosen = Builder.from_settings(model, drafting, defer_draft=True)
        engine = builder.engine(chosen, EnginePlan.of(drafting))  # one request at a time
        k_text = f"k<={drafting.k} adaptive" if drafting.adaptive and engine.speculative else f"k={drafting.k}"
        return Runner(builder.target, engine, cfg, builder.label(chosen, engine.drafter, k_text))

    def generate(self, prompt: str, chat: bool = False, on_tokens=None, structure=None,
                 suffix: str | None = None) -> GenerationResult:
        """structure: a specdec.constraints.ConstraintSpec the answer must match, or None; suffix: the text
        after a gap the answer fills (the prompt: the text before it), or None."""
        if suffix is not None:
            if chat:
                raise SpecdecError("--infill fills a gap in raw text; drop --chat")
            ids = encode_infill(self.target.tokenizer, prompt, suffix)
        else:
            ids = encode_prompt(self.target.tokenizer, prompt, chat)
        return self.engine.generate(ids, self.cfg, self.target.eos_ids, on_tokens, self.constraint(structure))

    def constraint(self, structure):
        """A fresh grammar state for `structure` (None for None); the grammar engine's view of the
        vocabulary is built at the first (about a second for 150k tokens)."""
        if structure is None:
            return None
        if self.grammars is None:
            self.grammars = Grammars.for_tokenizer(self.target.tokenizer, self.engine.target.config.vocab_size,
                                                   self.target.eos_ids)
        return self.grammars.constraint(structure)


def stream_printer(tokenizer):
    """A callback that prints newly accepted text as it arrives (decoding the whole output so far)."""
    seen: list[int] = []
    printed = [0]

    def on_tokens(new: list[int]) -> None:
        seen.extend(new)
        text = tokenizer.decode(seen, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next tokens
            return
        sys.stdout.write(text[printed[0]:])
        sys.stdout.flush()
        printed[0] = len(text)

    return on_tokens
