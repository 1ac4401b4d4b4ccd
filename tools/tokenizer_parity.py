#!/usr/bin/env python3
"""Check that transformers' AutoTokenizer agrees with `oxalign tokenize` on a model folder.

Usage:
    oxalign tokenize --model DIR --input in.jsonl --output rust.jsonl [--chat --add-generation-prompt]
    python3 tools/tokenizer_parity.py --model DIR --input in.jsonl --rust rust.jsonl \
        [--chat --add-generation-prompt]

Each input line is {"text": ...} or {"messages": [...]} (as for `oxalign tokenize`). For every
line, the ids transformers produces (tokenizer(text) / apply_chat_template) must equal the ids
in the matching line of rust.jsonl, and decoding them must give the same text. Exits 1 on the
first mismatch. Needs `transformers` (and `tokenizers`); no torch.
"""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--rust", required=True, help="output of `oxalign tokenize` on --input")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--add-generation-prompt", action="store_true")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    with open(args.input, encoding="utf-8") as f:
        inputs = [json.loads(line) for line in f if line.strip()]
    with open(args.rust, encoding="utf-8") as f:
        rust = [json.loads(line) for line in f if line.strip()]
    if len(inputs) != len(rust):
        print(f"line count differs: {len(inputs)} inputs, {len(rust)} rust outputs")
        return 1
    for n, (rec, out) in enumerate(zip(inputs, rust), start=1):
        if "messages" in rec or args.chat:
            messages = rec.get("messages") or [{"role": "user", "content": rec["text"]}]
            text = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=args.add_generation_prompt
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
        elif "text" in rec:
            ids = tok(rec["text"])["input_ids"]
        else:
            ids = rec["input_ids"]
        if ids != out["input_ids"]:
            print(f"line {n}: ids differ\n  transformers: {ids}\n  oxalign:      {out['input_ids']}")
            return 1
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != out["text"]:
            print(f"line {n}: decoded text differs\n  transformers: {decoded!r}\n  oxalign:      {out['text']!r}")
            return 1
    print(f"{len(inputs)} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
