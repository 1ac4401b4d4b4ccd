#!/usr/bin/env python3
"""PyTorch eager baseline for `oxalign bench train` (run by hand; needs torch + transformers).

    python3 tools/bench_torch_train.py --model DIR --batch 8 --seq 256 --steps 5 --warmup 1 \
        [--threads 2] [--peak-gflops G] [--attn sdpa|eager] [--bf16]

Loads the same HF folder with AutoModelForCausalLM in float32 and runs, on a seeded random
[batch, seq] token batch, --warmup untimed then --steps timed steps of: forward, next-token
cross-entropy over all positions (logits for positions 0..seq-2 only, mean over batch*(seq-1)
targets), backward, clip_grad_norm_(max_grad_norm) and torch.optim.AdamW. It prints ONE JSON
line with the same fields as `oxalign bench train` (token ids differ: a different RNG, same
distribution). The FLOPs formula is the same: 6 * matmul_params * batch * seq
+ 12 * layers * heads * head_dim * seq^2 * batch, matmul_params = all parameters but the input
embedding table (unless tied). MFU is against --peak-gflops (pass `oxalign bench matmul`'s
median to compare both with one peak) or, when omitted, torch's own 2048^3 GEMM median (f32,
or bf16 with --bf16).
--bf16 runs the forward and the loss under `torch.autocast("cpu", dtype=torch.bfloat16)`
(f32 master weights and AdamW state, bf16 matmuls): PyTorch's mixed precision, its best
setting on CPUs with AVX512-BF16 or AMX. It measures; it does not check numerics against
oxalign.
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


def spread(values):
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def peak_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def matmul_peak(n=2048, reps=7, dtype=torch.float32):
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.matmul(a, b)
    gflops = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        gflops.append(2.0 * n**3 / (time.perf_counter() - t0) / 1e9)
    out = {"size": n, "reps": reps, "threads": torch.get_num_threads(), "dtype": str(dtype)}
    out.update({f"gflops_{k}": v for k, v in spread(gflops).items()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak-gflops", type=float, default=None)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--bf16", action="store_true", help="torch.autocast('cpu', bfloat16)")
    args = ap.parse_args()
    if args.seq < 2 or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("need --seq >= 2, --batch >= 1, --steps >= 1, --warmup >= 0")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    matmul = None
    if args.peak_gflops is None:
        # The GEMM of the precision the step multiplies in (autocast: bf16 operands).
        matmul = matmul_peak(dtype=torch.bfloat16 if args.bf16 else torch.float32)
        peak, peak_source = matmul["gflops_median"], "measured"
    else:
        peak, peak_source = args.peak_gflops, "given"

    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation=args.attn
    )
    model.train()
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    matmul_params = params if tied else params - embed
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    b, t = args.batch, args.seq
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    targets = ids[:, 1:].reshape(-1)

    step_s, fwd_s, bwd_s, opt_s, cpu_s, losses = [], [], [], [], [], []
    for i in range(args.warmup + args.steps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
            logits = model.lm_head(hidden)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets)
        loss_value = loss.item()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        c1 = time.process_time()
        del hidden, logits, loss
        losses.append(loss_value)
        if i >= args.warmup:
            fwd_s.append(t1 - t0)
            bwd_s.append(t2 - t1)
            opt_s.append(t3 - t2)
            step_s.append(t3 - t0)
            cpu_s.append(c1 - c0)

    tokens = b * t
    tps = [tokens / s for s in step_s]
    layers = cfg.num_hidden_layers
    flops = 6.0 * matmul_params * b * t + 12.0 * layers * heads * head_dim * t * t * b
    step = spread(step_s)
    achieved = flops / step["median"] / 1e9
    print(
        json.dumps(
            {
                "bench": "train_torch",
                "model": args.model,
                "torch": torch.__version__,
                "attn_implementation": args.attn,
                "precision": "bf16-autocast" if args.bf16 else "f32",
                "params": params,
                "matmul_params": matmul_params,
                "layers": layers,
                "hidden": cfg.hidden_size,
                "vocab": cfg.vocab_size,
                "batch": b,
                "seq": t,
                "tokens_per_step": tokens,
                "warmup": args.warmup,
                "steps": args.steps,
                "threads": torch.get_num_threads(),
                "tokens_per_sec": statistics.median(tps),
                "tokens_per_sec_min": min(tps),
                "tokens_per_sec_max": max(tps),
                "step_seconds": step,
                "forward_seconds": spread(fwd_s),
                "backward_seconds": spread(bwd_s),
                "optimizer_seconds": spread(opt_s),
                "step_cpu_seconds": spread(cpu_s),
                "flops_per_step": flops,
                "achieved_gflops": achieved,
                "peak_gflops": peak,
                "peak_source": peak_source,
                "matmul": matmul,
                "mfu": achieved / peak,
                "loss_first": losses[0],
                "loss_last": losses[-1],
                "peak_rss_bytes": peak_rss_bytes(),
            }
        )
    )


if __name__ == "__main__":
    main()
