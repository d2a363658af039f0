"""A random Qwen3-MoE in Qwen3-30B-A3B's layer shape (hidden 2048, 32/4 heads of 128, 128 experts of 768, 8 a
token), LAYERS layers, SmolLM2's vocabulary; saved as HF and converted to Q8_0 GGUF by llama.cpp's converter.
Usage: SPECDEC_HOME=... python make_moe.py DIR LAYERS (writes DIR/moe-q8_0.gguf; DIR/model.safetensors may go)"""
import os, subprocess, sys, torch
from pathlib import Path
import transformers as tf
from transformers import PreTrainedTokenizerFast
from specdec.model.gguf_file import GGUFFile
from specdec.model.tokenizer import gguf_tokenizer
d = Path(sys.argv[1]); layers = int(sys.argv[2])
from specdec.model.registry import pull, specdec_home
tok = gguf_tokenizer(GGUFFile(pull("smollm2-135m-instruct")))
t = PreTrainedTokenizerFast(tokenizer_object=tok.backend, bos_token=tok.bos_token, eos_token=tok.eos_token)
t.save_pretrained(d)
cfg = tf.Qwen3MoeConfig(vocab_size=len(t), hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32,
                        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                        moe_intermediate_size=768, intermediate_size=6144, norm_topk_prob=True, tie_word_embeddings=False,
                        max_position_embeddings=4096)
torch.manual_seed(0)
with torch.no_grad():
    m = tf.Qwen3MoeForCausalLM(cfg)
    for n, p in m.named_parameters():
        if n.endswith("norm.weight"): p.fill_(1.0)
        else: p.normal_(0.0, 0.02)
m.save_pretrained(d)
del m
L = specdec_home() / "llama.cpp" / "src"  # scripts/llama_cpp.sh source
subprocess.run([sys.executable, str(L / "convert_hf_to_gguf.py"), str(d), "--outtype", "q8_0", "--outfile", str(d / "moe-q8_0.gguf")],
               env={**os.environ, "PYTHONPATH": str(L / "gguf-py")}, check=True, stdout=subprocess.DEVNULL)
print("done")
