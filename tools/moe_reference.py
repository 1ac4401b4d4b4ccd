#!/usr/bin/env python3
"""MoE parity fixtures for oxalign-models (run by hand; needs torch + transformers >= 5).

  python3 tools/moe_reference.py [--out models/tests/fixtures]

Builds tiny random HF mixture-of-experts models and saves each in float32 safetensors to
<out>/<name>/ with <out>/<name>/golden.json:

  qwen3_moe_tiny    Qwen3MoeForCausalLM: 3 layers (layer 1 dense via mlp_only_layers),
                    8 experts, top-2, norm_topk_prob, q/k norms; per-expert tensor names
                    (what save_pretrained writes).
  qwen3_moe_packed  The same weights written in the packed layout transformers keeps in
                    memory (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
                    [E, H, I]); the script checks transformers loads it to the same outputs.
  mixtral_tiny      MixtralForCausalLM: 2 layers, 4 experts, top-2
                    (block_sparse_moe.experts.N.w1/w2/w3 on disk).
  qwen2_moe_tiny    Qwen2MoeForCausalLM: 2 layers, 4 experts, top-2, no renormalisation,
                    a shared expert with its sigmoid gate, q/k/v bias.

golden.json holds per-token log-probs of fixed sequences (alone and as a left-padded batch), a
16-token greedy continuation, the load-balancing loss of the padded batch
(output_router_logits, with its attention mask), and the gradient of
`sum(log-probs of real tokens predicted at real positions) + router_aux_loss_coef *
aux_loss` with respect to layer 0's router
weight (so a test can check the router is differentiable, not just that it has a gradient).
The Rust test models/tests/moe_parity.rs checks against them. Log-probs are natural-log
probabilities at temperature 1; position ids of a left-padded row are cumsum(mask) - 1
clamped at 0.
"""

import argparse
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import greedy, left_pad, next_token_logprobs, positions, token_rows  # noqa: E402

VOCAB = 300
PAD = 0


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
            elif name.endswith("gate.weight"):
                p.copy_(0.5 * noise)  # routers: clear preferences, few near-ties
            else:
                p.copy_(0.15 * noise)


def base_kwargs():
    return dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=PAD,
        tie_word_embeddings=False,
        router_aux_loss_coef=0.02,
    )


def fixture_models():
    qwen3 = transformers.Qwen3MoeConfig(
        **base_kwargs(),
        intermediate_size=64,
        num_hidden_layers=3,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        rope_theta=10000.0,
    )
    mixtral = transformers.MixtralConfig(
        **base_kwargs(),
        intermediate_size=24,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_theta=10000.0,
    )
    qwen2 = transformers.Qwen2MoeConfig(
        **base_kwargs(),
        intermediate_size=64,
        num_hidden_layers=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        norm_topk_prob=False,
        rope_theta=1000000.0,
    )
    return [
        ("qwen3_moe_tiny", transformers.Qwen3MoeForCausalLM, qwen3, 11),
        ("mixtral_tiny", transformers.MixtralForCausalLM, mixtral, 12),
        ("qwen2_moe_tiny", transformers.Qwen2MoeForCausalLM, qwen2, 13),
    ]


def router_names(model):
    return sorted(n for n, _ in model.named_parameters() if n.endswith("mlp.gate.weight"))


def golden_of(model, rows):
    cfg = model.config
    out = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "sequences": rows,
    }
    with torch.no_grad():
        out["logprobs"] = [next_token_logprobs(model, torch.tensor([r]))[0].tolist() for r in rows]
    ids, mask = left_pad(rows, PAD)
    out["padded_ids"] = ids.tolist()
    out["padded_mask"] = mask.tolist()
    model.zero_grad()
    res = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), output_router_logits=True)
    logits = res.logits.double()
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    out["padded_logprobs"] = lp.tolist()
    aux = res.aux_loss
    out["aux_loss"] = aux.item()
    out["router_aux_loss_coef"] = cfg.router_aux_loss_coef
    # Only predictions made at real positions of real tokens (a pad row's own output is
    # implementation-defined: every key it could see is masked).
    objective = (lp * mask[:, :-1] * mask[:, 1:]).sum() + cfg.router_aux_loss_coef * aux
    objective.backward()
    params = dict(model.named_parameters())
    router = router_names(model)[0]
    out["router_grad_name"] = router
    out["router_grad"] = params[router].grad.tolist()
    model.zero_grad()
    out["greedy_prompt"] = rows[1]
    out["greedy_tokens"] = greedy(model, rows[1], 16)
    return out


def write_packed(model, src, dst):
    """The model's in-memory (packed) state dict as a checkpoint, with src's config."""
    os.makedirs(dst, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state), "expected packed experts"
    save_file(state, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))


def load_f32(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def save_fixture(d, golden):
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"wrote {d} ({size / 1024:.0f} KiB)")


def build_fixtures(out):
    rows = token_rows(4321, [12, 7, 16], VOCAB, avoid={PAD})
    for name, cls, cfg, seed in fixture_models():
        cfg._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = cls(cfg).float().eval()
        randomize(model, seed)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        golden = golden_of(model, rows)
        save_fixture(d, golden)
        if name == "qwen3_moe_tiny":
            packed = os.path.join(out, "qwen3_moe_packed")
            write_packed(model, d, packed)
            reloaded = load_f32(packed)
            reloaded.config._attn_implementation = "eager"
            again = golden_of(reloaded, rows)
            worst = max(
                abs(a - b)
                for ra, rb in zip(golden["logprobs"], again["logprobs"])
                for a, b in zip(ra, rb)
            )
            assert worst < 1e-6, f"packed checkpoint reloads differently ({worst})"
            save_fixture(packed, again)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models", "tests", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    build_fixtures(os.path.normpath(args.out))


if __name__ == "__main__":
    main()
