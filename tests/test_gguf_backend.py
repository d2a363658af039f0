"""The CPU backend on a GGUF file's own blocks through its memory map: the file parses (or fails
clearly), layers read views of the map with no fp32 copy, the model is close to the dequantized
torch reference, a verify row is a one-token step bit for bit, and loading writes nothing to disk."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from specdec.errors import SpecdecError
from specdec.model import cpu_kernels
from specdec.model.gguf_file import GGUFFile
from specdec.model.loading import load_gguf_blocks, load_gguf_reference, use_gguf_blocks
from specdec.model.quant import QuantEmbedding, QuantLinear, first_rows
from tests.conftest import TINY_VOCAB, tiny_model, write_tiny_gguf
from tests.test_quant_q8 import reference_sym

kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")

VARIANTS = {  # name: (arch, format, tiny_model overrides)
    "llama-q8_0-tied": ("llama", "Q8_0", dict(tie_word_embeddings=True)),
    "qwen2-q8_0-bias": ("qwen2", "Q8_0", dict(attention_bias=True)),
    "qwen2-q5_0": ("qwen2", "Q5_0", dict(attention_bias=True)),
    "qwen2-q4_k": ("qwen2", "Q4_K", dict(hidden_size=256, intermediate_size=512, head_dim=64, attention_bias=True)),
    "llama-q6_k": ("llama", "Q6_K", dict(hidden_size=256, intermediate_size=512, head_dim=64)),
    "llama-q5_k-tied": ("llama", "Q5_K", dict(hidden_size=256, intermediate_size=512, head_dim=64, tie_word_embeddings=True)),
    "llama-iq4_xs": ("llama", "IQ4_XS", dict(hidden_size=256, intermediate_size=512, head_dim=64)),
    "qwen2-q3_k": ("qwen2", "Q3_K", dict(hidden_size=256, intermediate_size=512, head_dim=64, attention_bias=True)),
    "llama-q2_k-tied": ("llama", "Q2_K", dict(hidden_size=256, intermediate_size=512, head_dim=64, tie_word_embeddings=True)),
    "qwen2-iq3_s": ("qwen2", "IQ3_S", dict(hidden_size=256, intermediate_size=512, head_dim=64, attention_bias=True)),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny_gguf(request, tmp_path_factory):
    arch, fmt, overrides = VARIANTS[request.param]
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf", tiny_model(4, **overrides),
                           arch, fmt)


def test_the_header_parses_and_tensors_are_views_of_the_map(tiny_gguf):
    f = GGUFFile(tiny_gguf)
    arch = f.get("general.architecture")
    assert f.get(f"{arch}.block_count") == 2
    embd = f.tensors["token_embd.weight"]
    assert embd.rows == TINY_VOCAB and embd.dims[0] in (64, 256)
    view = f.tensor("token_embd.weight")
    assert np.shares_memory(view, f.map) and view.shape[0] == TINY_VOCAB
    norm = f.tensor("blk.0.attn_norm.weight")
    assert norm.dtype == np.float32 and norm.shape == (embd.dims[0],)


def test_the_type_table_is_the_gguf_packages():
    """Our table of block sizes (kept so that start-up need not import gguf) against the package's own."""
    from gguf.constants import GGML_QUANT_SIZES
    from specdec.model.gguf_file import TYPE_SIZES
    assert TYPE_SIZES == {int(t): tuple(size) for t, size in GGML_QUANT_SIZES.items()}


@pytest.mark.parametrize("damage", ["truncated", "not gguf", "empty"])
def test_a_damaged_file_is_a_clear_error(tiny_gguf, tmp_path, damage):
    data = tiny_gguf.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes({"truncated": data[:len(data) // 2], "not gguf": b"PK\x03\x04" + data[4:], "empty": b""}[damage])
    with pytest.raises(SpecdecError, match="not a readable GGUF file"):
        GGUFFile(bad)


@kernel
def test_profile_runs_on_the_blocks(tiny_gguf):
    """`specdec profile` on the default CPU mode: a target whose layers and head are GGUF blocks."""
    from specdec.bench.profile import profile
    q8 = load_gguf_blocks(GGUFFile(tiny_gguf))
    r = profile(q8, q8, context=32, repeats=1, bandwidth_mb=16)
    assert r["weight_dtype"] == "gguf-q8" and r["verify_cost"]["1"] == 1.0 and r["draft_cost_ratio"] > 0


@kernel
def test_the_backend_is_close_to_the_reference_and_rows_are_steps(tiny_gguf):
    f = GGUFFile(tiny_gguf)
    ref, q8 = load_gguf_reference(f, torch.device("cpu"), torch.float32), load_gguf_blocks(f)
    assert q8.weight_format == "gguf-q8" and ref.weight_format == "torch"
    assert q8.layer_loop is not None  # every layer on blocks: the layer loop runs in C
    torch.manual_seed(0)
    prompt, new = torch.randint(0, TINY_VOCAB, (1, 24)), torch.randint(0, TINY_VOCAB, (1, 6))
    cr, cq = ref.new_cache(64), q8.new_cache(64)
    a, b = ref(prompt, cr, 0), q8(prompt, cq, 0)
    tv = 0.5 * (b[0].softmax(-1) - a[0].softmax(-1)).abs().sum(-1)  # [T] total variation per position
    # 8-bit activations: close, not equal (0.000-0.052 over these files, each layer within 1% of fp32 on the
    # same weights; a wrong mapping gives ~1)
    assert tv.median().item() < 0.1
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.9
    verify = q8(new, cq, 24)
    steps = torch.cat([q8(new[:, i:i + 1], cq, 24 + i) for i in range(6)], dim=1)
    assert torch.equal(steps, verify)  # a verify row is a one-token step, bit for bit
    assert torch.equal(q8(prompt[:, :10], q8.new_cache(64), 0), b[:, :10])  # nor on the prefill's length


@kernel
def test_layers_read_the_map_without_fp32_copies(tiny_gguf):
    f = GGUFFile(tiny_gguf)
    q8 = load_gguf_blocks(f, repack=False)
    linears = [m for m in q8.modules() if isinstance(m, QuantLinear)]
    assert len(linears) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the head
    assert not any(isinstance(m, torch.nn.Linear) for m in q8.modules())
    assert all(p.dtype == torch.float32 and p.dim() == 1 for p in q8.parameters())  # norms and biases only
    base, size = f.map.ctypes.data, f.map.size
    in_map = lambda t: base <= t.data_ptr() < base + size  # noqa: E731
    mlp = q8.model.layers[0].mlp.gate_up_proj
    assert len(mlp.parts) == 1 and in_map(mlp.parts[0][1])  # gate and up lie side by side: one view
    assert all(in_map(d) for _, d in q8.model.layers[1].mlp.down_proj.parts)
    assert isinstance(q8.model.embed_tokens, QuantEmbedding) and in_map(q8.model.embed_tokens.blocks)
    if q8.config.tie_word_embeddings:
        assert q8.lm_head.parts[0][1].data_ptr() == q8.model.embed_tokens.blocks.data_ptr()


@kernel
def test_repacked_layers_are_the_mapped_ones_in_tiles(tiny_gguf):
    """By default every matrix our kernels read (but IQ3_S's) is repacked at load (new memory, not the map); each
    layer gives, on the same inputs, the mapped blocks' output within fp32 rounding (the same integers,
    other float order), and a verify row is still a one-token step, bit for bit. (Whole forwards are not
    compared: a difference of one fp32 rounding can move an activation across an 8-bit rounding
    boundary, and the next layer then differs by a quantization step.)"""
    f = GGUFFile(tiny_gguf)
    mapped, packed = load_gguf_blocks(GGUFFile(tiny_gguf), repack=False), load_gguf_blocks(f)
    base, size = f.map.ctypes.data, f.map.size
    layers = [m for m in packed.modules() if isinstance(m, QuantLinear)]
    repackable = set(cpu_kernels.QUANT_TYPES.values()) - {cpu_kernels.QUANT_TYPES["IQ3_S"]}  # raw blocks
    for m, o in zip(layers, [m for m in mapped.modules() if isinstance(m, QuantLinear)]):
        for (t, d), (ot, _) in zip(m.parts, o.parts):
            assert (t == cpu_kernels.repacked_type(ot)) == (ot in repackable)
            assert t not in cpu_kernels.REPACKED_TYPES.values() or not base <= d.data_ptr() < base + size
    torch.manual_seed(0)
    for m, o in zip(layers, [m for m in mapped.modules() if isinstance(m, QuantLinear)]):
        x = torch.randn(7, m.in_features)
        a, b = o(x), m(x)
        assert (a - b).abs().max().item() <= 1e-5 * a.abs().max().item()
    prompt, new = torch.randint(0, TINY_VOCAB, (1, 20)), torch.randint(0, TINY_VOCAB, (1, 5))
    packed(prompt, cq := packed.new_cache(32), 0)
    verify = packed(new, cq, 20)
    assert torch.equal(verify, torch.cat([packed(new[:, i:i + 1], cq, 20 + i) for i in range(5)], dim=1))


@kernel
def test_the_embedding_and_a_truncated_head_match_the_reference(tiny_gguf):
    f = GGUFFile(tiny_gguf)
    ref, q8 = load_gguf_reference(f, torch.device("cpu"), torch.float32), load_gguf_blocks(f)
    ids = torch.tensor([[0, 5, TINY_VOCAB - 1, 5]])
    assert torch.equal(q8.model.embed_tokens(ids), ref.model.embed_tokens(ids))  # dequantized exactly
    cut = first_rows(q8.lm_head, 40)
    x = torch.randn(1, 3, q8.config.hidden_size)
    assert cut.out_features == 40 and torch.equal(cut(x), q8.lm_head(x)[..., :40])
    assert cut.parts[0][1].data_ptr() == q8.lm_head.parts[0][1].data_ptr()  # a view


def test_weight_dtype_choice(tmp_path, monkeypatch):
    cpu, gguf, hf = torch.device("cpu"), tmp_path / "m.gguf", tmp_path / "hf"
    monkeypatch.setattr(cpu_kernels, "available", lambda: True)
    assert use_gguf_blocks(cpu, None, gguf) and use_gguf_blocks(cpu, "auto", gguf) and use_gguf_blocks(cpu, "gguf-q8", gguf)
    assert not use_gguf_blocks(cpu, "float32", gguf)
    assert not use_gguf_blocks(cpu, None, hf)  # auto: the reference where blocks cannot be had
    assert not use_gguf_blocks(torch.device("cuda"), None, gguf)
    with pytest.raises(SpecdecError, match="not a .gguf file"):
        use_gguf_blocks(cpu, "gguf-q8", hf)
    with pytest.raises(SpecdecError, match="the CPU backend, not cuda"):
        use_gguf_blocks(torch.device("cuda"), "gguf-q8", gguf)
    with pytest.raises(SpecdecError, match="unknown --weight-dtype"):
        use_gguf_blocks(cpu, "bfloat16", gguf)
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    assert not use_gguf_blocks(cpu, None, gguf)
    with pytest.raises(SpecdecError, match="needs our CPU kernels"):
        use_gguf_blocks(cpu, "gguf-q8", gguf)


@pytest.mark.real
@kernel
def test_loading_writes_nothing_and_maps_the_file(smollm2_path, tmp_path, monkeypatch):
    """A load reads the file where it lies: nothing is written under SPECDEC_HOME (the kernel build
    aside), and the weights' pages are the file's (resident memory well under an fp32 copy's)."""
    from specdec.bench.profile import weight_bytes
    from specdec.model import load_model
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    monkeypatch.setenv("SPECDEC_KERNEL_DIR", str(tmp_path / "kernels"))
    lm = load_model(str(smollm2_path), device="cpu", progress=lambda *a: None)
    assert lm.module.weight_format == "gguf-q8"
    assert not home.exists() or not any(home.rglob("*"))
    assert weight_bytes(lm.module) <= os.path.getsize(smollm2_path)  # the blocks themselves (fp32: about 4x)


@kernel
def test_q5_0_reencoded_as_q8_0_holds_the_same_weights():
    from specdec.model.quant import reencode_q5_0_as_q8_0
    from tests.conftest import random_blocks
    q5, q8 = cpu_kernels.QUANT_TYPES["Q5_0"], cpu_kernels.QUANT_TYPES["Q8_0"]
    data = torch.from_numpy(random_blocks("Q5_0", 37, 32 * 27, seed=5))
    again = reencode_q5_0_as_q8_0(data)
    assert again.shape == (37, 27 * 34)
    a, b = cpu_kernels.quant_dequantize(q5, data, 32 * 27), cpu_kernels.quant_dequantize(q8, again, 32 * 27)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@kernel
def test_a_draft_model_loads_re_encoded(tmp_path):
    """load_gguf_blocks(reencode=True): the Q5_0 layers become Q8_0 holding the same weights; the
    logits stay close to the stored format's (only the order of float operations differs)."""
    path = write_tiny_gguf(tmp_path / "q5.gguf", tiny_model(4, attention_bias=True), "qwen2", "Q5_0")
    stored, again = load_gguf_blocks(GGUFFile(path), repack=False), load_gguf_blocks(GGUFFile(path), reencode=True, repack=False)
    types = lambda m: {q for x in m.modules() if isinstance(x, QuantLinear) for q, _ in x.parts}  # noqa: E731
    assert types(stored) == {cpu_kernels.QUANT_TYPES["Q5_0"]} and types(again) == {cpu_kernels.QUANT_TYPES["Q8_0"]}
    x = torch.randint(0, TINY_VOCAB, (1, 12))
    a, b = stored(x, stored.new_cache(16), 0), again(x, again.new_cache(16), 0)
    assert (a - b).abs().max().item() < 0.05 * a.abs().max().item()
    assert again.layer_loop is not None


@kernel
def test_re_encoding_a_few_rows_at_a_time_keeps_every_weight(tmp_path, monkeypatch):
    """The re-encoded layers, converted 3 rows at a time, dequantize to the stored layers' weights bit
    for bit: every row lands in its place."""
    from specdec.model import loading
    monkeypatch.setattr(loading, "REENCODE_ROWS", 3)
    path = write_tiny_gguf(tmp_path / "q5.gguf", tiny_model(2, attention_bias=True), "qwen2", "Q5_0")
    stored, again = load_gguf_blocks(GGUFFile(path), repack=False), load_gguf_blocks(GGUFFile(path), reencode=True, repack=False)
    layers = lambda m: [x for x in m.modules() if isinstance(x, QuantLinear)]  # noqa: E731
    weights = lambda layer: torch.cat([cpu_kernels.quant_dequantize(q, d, layer.in_features)  # noqa: E731
                                       for q, d in layer.parts])
    for a, b in zip(layers(stored), layers(again), strict=True):
        assert torch.equal(weights(a).view(torch.int32), weights(b).view(torch.int32))


def test_a_gguf_without_a_tokenizer_or_of_another_architecture_is_a_clear_error(tmp_path):
    from specdec.model import load_model
    from specdec.model.gguf_config import gguf_hf_config
    path = write_tiny_gguf(tmp_path / "no-tok.gguf", tiny_model(4), "llama", "Q8_0")  # the fixture writes no tokenizer
    with pytest.raises(SpecdecError, match="carries no tokenizer"):
        load_model(str(path), device="cpu", progress=lambda *a: None)
    other = write_tiny_gguf(tmp_path / "gemma.gguf", tiny_model(4), "gemma", "Q8_0")
    with pytest.raises(SpecdecError, match="unsupported GGUF architecture 'gemma'"):
        gguf_hf_config(GGUFFile(other))


@kernel
@pytest.mark.parametrize("bits", [4, 3])
def test_a_low_bit_draft_and_the_self_draft(tmp_path, bits):
    """bits=4: a draft's 32-weight blocks become Q4_0 tiles (K-quants other than Q6_K keep theirs); bits=3:
    the MLP's gate and up become Q3_0, the rest as at 4. Its logits are those of the fp32 reference whose
    weights went through the same rounding (as far as 8-bit activations allow), and stay correlated with
    the 8-bit model's. --draft self loads the target's own file as that draft."""
    from specdec.settings import ModelSettings
    path = write_tiny_gguf(tmp_path / "q8.gguf", tiny_model(4), "llama", "Q8_0")
    eight, low = load_gguf_blocks(GGUFFile(path), reencode=True), load_gguf_blocks(GGUFFile(path), reencode=True, bits=bits)
    types = lambda m: {q for x in m.modules() if isinstance(x, QuantLinear) for q, _ in x.parts}  # noqa: E731
    assert types(eight) == {cpu_kernels.REPACKED_TYPES["Q8_0_R16"]}
    assert {q for q, _ in low.model.layers[0].mlp.gate_up_proj.parts} == {cpu_kernels.REPACKED_TYPES[f"Q{bits}_0_R16"]}
    assert {q for q, _ in low.model.layers[0].mlp.down_proj.parts} == {cpu_kernels.REPACKED_TYPES["Q4_0_R16"]}
    assert {q for q, _ in low.lm_head.parts} == {cpu_kernels.REPACKED_TYPES["Q4_0_R16"]}
    ref = load_gguf_reference(GGUFFile(path), torch.device("cpu"), torch.float32)
    for name, m in ref.named_modules():  # the draft's rounding
        if isinstance(m, torch.nn.Linear):
            b = bits if name.endswith(("gate_proj", "up_proj")) else 4
            m.weight.data = torch.from_numpy(reference_sym(m.weight.data.numpy(), b)).float()
    x = torch.randint(0, TINY_VOCAB, (1, 12))
    cos = lambda a, b: torch.nn.functional.cosine_similarity(  # noqa: E731
        a[0] - a[0].mean(-1, keepdim=True), b[0] - b[0].mean(-1, keepdim=True))
    a, b, r = (m(x, m.new_cache(16), 0) for m in (eight, low, ref))
    assert cos(b, r).min().item() > 0.95  # the same weights: only the activations' 8 bits differ
    assert cos(a, b).mean().item() > 0.3  # few bits on a random tiny model: still correlated (a wrong layout: ~0)
    with pytest.raises(SpecdecError, match="--draft-bits must be 3, 4, 8 or auto"):
        ModelSettings(draft_bits=6)


@kernel
@pytest.mark.parametrize("tied", [True, False])
def test_a_draft_head_cut_at_load_is_the_full_heads_first_rows(tmp_path, tied):
    """head_rows (--draft-vocab): the LM head holds only its first rows, the same tiles as the full
    head's, so the logits are the full model's first ones bit for bit and a truncated view changes nothing."""
    from specdec.drafters.draft_model import truncated_head
    path = write_tiny_gguf(tmp_path / "q8.gguf", tiny_model(4, tie_word_embeddings=tied), "llama", "Q8_0")
    full, cut = (load_gguf_blocks(GGUFFile(path), reencode=True, bits=4, head_rows=r) for r in (0, 32))
    assert cut.lm_head.out_features == 32 and full.lm_head.out_features == TINY_VOCAB
    x = torch.randint(0, TINY_VOCAB, (1, 9))
    a, b = full(x, full.new_cache(16), 0), cut(x, cut.new_cache(16), 0)
    assert b.shape[-1] == 32 and torch.equal(a[..., :32], b)
    view = truncated_head(cut, 32)
    assert torch.equal(view(x, view.new_cache(16), 0), b)
    assert load_gguf_blocks(GGUFFile(path), reencode=True, bits=4, head_rows=TINY_VOCAB + 16).lm_head.out_features \
        == TINY_VOCAB  # a --draft-vocab past the vocabulary keeps the whole head


@kernel
@pytest.mark.parametrize("bits", [4, 3])
def test_a_low_bit_draft_takes_q5_0_blocks_straight_to_its_encoding(tmp_path, bits):
    """A 4-bit (3-bit) draft re-encodes its Q5_0 blocks once, as Q4_0 (the MLP's gate and up as Q3_0) from
    the stored weights (not through Q8_0 first): the layers equal that encoding made from the Q5_0 weights
    themselves."""
    path = write_tiny_gguf(tmp_path / "q5.gguf", tiny_model(2, attention_bias=True), "qwen2", "Q5_0")
    stored = load_gguf_blocks(GGUFFile(path), repack=False)
    low = load_gguf_blocks(GGUFFile(path), reencode=True, bits=bits)
    layers = lambda m: [(n, x) for n, x in m.named_modules() if isinstance(x, QuantLinear)]  # noqa: E731
    for (name, a), (_, b) in zip(layers(stored), layers(low), strict=True):
        (qtype, blocks), = a.parts
        direct = cpu_kernels.requant(qtype, blocks, a.in_features, bits if name.endswith("gate_up_proj") else 4)
        assert [q for q, _ in b.parts] == [direct[0]] and torch.equal(b.parts[0][1], direct[1])


def test_tokenizer_digest_is_the_vocabulary_not_the_chat_template(tmp_path):
    import gguf

    def write(name, tokens, template):
        w = gguf.GGUFWriter(str(tmp_path / name), "llama")
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_merges(["a b"])
        w.add_chat_template(template)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        return GGUFFile(tmp_path / name).digest("tokenizer.", skip=("tokenizer.chat_template",))
    one = write("a.gguf", ["a", "b", "ab"], "{{ x }}")
    assert write("b.gguf", ["a", "b", "ab"], "{{ y }}") == one  # another template only
    assert write("c.gguf", ["a", "b", "ba"], "{{ x }}") != one  # another vocabulary
    assert write("d.gguf", ["a", "b"], "{{ x }}") != one


@kernel
def test_a_draft_beside_a_target_of_one_tokenizer_shares_it(smollm2_path):
    from specdec.settings import SELF_DRAFT, ModelSettings
    settings = ModelSettings(model=str(smollm2_path), device="cpu")
    quiet = lambda *a: None  # noqa: E731
    target = settings.load(progress=quiet)
    assert settings.load(SELF_DRAFT, draft=True, progress=quiet, beside=target).tokenizer is target.tokenizer
    assert settings.load(SELF_DRAFT, draft=True, progress=quiet).tokenizer is not target.tokenizer


@kernel
def test_the_self_draft_is_the_target_re_encoded(smollm2_path):
    from specdec.settings import SELF_DRAFT, ModelSettings
    settings = ModelSettings(model=str(smollm2_path), device="cpu", draft_bits=4)
    quiet = lambda *a: None  # noqa: E731
    target, drafted = settings.load(progress=quiet), settings.load(SELF_DRAFT, draft=True, progress=quiet)
    types = lambda m: {q for x in m.modules() if isinstance(x, QuantLinear) for q, _ in x.parts}  # noqa: E731
    assert types(drafted.module) == {cpu_kernels.REPACKED_TYPES["Q4_0_R16"]} != types(target.module)
    auto = ModelSettings(model=str(smollm2_path), device="cpu").load(SELF_DRAFT, draft=True, progress=quiet)
    gate_up = {q for layer in auto.module.model.layers for q, _ in layer.mlp.gate_up_proj.parts}
    assert gate_up == {cpu_kernels.REPACKED_TYPES[f"Q{cpu_kernels.best_draft_bits()}_0_R16"]}  # --draft-bits auto
    assert drafted.tokenizer.get_vocab() == target.tokenizer.get_vocab()
