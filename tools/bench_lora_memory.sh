#!/usr/bin/env bash
# Peak RSS and step time of GRPO on the 56M Llama (`init_preset = "small"`, vocab 32000),
# full fine-tuning against LoRA (r 16, alpha 32, all linear layers) and LoRA on a bf16
# base (lora.base_dtype = "bf16"), alternated.
#
#   tools/bench_lora_memory.sh [REPS]        (default 2 rounds; BIN=target/release/oxalign;
#                                             MODES="full lora lora-bf16" by default;
#                                             EXTRA="--set k=v ..." applies to every mode)
#
# Each run: configs/grpo.toml without SFT, 4 RL steps of 16 prompts x 4 samples, 16 new
# tokens, in a fresh temporary folder. Prints one line per run: peak RSS (GNU time's
# maximum resident set), the median step, policy-update and refit times over steps 2-4,
# and from the last checkpoint the bytes trained (gradients are as large) and AdamW's state.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/target/release/oxalign}
REPS=${1:-2}
RECIPE=$PWD/configs/grpo.toml
COMMON=(--set model.init_preset=small --set sft.steps=0 --set run.steps=4
        --set run.checkpoint_every=100 --set rl.max_new_tokens=16 --quiet)
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; uptime: $(uptime | sed 's/.*load/load/')"
MODES=${MODES:-full lora lora-bf16}
read -r -a SHARED <<< "${EXTRA:-}"
for rep in $(seq "$REPS"); do
  for mode in $MODES; do
    dir=$(mktemp -d)
    extra=("${SHARED[@]}")
    case $mode in
      lora) extra+=(--set lora.r=16 --set lora.alpha=32) ;;
      lora-bf16) extra+=(--set lora.r=16 --set lora.alpha=32 --set lora.base_dtype=bf16) ;;
    esac
    ( cd "$dir" && /usr/bin/time -f "%M" -o rss.txt "$BIN" train "$RECIPE" "${COMMON[@]}" \
        --set run.name=b "${extra[@]}" > log.txt 2>&1 )
    python3 - "$mode" "$rep" "$dir" <<'PY'
import json, statistics, sys
mode, rep, d = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{d}/runs/b/metrics.jsonl")][1:]
med = lambda k: statistics.median(r[k] for r in rows)
rss = int(open(f"{d}/rss.txt").read().split()[-1]) / 1024
# The last checkpoint's files: what is trained (the adapter file, or every weight), whose
# gradients are as large, and AdamW's moments.
import glob, os
ckpt = sorted(glob.glob(f"{d}/runs/b/checkpoints/step_*"))[-1] + "/policy"
mib = lambda p: os.path.getsize(p) / 2**20
adapter = f"{ckpt}/adapter/adapter_model.safetensors"
trained = mib(adapter) if os.path.exists(adapter) else mib(f"{ckpt}/model.safetensors")
optim = mib(f"{ckpt}/optimizer/optimizer.safetensors")
print(f"{mode:9s} rep {rep}: peak RSS {rss:7.0f} MiB  step {med('step_seconds'):.2f} s  "
      f"update {med('time_train'):.2f} s  refit {med('refit_seconds'):.3f} s  "
      f"trained {trained:.1f} MiB  optimizer {optim:.1f} MiB")
PY
    rm -rf "$dir"
  done
done
