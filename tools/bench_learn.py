#!/usr/bin/env python3
"""Learning benchmark: held-out accuracy before and after RL, per algorithm and seed, with
TRL's GRPOTrainer on the same task, the same SFT weights and the same wall-clock budget.

For each seed (alternating ours and TRL's, seed by seed):
  * `oxalign train configs/learn/<algorithm>.toml --set run.seed=S` for each algorithm: a short
    SFT on two-digit addition, then RL. Its summary.json gives the held-out accuracy after SFT
    and after RL (greedy, and the mean over 8 samples at temperature 1) and the wall time;
    metrics.jsonl gives the RL phase's wall time.
  * TRL: GRPOTrainer from the GRPO run's SFT checkpoint (`checkpoints/step_000000/policy`),
    on the same training prompts (`oxalign data arithmetic`, same seed and split), with the
    GRPO recipe's settings (16 prompts x 8 samples, 4 tokens, temperature 1, lr, beta = kl_coef,
    2 epochs over 4 minibatches of 32), stopped when its training time reaches our GRPO RL
    phase's. Held-out accuracy is measured here with HF generate, the same way, before
    (a check of the evaluation: it must match our after-SFT figure) and after.

Prints one JSON line per run and writes the table (mean +- standard error over seeds) to
stdout at the end. Needs torch, transformers, trl and datasets (CPU).

Usage:
  python3 tools/bench_learn.py --binary target/release/oxalign --seeds 1,2,3 \
      --algorithms ppo,grpo,dapo,gspo,rloo --trl --work /tmp/learn
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = 8  # the sampled accuracy's samples per prompt, as in oxalign's evaluation


def toml_value(recipe, section, key):
    import tomllib

    with open(recipe, "rb") as f:
        return tomllib.load(f)[section][key]


def run_ours(binary, algorithm, seed, work):
    recipe = os.path.join(REPO, "configs", "learn", f"{algorithm}.toml")
    d = os.path.join(work, f"{algorithm}-{seed}")
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    out = subprocess.run(
        [binary, "train", recipe, "--quiet", "--set", f"run.seed={seed}",
         "--set", "run.keep_checkpoints=1000"],
        cwd=d, capture_output=True, text=True,
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        return {"system": "oxalign", "algorithm": algorithm, "seed": seed,
                "failed": out.stderr.strip()[-400:]}
    run_dir = os.path.join(d, "runs", toml_value(recipe, "run", "name"))
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    m = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    # RL phase: from the first step's start to the last step's end.
    rl_seconds = (m[-1]["unix_ms"] - m[0]["unix_ms"]) / 1000.0 + m[0]["step_seconds"]
    return {
        "system": "oxalign", "algorithm": algorithm, "seed": seed,
        "greedy_sft": s["accuracy_sft"], "greedy_rl": s["accuracy_final"],
        "sampled_sft": s["sampled_accuracy_sft"], "sampled_rl": s["sampled_accuracy_final"],
        "rl_steps": len(m), "rl_seconds": rl_seconds, "wall_seconds": wall,
        "sft_policy": os.path.join(run_dir, "checkpoints", "step_000000", "policy"),
    }


def load_prompts(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def exact(completion, answer):
    return completion.split("\n")[0].strip() == answer.strip()


def evaluate(model, tok, rows, max_new_tokens, seed):
    """Greedy accuracy and the mean accuracy of SAMPLES samples at temperature 1."""
    import torch

    tok.padding_side = "left"
    enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True,
              add_special_tokens=False)
    n = enc["input_ids"].shape[1]
    eos = tok.eos_token_id
    with torch.no_grad():
        g = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                           eos_token_id=eos, pad_token_id=tok.pad_token_id)
        torch.manual_seed(seed)
        s = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=SAMPLES,
                           eos_token_id=eos, pad_token_id=tok.pad_token_id)
    dec = lambda ids: tok.decode(ids[n:], skip_special_tokens=True)
    greedy = sum(exact(dec(g[i]), r["answer"]) for i, r in enumerate(rows)) / len(rows)
    sampled = sum(
        exact(dec(s[i * SAMPLES + j]), r["answer"])
        for i, r in enumerate(rows) for j in range(SAMPLES)
    ) / (len(rows) * SAMPLES)
    return greedy, sampled


def run_trl(binary, seed, work, sft_policy, budget_seconds, threads):
    import tempfile
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    recipe = os.path.join(REPO, "configs", "learn", "grpo.toml")
    get = lambda sec, key: toml_value(recipe, sec, key)
    data = os.path.join(work, f"data-{seed}")
    subprocess.run([binary, "data", "arithmetic", "--out", data, "--seed", str(seed),
                    "--max-operand", str(get("data", "max_operand")),
                    "--eval-size", str(get("data", "eval_size"))],
                   check=True, capture_output=True)
    train = load_prompts(os.path.join(data, "prompts.train.jsonl"))
    held_out = load_prompts(os.path.join(data, "prompts.eval.jsonl"))
    answers = {r["prompt"]: r["answer"] for r in train}
    torch.set_num_threads(threads)
    random.seed(seed)
    tok = AutoTokenizer.from_pretrained(sft_policy)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(sft_policy, torch_dtype=torch.float32)
    max_new = get("rl", "max_new_tokens")
    before = evaluate(model, tok, held_out, max_new, seed)

    def exact_match(prompts, completions, **_):
        return [1.0 if exact(c, answers[p]) else 0.0 for p, c in zip(prompts, completions)]

    prompts, samples = get("rl", "prompts_per_step"), get("rl", "samples_per_prompt")
    minibatch = get("rl", "minibatch_size")
    out = tempfile.mkdtemp(prefix="trl-learn-")
    cfg = GRPOConfig(
        output_dir=out, use_cpu=True, per_device_train_batch_size=minibatch,
        steps_per_generation=prompts * samples // minibatch, num_generations=samples,
        num_iterations=get("rl", "ppo_epochs"), max_completion_length=max_new,
        temperature=1.0, beta=get("rl", "kl_coef"), learning_rate=get("rl", "lr"),
        lr_scheduler_type="constant", max_grad_norm=1.0, max_steps=10**6,
        logging_steps=10**6, save_strategy="no", report_to=[], bf16=False, seed=seed,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    tok.padding_side = "left"
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=cfg,
                          train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in train]),
                          processing_class=tok)

    class Budget(TrainerCallback):
        def on_train_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, control, **__):
            if time.perf_counter() - self.t0 >= budget_seconds:
                control.should_training_stop = True

    budget = Budget()
    trainer.add_callback(budget)
    trainer.train()
    seconds = time.perf_counter() - budget.t0
    optimizer_steps = trainer.state.global_step
    after = evaluate(trainer.model, tok, held_out, max_new, seed)
    return {
        "system": "trl", "algorithm": "grpo", "seed": seed, "trl": __import__("trl").__version__,
        "torch": torch.__version__, "greedy_sft": before[0], "greedy_rl": after[0],
        "sampled_sft": before[1], "sampled_rl": after[1],
        "rl_steps": optimizer_steps * minibatch // (prompts * samples) // cfg.num_iterations,
        "optimizer_steps": optimizer_steps, "rl_seconds": seconds,
    }


def mean_se(xs):
    if not xs:
        return float("nan"), float("nan")
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return m, se


def table(rows):
    print("| system | algorithm | seeds | greedy: after SFT → after RL | greedy gain | "
          "sampled: after SFT → after RL | sampled gain | RL steps | RL wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["system"], r["algorithm"]) for r in rows}, key=lambda k: (k[0] != "oxalign", k))
    for system, algo in keys:
        rs = [r for r in rows if (r["system"], r["algorithm"]) == (system, algo) and "failed" not in r]
        failed = sum(1 for r in rows if (r["system"], r["algorithm"]) == (system, algo) and "failed" in r)
        cell = lambda k: mean_se([100 * r[k] for r in rs])
        gain = lambda a, b: mean_se([100 * (r[b] - r[a]) for r in rs])
        g0, g1, s0, s1 = cell("greedy_sft"), cell("greedy_rl"), cell("sampled_sft"), cell("sampled_rl")
        gg, sg = gain("greedy_sft", "greedy_rl"), gain("sampled_sft", "sampled_rl")
        steps = statistics.median([r["rl_steps"] for r in rs]) if rs else 0
        secs = statistics.median([r["rl_seconds"] for r in rs]) if rs else 0
        note = f" ({failed} failed)" if failed else ""
        print(f"| {system} | {algo} | {len(rs)}{note} | {g0[0]:.1f} → {g1[0]:.1f} | "
              f"{gg[0]:+.1f} ± {gg[1]:.1f} | {s0[0]:.1f} → {s1[0]:.1f} | {sg[0]:+.1f} ± {sg[1]:.1f} | "
              f"{steps:.0f} | {secs:.0f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default=os.path.join(REPO, "target", "release", "oxalign"))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--algorithms", default="ppo,grpo,dapo,gspo,rloo")
    p.add_argument("--trl", action="store_true", help="also run TRL's GRPOTrainer per seed")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default="/tmp/oxalign-learn")
    p.add_argument("--table-from", help="only print the table of an earlier run's JSONL")
    args = p.parse_args()
    if args.table_from:
        table([json.loads(l) for l in open(args.table_from)])
        return
    os.makedirs(args.work, exist_ok=True)
    log = open(os.path.join(args.work, "results.jsonl"), "a")
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for algo in args.algorithms.split(","):
            r = run_ours(args.binary, algo, seed, args.work)
            rows.append(r)
            print(json.dumps(r), flush=True)
            log.write(json.dumps(r) + "\n")
            log.flush()
        if args.trl:
            grpo = next((r for r in rows if r["seed"] == seed and r["algorithm"] == "grpo"
                         and r["system"] == "oxalign" and "failed" not in r), None)
            if grpo is None:
                print(f"seed {seed}: no GRPO run to take the SFT weights and budget from",
                      file=sys.stderr)
                continue
            r = run_trl(args.binary, seed, args.work, grpo["sft_policy"], grpo["rl_seconds"],
                        args.threads)
            rows.append(r)
            print(json.dumps(r), flush=True)
            log.write(json.dumps(r) + "\n")
            log.flush()
    table(rows)


if __name__ == "__main__":
    main()
