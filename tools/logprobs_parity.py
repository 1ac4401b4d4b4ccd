#!/usr/bin/env python3
"""Check `oxalign logprobs` (or `oxalign score`) output against transformers on the same folder.

Usage:
    oxalign logprobs --model DIR --input in.jsonl --output rust.jsonl
    python3 tools/logprobs_parity.py --model DIR --rust rust.jsonl [--tol 1e-4]

    oxalign score --model RM_DIR --input ids.jsonl --output scores.jsonl
    python3 tools/logprobs_parity.py --model RM_DIR --rust scores.jsonl --score --input ids.jsonl

For logprobs, each line of rust.jsonl holds input_ids and logprobs; the script recomputes
log p(ids[i+1] | ids[..=i]) with AutoModelForCausalLM in float32 and reports the largest
absolute difference. For --score, --input must hold {"input_ids": [...]} lines and the model
is loaded with AutoModelForSequenceClassification. Exits 1 when a difference exceeds --tol.
Needs torch and transformers.
"""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rust", required=True)
    ap.add_argument("--input", help="input ids (only with --score)")
    ap.add_argument("--score", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()

    import torch
    import transformers

    with open(args.rust, encoding="utf-8") as f:
        rust = [json.loads(line) for line in f if line.strip()]
    worst = 0.0
    if args.score:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            args.model, dtype=torch.float32
        ).eval()
        with open(args.input, encoding="utf-8") as f:
            ids = [json.loads(line)["input_ids"] for line in f if line.strip()]
        for seq, out in zip(ids, rust):
            with torch.no_grad():
                ref = model(torch.tensor([seq])).logits[0, 0].item()
            worst = max(worst, abs(ref - out["score"]))
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.model, dtype=torch.float32
        ).eval()
        for out in rust:
            seq = out["input_ids"]
            if len(seq) < 2:
                if out["logprobs"]:
                    print(f"a {len(seq)}-token sequence must have no logprobs")
                    return 1
                continue
            with torch.no_grad():
                logits = model(torch.tensor([seq])).logits[0, :-1].float()
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(seq[1:])[:, None])[:, 0]
            got = torch.tensor(out["logprobs"])
            if got.shape != ref.shape:
                print(f"length differs: {tuple(got.shape)} vs {tuple(ref.shape)}")
                return 1
            worst = max(worst, (got - ref).abs().max().item())
    print(f"max abs difference: {worst:.3g} (tolerance {args.tol:g})")
    if worst > args.tol:
        print(f"0 passed, {len(rust)} failed")
        return 1
    print(f"{len(rust)} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
