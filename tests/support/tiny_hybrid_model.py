"""A tiny random-weight Qwen3-Next (gated delta-net layers + full attention, MoE) for end-to-end runs
of vLLM on a CPU, made locally with transformers' config and model classes (nothing downloaded).

Run in an environment with transformers and torch (the vLLM environment of the end-to-end tests):

    python tests/support/tiny_hybrid_model.py OUT_DIR

writes the model (bf16 safetensors + config) into ``OUT_DIR`` (no tokenizer: prompts are token ids,
vLLM runs with ``skip_tokenizer_init=True``). The same seed gives the same weights.

What makes vLLM's CPU runs of it repeatable bit for bit, and a wrong recurrent state visible in the
generated tokens:

* head dim 64 everywhere (vLLM's CPU gated-delta-net kernel refuses 32);
* every layer MoE with every expert routed (``num_experts_per_tok == num_experts``): near-tied bf16
  router logits cannot flip a choice;
* enough KV heads that one attention page (block 64) holds one fp32 recurrent-state page;
* a slow gated-delta-net decay (``A`` in [0.005, 0.05]): the state carries far, so a state copied from
  the wrong block, or not copied, changes the tokens.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

CONFIG = {
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "partial_rotary_factor": 0.25,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "num_experts": 2,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 4096,
    "initializer_range": 0.05,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SEED = 1234
DECAY = (0.005, 0.05)


def build(out: Path) -> None:
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(SEED)
    config = Qwen3NextConfig(**CONFIG)
    model = Qwen3NextForCausalLM(config)
    lo, hi = DECAY
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(math.log(lo), math.log(hi)))
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "recoverssm_tiny_model.json").write_text(json.dumps({"config": CONFIG, "seed": SEED, "decay": DECAY}))


if __name__ == "__main__":
    build(Path(sys.argv[1]))
