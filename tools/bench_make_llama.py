#!/usr/bin/env python3
"""Writes the larger Llama of tools/bench_peers.sh's `large` rows with HF transformers.

    python3 tools/bench_make_llama.py --out DIR --tokenizer-from OXALIGN_SMALL_DIR

Defaults: the 245.9M-parameter Llama of issue 33 (hidden 1024, 16 layers, 16 heads, 4 KV
heads, intermediate 2816, vocab 32000, untied head), seeded, f32 safetensors, with the
tokenizer files of an `oxalign init-model --preset small` folder (same 32000-token vocab).
"""
import argparse
import json
import os
import shutil


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-from", required=True)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=2816)
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(a.out, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer_from, name), os.path.join(a.out, name))
    src = json.load(open(os.path.join(a.tokenizer_from, "config.json")))
    cfg = LlamaConfig(
        vocab_size=src["vocab_size"],
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=src.get("bos_token_id"),
        eos_token_id=src.get("eos_token_id"),
        pad_token_id=src.get("pad_token_id"),
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(a.out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: llama, {n / 1e6:.1f}M parameters, vocab {cfg.vocab_size}")


if __name__ == "__main__":
    main()
