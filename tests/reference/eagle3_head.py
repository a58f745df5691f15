"""Writes a random EAGLE-3 head for a target model, in the layout the EAGLE-3
authors and vLLM publish (docs/speculative.md, "EAGLE-3 heads"): config.json
(`LlamaForCausalLMEagle3`, `draft_vocab_size`, `eagle_config` with the aux
layers) and model.safetensors (bf16 `fc`, `midlayer.*`, `norm`, `lm_head`;
int64 `d2t`, bool `t2d`). The draft vocabulary is a random subset of the
target's (so `d2t` is exercised), the aux layers vLLM's defaults.

A random head's proposals are mostly refused: it tests that answers stay
exact and measures what a head costs per step, not its acceptance.

Usage: eagle3_head.py OUT --hidden 576 --intermediate 1536 --heads 9 --kv-heads 3
       --layers 30 --vocab 49152 [--draft-vocab 8192] [--rope-theta 100000] [--seed 0]
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_tiny_models as tiny  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    for name in ("hidden", "intermediate", "heads", "kv-heads", "layers", "vocab"):
        ap.add_argument(f"--{name}", type=int, required=True)
    ap.add_argument("--draft-vocab", type=int, default=0, help="0: the whole vocabulary, no d2t")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    h, ff, hd = a.hidden, a.intermediate, a.hidden // a.heads
    dv = a.draft_vocab or a.vocab
    aux = [2, a.layers // 2, a.layers - 3]
    rng = np.random.default_rng(a.seed)

    def rand(*shape, scale=0.04):
        return rng.uniform(-scale / 2, scale / 2, size=shape)

    def norm():
        return 1.0 + rand(h, scale=0.1)

    weights = {
        "fc.weight": rand(h, 3 * h),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": rand(a.heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(a.kv_heads * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(a.kv_heads * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, a.heads * hd),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.mlp.gate_proj.weight": rand(ff, h),
        "midlayer.mlp.up_proj.weight": rand(ff, h),
        "midlayer.mlp.down_proj.weight": rand(h, ff),
        "norm.weight": norm(),
        "lm_head.weight": rand(dv, h),
    }
    tensors = {}
    for name, w in weights.items():
        dt, data, _ = tiny.encode(w, "bfloat16")
        tensors[name] = (dt, w.shape, data)
    if dv < a.vocab:
        kept = np.sort(rng.choice(a.vocab, size=dv, replace=False))
        d2t = (kept - np.arange(dv)).astype("<i8")
        t2d = np.zeros(a.vocab, dtype=np.uint8)
        t2d[kept] = 1
        tensors["d2t"] = ("I64", (dv,), d2t.tobytes())
        tensors["t2d"] = ("BOOL", (a.vocab,), t2d.tobytes())
    os.makedirs(a.out, exist_ok=True)
    tiny.write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": ff,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "num_hidden_layers": 1,
        "vocab_size": a.vocab,
        "draft_vocab_size": dv,
        "rms_norm_eps": 1e-5,
        "rope_theta": a.rope_theta,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux},
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    print(a.out)


if __name__ == "__main__":
    main()
