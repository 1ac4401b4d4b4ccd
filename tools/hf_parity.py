#!/usr/bin/env python3
"""HF parity fixtures and checks for oxalign-models (run by hand; needs torch + transformers).

Two modes:

  python3 tools/hf_parity.py [--out models/tests/fixtures] [--only NAME ...]
      Builds tiny random HF models (LlamaForCausalLM with llama3 rope scaling and attention
      bias, Qwen2ForCausalLM with tied embeddings, Qwen3ForCausalLM with q/k norms and a
      head_dim of twice hidden/heads, MistralForCausalLM with a sliding window,
      Phi3ForCausalLM with its fused qkv_proj / gate_up_proj and a sliding window,
      Gemma3ForCausalLM with (1 + w) norms, four norms per layer, q/k norms, GeGLU, a scaled
      embedding, a query_pre_attn_scalar that is not head_dim, interleaved sliding layers with
      their own RoPE base and linear RoPE scaling on the full layer, Gemma2ForCausalLM with
      attention and final logit soft-caps small enough to act (2 and 3), the multimodal
      Gemma3ForConditionalGeneration (a tiny vision tower; text-only rows, whose decoder
      oxalign loads),
      LlamaForSequenceClassification with pad_token_id; --only builds the named ones), saves each in float32 safetensors to
      <out>/<name>/ and writes <out>/<name>/golden.json with per-token log-probs of fixed
      sequences (alone and as a left-padded batch), a 16-token greedy continuation and, for the
      reward model, sequence scores. The Rust test models/tests/hf_parity.rs checks against them.

  python3 tools/hf_parity.py --check-oxalign-dir DIR --golden OUT.json
      Loads a folder written by oxalign (CausalLm / ValueModel / RewardModel `save`) with
      transformers' Auto classes and writes what transformers computes for a few fixed
      sequences: next-token log-probs and greedy tokens (causal LM), per-token values (token
      classification) or sequence scores (sequence classification). Prints a summary.

Log-probs are natural-log probabilities of each next token at temperature 1. Position ids of a
left-padded row are cumsum(attention_mask) - 1 clamped at 0 (HF generate's convention, and
what oxalign's forward uses).
"""

import argparse
import json
import os
import sys

import torch
import transformers

VOCAB = 300
PAD = 0


def token_rows(seed, lengths, vocab, avoid):
    """Deterministic token rows with ids in [1, vocab) that avoid the ids in `avoid`."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        row = []
        while len(row) < n:
            t = int(torch.randint(1, vocab, (1,), generator=g))
            if t not in avoid:
                row.append(t)
        rows.append(row)
    return rows


def left_pad(rows, pad):
    width = max(len(r) for r in rows)
    ids = [[pad] * (width - len(r)) + r for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    return torch.tensor(ids), torch.tensor(mask)


def positions(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def next_token_logprobs(model, ids, mask=None):
    """[B, T] ids -> [B, T-1] log p(ids[t+1] | ids[..t]) (float64 on the way out)."""
    kwargs = {}
    if mask is not None:
        kwargs = {"attention_mask": mask, "position_ids": positions(mask)}
    logits = model(input_ids=ids, **kwargs).logits.double()
    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    return lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def greedy(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
        seq.append(int(torch.argmax(logits)))
    return seq[len(prompt):]


@torch.no_grad()
def seq_scores(model, ids, mask=None):
    kwargs = {}
    if mask is not None:
        kwargs = {"attention_mask": mask, "position_ids": positions(mask)}
    return model(input_ids=ids, **kwargs).logits[:, 0].double()


def randomize(model, seed):
    """Large-ish random weights (HF's 0.02 init makes every logit ~equal, hiding bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.15 * noise)


def base_kwargs():
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=PAD,
    )


def fixture_models():
    llama = transformers.LlamaConfig(
        **base_kwargs(),
        attention_bias=True,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        tie_word_embeddings=False,
    )
    qwen2 = transformers.Qwen2Config(**base_kwargs(), rope_theta=1000000.0, tie_word_embeddings=True)
    mistral = transformers.MistralConfig(
        **base_kwargs(), head_dim=16, rope_theta=10000.0, sliding_window=5, tie_word_embeddings=False
    )
    qwen3 = transformers.Qwen3Config(
        **base_kwargs(), head_dim=32, rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=True
    )
    phi3 = transformers.Phi3Config(
        **base_kwargs(), rope_theta=10000.0, sliding_window=5, tie_word_embeddings=False
    )
    gemma3 = transformers.Gemma3TextConfig(
        **{**base_kwargs(), "num_hidden_layers": 3},
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=True,
    )
    gemma2 = transformers.Gemma2Config(
        **{**base_kwargs(), "num_hidden_layers": 3},
        head_dim=16,
        query_pre_attn_scalar=20,
        sliding_window=5,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    gemma3_mm = transformers.Gemma3Config(
        text_config={
            **base_kwargs(),
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": 5,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        vision_config=dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4,
        boi_token_index=VOCAB - 3,
        eoi_token_index=VOCAB - 2,
        image_token_index=VOCAB - 1,
    )
    rm = transformers.LlamaConfig(**base_kwargs(), num_labels=1, rope_theta=10000.0)
    return [
        ("llama_tiny", transformers.LlamaForCausalLM, llama, 1),
        ("qwen2_tiny", transformers.Qwen2ForCausalLM, qwen2, 2),
        ("qwen3_tiny", transformers.Qwen3ForCausalLM, qwen3, 5),
        ("mistral_tiny", transformers.MistralForCausalLM, mistral, 3),
        ("phi3_tiny", transformers.Phi3ForCausalLM, phi3, 6),
        ("gemma3_tiny", transformers.Gemma3ForCausalLM, gemma3, 7),
        ("gemma2_tiny", transformers.Gemma2ForCausalLM, gemma2, 8),
        ("gemma3_mm_tiny", transformers.Gemma3ForConditionalGeneration, gemma3_mm, 9),
        ("llama_rm_tiny", transformers.LlamaForSequenceClassification, rm, 4),
    ]


def build_fixtures(out, only=None):
    rows = token_rows(1234, [12, 7, 16], VOCAB, avoid={PAD})
    for name, cls, cfg, seed in fixture_models():
        if only and name not in only:
            continue
        cfg._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = cls(cfg).float().eval()
        randomize(model, seed)
        if cfg.tie_word_embeddings:
            model.tie_weights()
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        golden = {
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "sequences": rows,
        }
        ids, mask = left_pad(rows, PAD)
        if cls is transformers.LlamaForSequenceClassification:
            golden["scores"] = [float(seq_scores(model, torch.tensor([r]))[0]) for r in rows]
            golden["padded_ids"] = ids.tolist()
            golden["padded_mask"] = mask.tolist()
            golden["padded_scores"] = seq_scores(model, ids, mask).tolist()
        else:
            golden["logprobs"] = [next_token_logprobs(model, torch.tensor([r]))[0].tolist() for r in rows]
            lp = next_token_logprobs(model, ids, mask)
            golden["padded_ids"] = ids.tolist()
            golden["padded_mask"] = mask.tolist()
            golden["padded_logprobs"] = lp.tolist()
            golden["greedy_prompt"] = rows[1]
            golden["greedy_tokens"] = greedy(model, rows[1], 16)
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(golden, f, indent=1)
        size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
        print(f"wrote {d} ({size / 1024:.0f} KiB)")


def load_f32(auto_cls, path):
    """from_pretrained in float32 (`dtype=` since transformers 5, `torch_dtype=` before)."""
    major = int(transformers.__version__.split(".")[0])
    kwargs = {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}
    return auto_cls.from_pretrained(path, **kwargs).eval()


def check_dir(path, golden_out):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    arch = (cfg.get("architectures") or ["?ForCausalLM"])[0]
    vocab = cfg["vocab_size"]
    avoid = {cfg.get("pad_token_id")} - {None}
    rows = token_rows(99, [9, 13, 5], vocab, avoid)
    result = {"architecture": arch, "sequences": rows}
    if arch.endswith("ForCausalLM"):
        model = load_f32(transformers.AutoModelForCausalLM, path)
        result["logprobs"] = [next_token_logprobs(model, torch.tensor([r]))[0].tolist() for r in rows]
        result["greedy_prompt"] = rows[0]
        result["greedy_tokens"] = greedy(model, rows[0], 16)
        summary = {"mean_logprob": sum(sum(x) for x in result["logprobs"]) / sum(len(x) for x in result["logprobs"])}
    elif arch.endswith("ForTokenClassification"):
        model = load_f32(transformers.AutoModelForTokenClassification, path)
        with torch.no_grad():
            result["values"] = [model(input_ids=torch.tensor([r])).logits[0, :, 0].double().tolist() for r in rows]
        summary = {"first_values": [v[0] for v in result["values"]]}
    elif arch.endswith("ForSequenceClassification"):
        model = load_f32(transformers.AutoModelForSequenceClassification, path)
        result["scores"] = [float(seq_scores(model, torch.tensor([r]))[0]) for r in rows]
        summary = {"scores": result["scores"]}
    else:
        sys.exit(f"{path}/config.json: unsupported architecture {arch!r}")
    n_params = sum(p.numel() for p in model.parameters())
    result["num_parameters"] = n_params
    with open(golden_out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{path}: {arch}, {n_params} parameters, loaded by transformers {transformers.__version__}")
    print(json.dumps(summary))
    print(f"wrote {golden_out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models", "tests", "fixtures"))
    ap.add_argument("--check-oxalign-dir", help="folder written by oxalign to load with transformers")
    ap.add_argument("--golden", help="where --check-oxalign-dir writes its JSON")
    ap.add_argument("--only", nargs="+", help="build only these fixtures (e.g. qwen3_tiny)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    if args.check_oxalign_dir:
        if not args.golden:
            ap.error("--check-oxalign-dir needs --golden OUT.json")
        check_dir(args.check_oxalign_dir, args.golden)
    else:
        build_fixtures(os.path.normpath(args.out), args.only)


if __name__ == "__main__":
    main()
