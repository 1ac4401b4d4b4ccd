#!/usr/bin/env python3
"""TRL baseline for `oxalign bench rl-step`: full GRPO steps with TRL's GRPOTrainer on CPU, on
the same model folder and prompt file, timed per step, with HF `generate` timed inside the step.

Each step: --prompts-per-step prompts x --samples completions (up to --max-new-tokens,
temperature 1), an exact-match reward, the reference model's log-probs (beta > 0), one
optimizer update (num_iterations 1, one minibatch), f32 (or with --bf16, TRL's `bf16=True`:
torch's bf16 autocast over f32 weights, the peer's mixed precision), torch threads = --threads.
Prints one JSON line: step seconds and generate seconds (median/min/max over the timed steps)
and the completion tokens per step.

Setup helpers (run once):
  --make-model DIR --tokenizer-from OXALIGN_TINY_DIR   writes the 11M-parameter Qwen2 of the
      benchmark (hidden 256, 4 layers, 4 heads, 2 KV heads, intermediate 704, vocab 32000,
      tied embeddings) with the byte-level tokenizer files of an `oxalign init-model` folder.
  --make-prompts FILE   writes 256 arithmetic prompts {"prompt": "a+b=", "answer": "..."}.

Usage:
  python3 tools/bench_trl_grpo.py --model DIR --prompts FILE --steps 3 --warmup 1 --threads 2
"""
import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time


def make_model(out_dir, tokenizer_from):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    os.makedirs(out_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_from, name), os.path.join(out_dir, name))
    src = json.load(open(os.path.join(tokenizer_from, "config.json")))
    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=src.get("bos_token_id"),
        eos_token_id=src.get("eos_token_id"),
        pad_token_id=src.get("pad_token_id"),
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out_dir, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out_dir}: qwen2, {n / 1e6:.1f}M parameters, vocab 32000")


def make_prompts(path, n=256, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    print(f"wrote {n} prompts to {path}")


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def run(args):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    rows = [json.loads(l) for l in open(args.prompts) if l.strip()]
    answers = {r["prompt"]: r["answer"] for r in rows}
    dataset = Dataset.from_list([{"prompt": r["prompt"]} for r in rows])

    def exact_match(prompts, completions, **_):
        return [1.0 if c.strip() == answers[p] else 0.0 for p, c in zip(prompts, completions)]

    tok = AutoTokenizer.from_pretrained(args.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    out = tempfile.mkdtemp(prefix="trl-grpo-bench-")
    batch = args.prompts_per_step * args.samples
    cfg = GRPOConfig(
        output_dir=out,
        use_cpu=True,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=args.samples,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        beta=args.beta,
        num_iterations=1,
        learning_rate=1e-5,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=args.bf16,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=exact_match, args=cfg, train_dataset=dataset, processing_class=tok
    )
    gen_times, step_times, tokens = [], [], []
    gen_acc = {"t": 0.0}
    inner = trainer.model.generate

    def timed_generate(*a, **k):
        t = time.perf_counter()
        result = inner(*a, **k)
        gen_acc["t"] += time.perf_counter() - t
        return result

    trainer.model.generate = timed_generate

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            gen_acc["t"] = 0.0
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, *_, **__):
            step_times.append(time.perf_counter() - self.t0)
            gen_times.append(gen_acc["t"])

        def on_log(self, _args, state, control, logs=None, **__):
            if logs and "completions/mean_length" in logs:
                tokens.append(logs["completions/mean_length"] * batch)

    trainer.add_callback(StepTimer())
    trainer.train()
    shutil.rmtree(out, ignore_errors=True)
    w = args.warmup
    report = {
        "bench": "trl-grpo-step",
        "trl": __import__("trl").__version__,
        "torch": torch.__version__,
        "threads": args.threads,
        "precision": "bf16-autocast" if args.bf16 else "f32",
        "prompts_per_step": args.prompts_per_step,
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "steps": len(step_times[w:]),
        "step_seconds": spread(step_times[w:]),
        "generate_seconds": spread(gen_times[w:]),
        "completion_tokens": spread(tokens[w:]) if len(tokens) > w else None,
    }
    print(json.dumps(report))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--make-model")
    p.add_argument("--tokenizer-from")
    p.add_argument("--make-prompts")
    p.add_argument("--model")
    p.add_argument("--prompts")
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bf16", action="store_true", help="TRL's bf16=True (autocast, f32 weights)")
    args = p.parse_args()
    if args.make_model:
        if not args.tokenizer_from:
            sys.exit("--make-model needs --tokenizer-from (an oxalign init-model folder)")
        make_model(args.make_model, args.tokenizer_from)
    if args.make_prompts:
        make_prompts(args.make_prompts)
    if args.model and args.prompts:
        run(args)


if __name__ == "__main__":
    main()
