"""What a GGUF file's metadata says: the architectures we run, the tensor names of each and their HF
names, the HF-style config of the model (gguf_hf_config: transformers' keys, from which ModelConfig is
built), and the checks that the file holds what its architecture needs (a clear error naming the tensor
or the setting otherwise). loading.py reads the tensors."""

from __future__ import annotations

import numpy as np

from specdec.errors import SpecdecError
from specdec.model.gguf_file import GGUFFile
from specdec.model.transformer import GEMMA3_GLOBAL_EVERY, HF_FAMILY, ModelConfig

# GGUF general.architecture
SUPPORTED_ARCHS = {"llama", "qwen2", "qwen3", "qwen3moe", "mistral", "gemma2", "gemma3", "phi3", "smollm3", "granite",
                   "granitemoe", "olmo2", "olmoe"}
GGUF_MODEL_TYPES = {"gemma3": "gemma3_text", "qwen3moe": "qwen3_moe"}  # GGUF architectures named otherwise in HF
# families whose q/k rows llama.cpp's converter interleaves for its RoPE
PERMUTED_QK = {"llama", "mistral", "mixtral", "smollm3", "granite", "granitemoe"}
PARTIAL_ROPE_ARCHS = {"phi3"}  # RoPE on part of each head (rope.dimension_count < head_dim): Phi-4-mini
SMOLLM3_NOPE_EVERY = 4  # llama.cpp's smollm3: layer i takes no RoPE where (i + 1) % 4 == 0
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
# Gemma 3's norms around the attention and the MLP (HF's post_attention_layernorm is its attention output's)
GEMMA_LAYER_NAMES = {**GGUF_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                     "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
OUTPUT_NORM_ARCHS = {"gemma2", "gemma3", "olmo2"}  # the architectures whose layers hold GEMMA_LAYER_NAMES' norms
GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# the per-layer tensors each family needs (besides .weight), and those of the whole model
LAYER_TENSORS = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down"]
FAMILY_TENSORS = {"qwen3": ["attn_q_norm", "attn_k_norm"], "qwen3moe": ["attn_q_norm", "attn_k_norm"],
                  "olmoe": ["attn_q_norm", "attn_k_norm"],
                  "gemma2": ["post_attention_norm", "post_ffw_norm"],
                  "gemma3": ["attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"]}
# an architecture's per-layer tensors where they are not LAYER_TENSORS (Phi-3: q/k/v in one, gate and up in one;
# OLMo 2: no input norms, q/k norms over all the heads, and the branches' output norms)
ARCH_LAYER_TENSORS = {"phi3": ["attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"],
                      "olmo2": ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                                "attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"]}
# a mixture of experts' tensors: the router (HF's mlp.gate) and each of the experts' three matrices, stacked
# [experts, rows, K] in one tensor (HF: gate and up in one parameter, gate_up_proj, with no ".weight"); a
# layer of a model with experts (qwen3moe, or llama with an expert count: Mixtral) holds these for its MLP
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")  # gate, up, down
MOE_LAYER_TENSORS = LAYER_TENSORS[:6] + ["ffn_gate_inp", *EXPERT_TENSORS]
# architectures whose layers hold experts whatever the file's expert count says
EXPERT_ARCHS = {"qwen3moe", "granitemoe", "olmoe"}
GRANITE_ARCHS = {"granite", "granitemoe"}
# Granite's multipliers: HF's config names -> the GGUF keys under the architecture (llama.cpp's names)
GRANITE_KEYS = {"embedding_multiplier": "embedding_scale", "residual_multiplier": "residual_scale",
                "attention_multiplier": "attention.scale", "logits_scaling": "logit_scale"}
# tensors of an architecture holding several of our weights stacked along their rows, in this order (llama.cpp
# also reads a phi3 file with separate attn_q, attn_k and attn_v; its ffn_up always holds the gate, then up)
FUSED_TENSORS = {"phi3": {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_up": ("ffn_gate", "ffn_up")}}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight' (None if unknown), in the
    names of the family of GGUF architecture `arch`."""
    base, _, kind = gguf_name.rpartition(".")
    if base in GGUF_TOP_NAMES:
        return f"{GGUF_TOP_NAMES[base]}.{kind}"
    parts = base.split(".")
    names = GEMMA_LAYER_NAMES if arch in OUTPUT_NORM_ARCHS else GGUF_LAYER_NAMES
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{kind}"
    if len(parts) == 3 and parts[0] == "blk" and parts[2] == "ffn_gate_inp":
        return f"model.layers.{parts[1]}.mlp.gate.{kind}"
    return None


def family(cfg: dict) -> str:
    """The family (transformer.FAMILIES' key) of an HF-style config dict."""
    return HF_FAMILY.get(cfg["model_type"], cfg["model_type"])


def gguf_hf_config(gguf: GGUFFile) -> dict:
    """The HF-style config.json dict a GGUF file's metadata describes (transformers' keys; with Llama 3's
    RoPE factors from the rope_freqs tensor under "rope_freq_factors"). SpecdecError for an architecture
    we do not run, a missing tensor its family needs, or a RoPE variant we do not implement."""
    arch = gguf.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise SpecdecError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(SUPPORTED_ARCHS))}")
    f = lambda key, default=None: gguf.get(f"{arch}.{key}", default)  # noqa: E731
    if "token_embd.weight" not in gguf.tensors or f("block_count") is None:
        raise SpecdecError(f"{gguf.path} lacks the token embedding or the layer count; it is not a complete model")
    experts = int(f("expert_count", 0) or 0)
    _require_tensors(gguf, arch, int(f("block_count")), experts > 0 or arch in EXPERT_ARCHS)
    if arch in EXPERT_ARCHS and not experts:
        raise SpecdecError(f"{gguf.path} lacks {arch}.expert_count, which a {arch} model needs")
    heads, hidden = int(f("attention.head_count")), int(f("embedding_length"))
    head_dim = int(f("attention.key_length", hidden // heads))
    rotary = int(f("rope.dimension_count", head_dim))
    if rotary != head_dim and (arch not in PARTIAL_ROPE_ARCHS or not 0 < rotary < head_dim
                               or rotary % 2 or head_dim % 2):
        raise SpecdecError(f"{gguf.path}: RoPE on {rotary} of each head's {head_dim} dimensions (partial rotation) "
                           f"is not supported for {arch}" + (" (an even count below the head's is)"
                                                             if arch in PARTIAL_ROPE_ARCHS else ""))
    cfg = {
        "model_type": GGUF_MODEL_TYPES.get(arch, arch), "vocab_size": gguf.tensors["token_embd.weight"].rows,
        "hidden_size": hidden, "intermediate_size": int(f("feed_forward_length")),
        "num_hidden_layers": int(f("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(f("attention.head_count_kv", heads)),
        "head_dim": head_dim, "rms_norm_eps": float(f("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(f("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(f("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "torch_dtype": "float32",
        # the special tokens as the file names them (None where it does not: a class's default may lie
        # outside the vocabulary, which transformers refuses)
        **{f"{kind}_token_id": gguf.get(f"tokenizer.ggml.{key}_token_id")
           for kind, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))},
    }
    if rotary != head_dim:
        cfg["partial_rotary_factor"] = rotary / head_dim
    cfg.update(_gguf_rope(gguf, arch, cfg))
    if arch == "gemma3":
        cfg.update(_gguf_gemma3(gguf, cfg))
    if arch == "gemma2":
        cfg.update(_gguf_gemma2(gguf, cfg))
    if arch == "smollm3":  # llama.cpp leaves RoPE out of every fourth layer, whatever the HF config said
        cfg["no_rope_layers"] = [int((i + 1) % SMOLLM3_NOPE_EVERY != 0) for i in range(cfg["num_hidden_layers"])]
    if arch == "phi3":  # llama.cpp runs Phi-3's sliding_window key as full attention: so do we
        cfg["sliding_window"] = None
    if arch in GRANITE_ARCHS:
        cfg.update(_gguf_granite(gguf, arch, head_dim))
    if arch == "olmo2" and f("attention.sliding_window"):  # OLMo 3: the layers the file's pattern marks slide
        pattern = f("attention.sliding_window_pattern")  # llama.cpp's default: all but every fourth
        pattern = [(i + 1) % 4 != 0 for i in range(cfg["num_hidden_layers"])] if pattern is None else list(pattern)
        cfg.update(model_type="olmo3", sliding_window=int(f("attention.sliding_window")),
                   layer_types=["sliding_attention" if s else "full_attention" for s in pattern])
    if experts:  # llama.cpp renormalises the picked experts' weights for all but olmoe
        cfg.update(num_experts=experts, num_experts_per_tok=int(f("expert_used_count", 0)),
                   norm_topk_prob=arch != "olmoe",
                   moe_intermediate_size=int(f("expert_feed_forward_length", 0) or cfg["intermediate_size"]))
        if arch == "llama":
            cfg["model_type"] = "mixtral"
    try:
        model = ModelConfig.from_hf(cfg)
    except ValueError as e:  # a RoPE variant or size we do not run
        raise SpecdecError(f"{gguf.path}: {e}") from None
    _check_fused(gguf, arch, model)
    return cfg


def _gguf_granite(gguf: GGUFFile, arch: str, head_dim: int) -> dict:
    """Granite's multipliers under HF's names. One the file leaves out or sets to 0 is 1, as llama.cpp takes it,
    but the attention's scale is then 1 / sqrt(head_dim). SpecdecError for a shared expert (granitemoeshared)."""
    if gguf.get(f"{arch}.expert_shared_feed_forward_length"):
        raise SpecdecError(f"{gguf.path}: a Granite mixture with a shared expert (GraniteMoeShared) is not supported")
    cfg = {hf: float(gguf.get(f"{arch}.{key}") or 0.0) or 1.0 for hf, key in GRANITE_KEYS.items()}
    if not gguf.get(f"{arch}.attention.scale"):
        cfg["attention_multiplier"] = head_dim ** -0.5
    return cfg


def _require_tensors(gguf: GGUFFile, arch: str, layers: int, experts: bool = False) -> None:
    """SpecdecError naming the first tensor a model of `arch` with `layers` layers (their MLPs mixtures of
    experts where `experts`) needs and the file lacks (a fused tensor may be there as its separate parts,
    where the parts have names of their own)."""
    dense = ARCH_LAYER_TENSORS.get(arch, LAYER_TENSORS)
    per_layer = (MOE_LAYER_TENSORS if experts else dense) + FAMILY_TENSORS.get(arch, [])
    needed = ["output_norm"] + [f"blk.{i}.{n}" for i in range(layers) for n in per_layer]
    for name in needed:
        if f"{name}.weight" in gguf.tensors:
            continue
        prefix, _, kind = name.rpartition(".")
        parts = FUSED_TENSORS.get(arch, {}).get(kind, ())
        if parts and kind not in parts and all(f"{prefix}.{p}.weight" in gguf.tensors for p in parts):
            continue
        raise SpecdecError(f"{gguf.path} lacks the tensor {name}.weight, which a {arch} model needs; "
                           "the file is incomplete or of another layout")


def part_rows(module: str, cfg: ModelConfig) -> int:
    """Rows of one of our weights (its HF module name) in a fused tensor."""
    kv = cfg.num_kv_heads * cfg.head_dim
    return {"self_attn.q_proj": cfg.num_heads * cfg.head_dim, "self_attn.k_proj": kv, "self_attn.v_proj": kv,
            "mlp.gate_proj": cfg.intermediate_size, "mlp.up_proj": cfg.intermediate_size}[module]


def fused_rows(arch: str, kind: str, cfg: ModelConfig) -> list[int]:
    """Rows of each part of the fused GGUF tensor `kind` (FUSED_TENSORS) of architecture `arch`."""
    return [part_rows(GGUF_LAYER_NAMES[p], cfg) for p in FUSED_TENSORS[arch][kind]]


def _check_fused(gguf: GGUFFile, arch: str, model: ModelConfig) -> None:
    """SpecdecError naming a fused tensor whose rows are not its parts' (the sizes in the metadata)."""
    fused = FUSED_TENSORS.get(arch, {})
    for name, info in gguf.tensors.items():
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in fused:
            rows = sum(fused_rows(arch, parts[2], model))
            if (info.dims[0] if len(info.dims) == 1 else info.rows) != rows:
                raise SpecdecError(f"{gguf.path}: tensor {name} has {info.dims} elements; a {arch} model of these sizes "
                                   f"stacks {', '.join(fused[parts[2]])} in {rows}")


def _gguf_rope(gguf: GGUFFile, arch: str, cfg: dict) -> dict:
    """RoPE scaling of a GGUF file as HF config keys: linear (rope.scaling.type), Llama 3 (rope_freqs tensor),
    LongRoPE (Phi-3: rope_factors_long and rope_factors_short, rope.scaling.attn_factor)."""
    kind = gguf.get(f"{arch}.rope.scaling.type", "none")
    out = {}
    factors = lambda name: [float(v) for v in np.array(gguf.tensor(name), dtype=np.float32).reshape(-1)]  # noqa: E731
    if kind == "linear":
        out["rope_scaling"] = {"rope_type": "linear", "factor": float(gguf.get(f"{arch}.rope.scaling.factor"))}
    elif kind not in ("none", None):
        raise SpecdecError(f"{gguf.path}: RoPE scaling {kind!r} is not supported (none, linear, Llama 3's and "
                           "LongRoPE are)")
    if "rope_freqs.weight" in gguf.tensors:
        out["rope_freq_factors"] = factors("rope_freqs.weight")
    longrope = ("rope_factors_long.weight", "rope_factors_short.weight")
    if any(n in gguf.tensors for n in longrope):
        missing = [n for n in longrope if n not in gguf.tensors]
        if missing:
            raise SpecdecError(f"{gguf.path} lacks the tensor {missing[0]}, which LongRoPE needs (the file has "
                               f"the other of {' and '.join(longrope)})")
        original = int(gguf.get(f"{arch}.rope.scaling.original_context_length", cfg["max_position_embeddings"]))
        scaling = {"rope_type": "longrope", "long_factor": factors(longrope[0]), "short_factor": factors(longrope[1]),
                   "original_max_position_embeddings": original}
        attn = gguf.get(f"{arch}.rope.scaling.attn_factor")
        if attn is not None:  # else transformers' default from the ratio (the value llama.cpp's converter writes)
            scaling["attention_factor"] = float(attn)
        out["rope_scaling"], out["original_max_position_embeddings"] = scaling, original
    return out


def _gguf_gemma2(gguf: GGUFFile, cfg: dict) -> dict:
    """Gemma 2's keys as llama.cpp reads them: the two soft-caps, the window (4096 unless the file says)
    on every other layer from the first, the attention scale 1/sqrt(head_dim) but 1/sqrt(hidden/heads) for
    the 27B model (46 layers)."""
    f = lambda key, default=None: gguf.get(f"gemma2.{key}", default)  # noqa: E731
    layers = cfg["num_hidden_layers"]
    return {"hidden_activation": "gelu_pytorch_tanh",
            "attn_logit_softcapping": float(f("attn_logit_softcapping", 50.0)),
            "final_logit_softcapping": float(f("final_logit_softcapping", 30.0)),
            "query_pre_attn_scalar": cfg["hidden_size"] // cfg["num_attention_heads"] if layers == 46 else cfg["head_dim"],
            "sliding_window": int(f("attention.sliding_window", 4096) or 4096),
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]}


def _gguf_gemma3(gguf: GGUFFile, cfg: dict) -> dict:
    """Gemma 3's keys: its sliding window and which layers use it (llama.cpp's rule: every 6th layer is
    global unless the file says otherwise), the local RoPE base, the attention scale (llama.cpp's)."""
    f = lambda key, default=None: gguf.get(f"gemma3.{key}", default)  # noqa: E731
    layers, out = cfg["num_hidden_layers"], {"hidden_activation": "gelu_pytorch_tanh"}
    if f("final_logit_softcapping"):  # Gemma 2's final soft-cap, where a Gemma 3 file names one
        out["final_logit_softcapping"] = float(f("final_logit_softcapping"))
    # llama.cpp: 1/sqrt(head_dim), but hidden/heads for the 27B model (62 layers), as google's reference
    out["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if layers == 62 else cfg["head_dim"]
    local_theta = float(f("rope.freq_base_swa", 10000.0))
    full = {"rope_type": "default", "rope_theta": cfg["rope_theta"], **cfg.pop("rope_scaling", {})}
    out["rope_parameters"] = {"full_attention": full, "sliding_attention": {"rope_type": "default",
                                                                            "rope_theta": local_theta}}
    window = int(f("attention.sliding_window", 0) or 0)
    if window > 0:
        pattern = f("attention.sliding_window_pattern", GEMMA3_GLOBAL_EVERY)
        if isinstance(pattern, (int, np.integer)):
            local = [int(pattern) == 0 or i % int(pattern) < int(pattern) - 1 for i in range(layers)]
        else:
            local = [bool(v) for v in np.asarray(pattern)[:layers]]
        out["sliding_window"] = window
        out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in local]
    return out

def gguf_model_config(gguf: GGUFFile) -> ModelConfig:
    """The model's shape from a GGUF file's metadata (what load_gguf_blocks builds its Transformer with)."""
    return ModelConfig.from_hf(gguf_hf_config(gguf))
