#!/usr/bin/env python3
"""HF transformers baseline for `oxalign bench generate`: greedy `model.generate` on the same
seeded random prompts (same LCG as src/cmd/bench_generate.rs), eos ignored, prints one JSON line
(tokens/s median/min/max over --runs, time to first token, peak RSS).

Usage: python3 tools/bench_hf_generate.py --model DIR --batch 32 --prompt-len 32 \
           --new-tokens 128 --runs 3 --threads 2 [--bf16]

--bf16 loads the model in bfloat16 (`torch_dtype=torch.bfloat16`), HF's fast setting on CPUs
with AVX512-BF16/AMX; compare it with `oxalign bench generate --quant bf16` and `--quant int8`.
"""
import argparse
import json
import resource
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def random_prompts(seed, batch, length, vocab):
    """Same generator as `random_prompts` in src/cmd/bench_generate.rs."""
    mask = (1 << 64) - 1
    x = seed ^ 0x2545F4914F6CDD1D
    out = []
    for _ in range(batch):
        row = []
        for _ in range(length):
            x = (x * 6364136223846793005 + 1442695040888963407) & mask
            row.append(1 + (x >> 33) % max(vocab - 1, 1))
        out.append(row)
    return out


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action="store_true", help="load the model in bfloat16")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype)
    model.eval()
    model.generation_config.eos_token_id = None
    vocab = model.config.vocab_size
    ids = torch.tensor(random_prompts(a.seed, a.batch, a.prompt_len, vocab), dtype=torch.long)
    mask = torch.ones_like(ids)

    def generate(n):
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
        return out[:, ids.shape[1]:]

    for _ in range(a.warmup):
        generate(1)
    ttft = []
    for _ in range(a.runs):
        t = time.perf_counter()
        generate(1)
        ttft.append(time.perf_counter() - t)
    secs, rates = [], []
    first = None
    for _ in range(a.runs):
        t = time.perf_counter()
        out = generate(a.new_tokens)
        s = time.perf_counter() - t
        secs.append(s)
        rates.append(out.numel() / s)
        first = out[0, :8].tolist()
    print(json.dumps({
        "bench": "generate",
        "engine": "hf-transformers",
        "torch": torch.__version__,
        "threads": a.threads,
        "batch": a.batch,
        "prompt_len": a.prompt_len,
        "new_tokens": a.new_tokens,
        "runs": a.runs,
        "generated_tokens": int(out.numel()),
        "tokens_per_sec": spread(rates),
        "run_seconds": spread(secs),
        "ttft_seconds": spread(ttft),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "row0_first_tokens": first,
    }))


if __name__ == "__main__":
    main()
