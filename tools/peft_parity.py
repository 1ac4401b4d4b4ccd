#!/usr/bin/env python3
"""LoRA parity fixtures and checks between oxalign and HF PEFT (run by hand; needs torch +
transformers + peft).

Three modes:

  python3 tools/peft_parity.py [--out models/tests/fixtures]
      Builds <out>/lora_llama_tiny/:
        base/                      a tiny random LlamaForCausalLM (float32 safetensors)
        adapter/                   a PEFT LoRA adapter for it (adapter_config.json +
                                   adapter_model.safetensors; r=4, lora_alpha=8, no dropout, on
                                   q/k/v/o/gate/up/down_proj) with seeded random lora_A AND
                                   lora_B, so the adapter visibly changes the logits
        golden.json                fixed token rows, per-row next-token log-probs with the
                                   adapter active (`logprobs`) and disabled (`logprobs_base`),
                                   `lora_scale` (= lora_alpha / r) and `loss`
        grads.safetensors          d loss / d every lora_A and lora_B weight, keyed by the names
                                   PEFT writes into adapter_model.safetensors (e.g.
                                   base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)
      `loss` is the SUM over all rows of the sum of the adapter-active next-token log-probs (a
      log-likelihood, not its negative; each row run on its own, no padding), and the gradients
      are of exactly that number, in float32.

  python3 tools/peft_parity.py --check-adapter ADAPTER_DIR --base BASE_DIR \\
          [--rows-from GOLDEN_JSON] --out OUT.json
      Loads BASE_DIR with transformers (float32) and the adapter (e.g. one written by oxalign)
      with peft.PeftModel.from_pretrained, and writes per-row next-token log-probs with the
      adapter active (`logprobs`) and disabled (`logprobs_base`) for the rows of GOLDEN_JSON
      (its `rows`) or the built-in fixed rows. Prints a one-line summary (with the largest
      difference from GOLDEN_JSON's `logprobs` when it has them).

  python3 tools/peft_parity.py --check-merged MERGED_DIR [--rows-from GOLDEN_JSON] --out OUT.json
      Loads a plain HF folder (e.g. a LoRA-merged model written by oxalign) with transformers
      (float32) and writes its `logprobs` for the same rows, so the output can be compared with
      the adapter's.

A missing or incomplete folder exits with status 2. Log-probs are natural-log probabilities of
each next token at temperature 1 (positions 0..len-2 predicting ids 1..len-1), computed in
float64 from float32 logits. Rows are run one at a time without padding, so position ids are
0..len-1.
"""

import argparse
import json
import os
import sys

import torch
import transformers

FIXTURE = "lora_llama_tiny"
VOCAB = 96
ROW_LENGTHS = [7, 12, 5]
ROW_SEED = 4321
BASE_SEED = 11
LORA_SEED = 12
LORA_STD = 0.05
LORA_R = 4
LORA_ALPHA = 8
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def fixed_rows():
    """Deterministic token rows with ids in [0, VOCAB)."""
    g = torch.Generator().manual_seed(ROW_SEED)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in ROW_LENGTHS]


def next_token_logprobs(model, row):
    """One unpadded row -> [len-1] log p(row[t+1] | row[..t]) in float64 (differentiable)."""
    ids = torch.tensor([row])
    pos = torch.arange(len(row)).unsqueeze(0)
    logits = model(input_ids=ids, position_ids=pos).logits.double()
    lp = torch.log_softmax(logits[0, :-1], dim=-1)
    return lp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)


def randomize(model, seed):
    """Large-ish random weights (HF's 0.02 init makes every logit ~equal, hiding bugs); same
    scheme as tools/hf_parity.py."""
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


def load_f32(auto_cls, path):
    """from_pretrained in float32 (`dtype=` since transformers 5, `torch_dtype=` before)."""
    major = int(transformers.__version__.split(".")[0])
    kwargs = {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}
    return auto_cls.from_pretrained(path, **kwargs).eval()


def folder_size(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def build_fixture(out):
    import peft
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file, save_file

    d = os.path.join(out, FIXTURE)
    base_dir = os.path.join(d, "base")
    adapter_dir = os.path.join(d, "adapter")
    os.makedirs(d, exist_ok=True)

    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(BASE_SEED)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    randomize(model, BASE_SEED)
    model.save_pretrained(base_dir, safe_serialization=True)

    lora_cfg = peft.LoraConfig(
        r=LORA_R,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=TARGET_MODULES,
        task_type="CAUSAL_LM",
    )
    pm = peft.get_peft_model(model, lora_cfg).eval()
    # get_peft_model overwrites base_model_name_or_path with the model's (empty) name and keeps
    # target_modules as a set (its json order then varies run to run): pin both for the file.
    pm.peft_config["default"].base_model_name_or_path = "base"
    pm.peft_config["default"].target_modules = sorted(pm.peft_config["default"].target_modules)
    # Re-draw every lora_A and lora_B (PEFT's default B = 0 would make the adapter a no-op).
    g = torch.Generator().manual_seed(LORA_SEED)
    with torch.no_grad():
        for name, p in sorted(pm.named_parameters()):
            if ".lora_A." in name or ".lora_B." in name:
                p.copy_(LORA_STD * torch.randn(p.shape, generator=g, dtype=torch.float32))
    pm.save_pretrained(adapter_dir, safe_serialization=True, save_embedding_layers=False)
    readme = os.path.join(adapter_dir, "README.md")  # PEFT's model-card boilerplate
    if os.path.exists(readme):
        os.remove(readme)

    rows = fixed_rows()
    with torch.no_grad(), pm.disable_adapter():
        logprobs_base = [next_token_logprobs(pm, r).tolist() for r in rows]
    pm.zero_grad(set_to_none=True)
    per_row = [next_token_logprobs(pm, r) for r in rows]
    loss = sum(lp.sum() for lp in per_row)
    loss.backward()
    loss = loss.item()
    logprobs = [lp.detach().tolist() for lp in per_row]

    grads = {n: p.grad.detach().float().contiguous() for n, p in pm.named_parameters() if p.requires_grad}
    grads = get_peft_model_state_dict(pm, state_dict=grads, save_embedding_layers=False)
    grads = {k: v.clone() for k, v in grads.items()}
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    if set(grads) != set(saved):
        sys.exit(f"gradient keys differ from the adapter file's: {sorted(set(grads) ^ set(saved))}")
    for k, v in saved.items():
        if grads[k].shape != v.shape:
            sys.exit(f"{k}: gradient shape {tuple(grads[k].shape)} != adapter shape {tuple(v.shape)}")
        if not ((".lora_A." in k or ".lora_B." in k) and k.endswith(".weight")):
            sys.exit(f"unexpected adapter key {k}")
    save_file(grads, os.path.join(d, "grads.safetensors"))

    golden = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "peft_version": peft.__version__,
        "r": LORA_R,
        "lora_alpha": LORA_ALPHA,
        "lora_scale": LORA_ALPHA / LORA_R,
        "target_modules": TARGET_MODULES,
        "rows": rows,
        "logprobs": logprobs,
        "logprobs_base": logprobs_base,
        "loss": loss,
        "loss_definition": "sum over rows of sum of adapter-active next-token log-probs; "
        "grads.safetensors holds d loss / d lora weights",
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    diff = max(abs(a - b) for la, lb in zip(logprobs, logprobs_base) for a, b in zip(la, lb))
    gmax = max(float(v.abs().max()) for v in grads.values())
    print(
        f"wrote {d} ({folder_size(d) / 1024:.0f} KiB): {len(saved)} lora tensors, loss {loss:.6f}, "
        f"max |logprob - logprob_base| {diff:.4f}, max |grad| {gmax:.4f}"
    )


def need_dir(path, files, what):
    if not os.path.isdir(path):
        print(f"error: {what} folder {path!r} does not exist", file=sys.stderr)
        sys.exit(2)
    for name in files:
        if not os.path.isfile(os.path.join(path, name)):
            print(f"error: {what} folder {path!r} has no {name}", file=sys.stderr)
            sys.exit(2)


def load_rows(rows_from):
    if not rows_from:
        return fixed_rows(), None
    if not os.path.isfile(rows_from):
        print(f"error: rows file {rows_from!r} does not exist", file=sys.stderr)
        sys.exit(2)
    with open(rows_from) as f:
        golden = json.load(f)
    return golden["rows"], golden.get("logprobs")


def check_rows(rows, vocab):
    bad = [t for r in rows for t in r if not 0 <= t < vocab]
    if bad:
        print(f"error: token ids {sorted(set(bad))} are outside the model's vocab of {vocab}", file=sys.stderr)
        sys.exit(2)


def summarize(kind, path, result, golden_lp):
    lps = result["logprobs"]
    n = sum(len(x) for x in lps)
    line = f"{kind} {path}: {len(lps)} rows, {n} tokens, mean logprob {sum(map(sum, lps)) / n:.6f}"
    if golden_lp is not None:
        d = max(abs(a - b) for la, lb in zip(lps, golden_lp) for a, b in zip(la, lb))
        line += f", max |diff| vs golden {d:.3e}"
    if "logprobs_base" in result:
        d = max(abs(a - b) for la, lb in zip(lps, result["logprobs_base"]) for a, b in zip(la, lb))
        line += f", max |adapter - base| {d:.4f}, {result['lora_layers']} lora layers, scale {result['lora_scale']}"
    return line


@torch.no_grad()
def check_adapter(adapter_dir, base_dir, rows_from, out):
    import peft
    from peft.tuners.lora import LoraLayer

    need_dir(base_dir, ["config.json"], "base model")
    need_dir(adapter_dir, ["adapter_config.json"], "adapter")
    rows, golden_lp = load_rows(rows_from)
    base = load_f32(transformers.AutoModelForCausalLM, base_dir)
    check_rows(rows, base.config.vocab_size)
    model = peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=False).eval()
    lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    scales = sorted({float(m.scaling[a]) for m in lora_layers for a in m.scaling})
    result = {
        "peft_version": peft.__version__,
        "transformers_version": transformers.__version__,
        "lora_scale": scales[0] if len(scales) == 1 else scales,
        "lora_layers": len(lora_layers),
        "rows": rows,
        "logprobs": [next_token_logprobs(model, r).tolist() for r in rows],
    }
    with model.disable_adapter():
        result["logprobs_base"] = [next_token_logprobs(model, r).tolist() for r in rows]
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(summarize("adapter", adapter_dir, result, golden_lp) + f"; wrote {out}")


@torch.no_grad()
def check_merged(merged_dir, rows_from, out):
    need_dir(merged_dir, ["config.json"], "merged model")
    rows, golden_lp = load_rows(rows_from)
    model = load_f32(transformers.AutoModelForCausalLM, merged_dir)
    check_rows(rows, model.config.vocab_size)
    result = {
        "transformers_version": transformers.__version__,
        "rows": rows,
        "logprobs": [next_token_logprobs(model, r).tolist() for r in rows],
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(summarize("merged", merged_dir, result, golden_lp) + f"; wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="fixtures folder (build mode; default models/tests/fixtures) or OUT.json (check modes)")
    ap.add_argument("--check-adapter", metavar="ADAPTER_DIR", help="PEFT adapter folder to load onto --base")
    ap.add_argument("--base", metavar="BASE_DIR", help="HF base model folder for --check-adapter")
    ap.add_argument("--check-merged", metavar="MERGED_DIR", help="plain HF causal-LM folder to evaluate")
    ap.add_argument("--rows-from", metavar="GOLDEN_JSON", help="take the token rows from this json's `rows`")
    args = ap.parse_args()
    if args.check_adapter and args.check_merged:
        ap.error("--check-adapter and --check-merged are separate runs")
    if args.check_adapter or args.check_merged:
        if not args.out:
            ap.error("the check modes need --out OUT.json")
        if args.check_adapter:
            if not args.base:
                ap.error("--check-adapter needs --base BASE_DIR")
            check_adapter(args.check_adapter, args.base, args.rows_from, args.out)
        else:
            check_merged(args.check_merged, args.rows_from, args.out)
    else:
        out = args.out or os.path.join(os.path.dirname(__file__), "..", "models", "tests", "fixtures")
        build_fixture(os.path.normpath(out))


if __name__ == "__main__":
    main()
