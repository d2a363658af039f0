"""Head files: the published EAGLE, EAGLE-3 and Medusa layouts (written here by fixtures), our own
round trips, and the errors for a head of another model or a corrupt file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from conftest import tiny_config
from specdec.errors import SpecdecError
from specdec.heads.checkpoint import load_head, save_head
from specdec.heads.modules import EagleHead, Eagle3Head, MedusaHead, TargetParts, build_head, eagle_config, medusa_config

CFG = tiny_config()
H, V = CFG.hidden_size, CFG.vocab_size
TARGET = {"hidden_size": H, "vocab_size": V, "tokenizer": "abc"}


def rand(*shape):
    return torch.randn(*shape) * 0.1


def parts(draft_ids=None) -> TargetParts:
    torch.manual_seed(5)
    lm = torch.randn(V, H) * 0.3
    return TargetParts(torch.nn.Embedding(V, H), torch.ones(H) + 0.05 * torch.randn(H), 1e-5,
                       lm if draft_ids is None else lm[draft_ids])


def llama_config(**extra) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": 96,
            "num_attention_heads": CFG.num_heads, "num_key_value_heads": CFG.num_kv_heads, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256, "vocab_size": V, **extra}


def attention_and_mlp(prefix: str, width: int) -> dict:
    q, kv, inter = CFG.num_heads * CFG.head_dim, CFG.num_kv_heads * CFG.head_dim, 96
    return {f"{prefix}self_attn.q_proj.weight": rand(q, width), f"{prefix}self_attn.k_proj.weight": rand(kv, width),
            f"{prefix}self_attn.v_proj.weight": rand(kv, width), f"{prefix}self_attn.o_proj.weight": rand(H, q),
            f"{prefix}post_attention_layernorm.weight": torch.ones(H), f"{prefix}mlp.gate_proj.weight": rand(inter, H),
            f"{prefix}mlp.up_proj.weight": rand(inter, H), f"{prefix}mlp.down_proj.weight": rand(H, inter)}


@pytest.fixture
def eagle_dir(tmp_path):
    """A head as EAGLE's repository saves it: pytorch_model.bin, fc with a bias, no layer-0 input norm,
    the target's embedding carried along."""
    state = {"fc.weight": rand(H, 2 * H), "fc.bias": rand(H), "embed_tokens.weight": rand(V, H),
             **attention_and_mlp("layers.0.", H)}
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(llama_config(bias=True)))
    return tmp_path, state


@pytest.fixture
def eagle3_dir(tmp_path):
    """An EAGLE-3 head as SpecForge saves it: midlayer.*, its own norm and LM head over 40 draft ids."""
    draft = torch.arange(0, 80, 2)
    state = {"fc.weight": rand(H, 3 * H), "midlayer.input_layernorm.weight": torch.ones(H),
             "midlayer.hidden_norm.weight": torch.ones(H), **attention_and_mlp("midlayer.", 2 * H),
             "norm.weight": torch.ones(H), "lm_head.weight": rand(40, H), "d2t": draft - torch.arange(40),
             "t2d": torch.zeros(V, dtype=torch.bool).index_fill(0, draft, True)}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(llama_config(architectures=["LlamaForCausalLMEagle3"],
                                                                  draft_vocab_size=40)))
    return tmp_path, state


@pytest.fixture
def medusa_dir(tmp_path):
    """Medusa's own layout: 3 heads of one residual block and a full LM head each."""
    state = {}
    for i in range(3):
        state |= {f"medusa_head.{i}.0.linear.weight": rand(H, H), f"medusa_head.{i}.0.linear.bias": rand(H),
                  f"medusa_head.{i}.1.weight": rand(V, H)}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1,
                                                      "base_model_name_or_path": "x", "hidden_size": H}))
    return tmp_path, state


def test_eagle_layout_loads_with_its_key_names(eagle_dir):
    directory, state = eagle_dir
    head, _ = load_head(directory, TARGET)
    assert isinstance(head, EagleHead)
    assert not head.config.final_norm and not head.config.input_norm and head.config.fc_bias
    assert head.config.draft_vocab_size == V and head.t2d.all() and (head.d2t == 0).all()
    assert torch.equal(head.fc.weight, state["fc.weight"])
    assert torch.equal(head.layers[0].mlp.down_proj.weight, state["layers.0.mlp.down_proj.weight"])
    out = head.unroll(torch.randn(1, 6, H), torch.randint(0, V, (1, 6)), parts(), 2)
    assert out[0][1].shape == (1, 4, V) and out[1][0].shape == (1, 4, H)


def test_eagle3_layout_loads_and_drafts(eagle3_dir):
    directory, state = eagle3_dir
    head, _ = load_head(directory, TARGET)
    assert isinstance(head, Eagle3Head) and head.config.draft_vocab_size == 40
    assert torch.equal(head.midlayer.self_attn.q_proj.weight, state["midlayer.self_attn.q_proj.weight"])
    assert torch.equal(head.d2t, state["d2t"]) and torch.equal(head.t2d, state["t2d"])
    hidden, logits = head(torch.randn(1, 5, 3 * H), torch.randint(0, V, (1, 5)), parts())
    assert hidden.shape == (1, 5, H) and logits.shape == (1, 5, 40)


def test_medusa_layout_loads_and_matches_its_definition(medusa_dir):
    directory, state = medusa_dir
    head, _ = load_head(directory, TARGET)
    assert isinstance(head, MedusaHead) and head.config.own_lm_head and head.config.medusa_heads == 3
    x = torch.randn(1, 4, H)
    logits = head(x, parts())
    lm = state["medusa_head.2.1.weight"]
    w, b = state["medusa_head.2.0.linear.weight"], state["medusa_head.2.0.linear.bias"]
    expected = (x + torch.nn.functional.silu(x @ w.T + b)) @ lm.T
    torch.testing.assert_close(logits[2], expected)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_our_heads_round_trip(tmp_path, kind):
    draft_ids = torch.arange(0, V, 3)
    cfg = (eagle_config(CFG, draft_ids.numel(), intermediate_size=32) if kind == "eagle"
           else medusa_config(CFG, draft_ids.numel(), heads=2))
    torch.manual_seed(0)
    head = build_head(cfg)
    for p in head.parameters():
        p.data.normal_(0, 0.1)
    head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
    head.t2d[draft_ids] = True
    save_head(head, tmp_path, TARGET, {"model": "tiny"})
    again, meta = load_head(tmp_path, TARGET)
    assert meta["model"] == "tiny" and again.config == head.config
    for k, v in head.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    if kind == "eagle":
        assert "layers.0.self_attn.q_proj.weight" in json.dumps(list(again.state_dict()))
    else:
        assert "medusa_head.1.0.linear.weight" in again.state_dict()


def saved_head(tmp_path):
    head = build_head(medusa_config(CFG, V, heads=2))
    head.t2d[:] = True
    return save_head(head, tmp_path, TARGET)


@pytest.mark.parametrize("field,value,what", [("hidden_size", 128, "hidden size"), ("vocab_size", 1000, "vocabulary"),
                                              ("tokenizer", "zzz", "tokenizer")])
def test_a_head_for_another_model_is_refused(tmp_path, field, value, what):
    directory = saved_head(tmp_path)
    with pytest.raises(SpecdecError, match=f"another model \\({what}"):
        load_head(directory, {**TARGET, field: value})


def test_a_corrupt_or_partial_head_file_is_refused(tmp_path):
    directory = saved_head(tmp_path)
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(SpecdecError, match="corrupt or partial"):
        load_head(directory, TARGET)


def test_a_head_missing_tensors_is_refused(eagle_dir):
    directory, state = eagle_dir
    del state["layers.0.mlp.up_proj.weight"]
    torch.save(state, directory / "pytorch_model.bin")
    with pytest.raises(SpecdecError, match="missing: layers.0.mlp.up_proj.weight"):
        load_head(directory, TARGET)


def test_a_missing_head_directory_is_refused(tmp_path):
    with pytest.raises(SpecdecError, match="no head directory"):
        load_head(tmp_path / "absent", TARGET)
    with pytest.raises(SpecdecError, match="no head weights"):
        load_head(tmp_path, TARGET)


def test_ship_head_copies_a_trained_head_in_bf16_and_refuses_what_is_not_one(tmp_path, monkeypatch, capsys, eagle_dir):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import ship_head
    monkeypatch.setattr(ship_head, "SHIPPED_HEADS", tmp_path / "heads")
    saved = saved_head(tmp_path / "trained")
    for argv, rc, message in (([str(tmp_path / "missing")], 2, "no head directory"),
                              ([str(eagle_dir[0])], 2, "not a head trained by specdec train-head"),
                              ([str(saved)], 0, '"mb"')):
        monkeypatch.setattr(sys, "argv", ["ship_head.py", *argv, "--name", "tiny-medusa"])
        assert ship_head.main() == rc
        out, err = capsys.readouterr()
        assert message in (err if rc else out) and "Traceback" not in err
    shipped = load_head(tmp_path / "heads" / "tiny-medusa", TARGET)[0]
    for k, v in load_head(saved, TARGET)[0].state_dict().items():
        want = v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v
        assert torch.equal(shipped.state_dict()[k], want), k
