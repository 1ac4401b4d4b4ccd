#!/usr/bin/env bash
# The peer comparison of docs/PERFORMANCE.md in one command: oxalign's benchmarks and the
# peers' (HF transformers `generate`, PyTorch eager training, TRL's GRPOTrainer) run side by
# side, alternated run by run, for ROUNDS rounds, on the same model folders. Prints one
# Markdown table (median of each side's per-round medians, min-max over the rounds, the
# ratio against each peer) headed by the CPU model, its relevant flags and the load average.
#
#   cargo build --release
#   python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers trl
#   PYTHON=/tmp/venv/bin/python tools/bench_peers.sh [generate] [train] [rl-step] [qs-step] [large]
#
# With no row named, all five run. Environment: OX (oxalign binary, default
# target/release/oxalign), PYTHON (with torch + transformers; trl for rl-step), ROUNDS
# (default 2), WORK (folder for the models and raw JSON lines, default a fresh temp folder),
# THREADS (default 2), TORCH_BF16 (default 1; 0 skips PyTorch's bf16 autocast training,
# which has no hardware path on CPUs without AVX512-BF16/AMX and takes minutes per step
# there). Rows:
#   generate  56.4M Llama (`init-model --preset small`), 32 prompts of 32 tokens + 128 greedy
#             tokens, and batch 1: oxalign f32 / bf16 / int8 against HF f32 and bf16
#   train     the same model, batch 8 x 256, AdamW: oxalign f32 and bf16-mixed against
#             PyTorch eager f32 and PyTorch autocast bf16
#   rl-step   the 11M Qwen2 of tools/bench_trl_grpo.py, 16 prompts x 8 samples, 64 tokens:
#             oxalign GRPO steps against TRL's, f32, then bf16 on both sides (ours bf16-mixed
#             trainers and a bf16 engine; TRL's bf16=True autocast)
#   qs-step   the quickstart's 0.8M Llama (`init-model --preset tiny`), 16 prompts x 4
#             samples, 4 tokens: GRPO steps per second, oxalign against TRL (f32)
#   large     a 245.9M Llama made by transformers (tools/bench_make_llama.py: hidden 1024,
#             16 layers): training 4 x 256 (f32, bf16) and generation b32, 32 + 64 tokens
# Run it on a quiet machine (check `uptime`); a spread over 20% is not a result.
set -euo pipefail

OX=${OX:-target/release/oxalign}
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
WORK=${WORK:-$(mktemp -d)}
ROWS=("$@")
[ ${#ROWS[@]} -eq 0 ] && ROWS=(generate train rl-step qs-step large)
HERE=$(cd "$(dirname "$0")" && pwd)
RAW="$WORK/results.jsonl"
mkdir -p "$WORK"
: >"$RAW"

[ -x "$OX" ] || { echo "bench_peers: $OX not found; run cargo build --release" >&2; exit 2; }
"$PYTHON" -c "import torch, transformers" 2>/dev/null ||
  { echo "bench_peers: $PYTHON lacks torch or transformers (set PYTHON=)" >&2; exit 2; }

# Appends one labelled JSON line: record ROW LABEL SIDE COMMAND...
record() {
  local row=$1 label=$2 side=$3
  shift 3
  local line
  line=$("$@" 2>/dev/null | grep '^{' | tail -n 1) ||
    { echo "bench_peers: $label failed: $*" >&2; return 1; }
  printf '{"row":"%s","label":"%s","side":"%s","result":%s}\n' "$row" "$label" "$side" "$line" >>"$RAW"
  echo "  $row / $label done" >&2
}

small="$WORK/small"
[ -f "$small/config.json" ] || "$OX" init-model --family llama --preset small --out "$small" >/dev/null

generate_round() {
  local b
  for b in 32 1; do
    local args=(--model "$small" --batch "$b" --prompt-len 32 --new-tokens 128 --runs 3)
    record "generate b$b" "oxalign f32" ours "$OX" bench generate "${args[@]}" --quant none
    record "generate b$b" "HF f32" peer "$PYTHON" "$HERE/bench_hf_generate.py" "${args[@]}" --threads "$THREADS"
    record "generate b$b" "oxalign bf16" ours "$OX" bench generate "${args[@]}" --quant bf16
    record "generate b$b" "HF bf16" peer "$PYTHON" "$HERE/bench_hf_generate.py" "${args[@]}" --threads "$THREADS" --bf16
    record "generate b$b" "oxalign int8" ours "$OX" bench generate "${args[@]}" --quant int8
  done
}

train_round() {
  local args=(--model "$small" --batch 8 --seq 256 --steps 3 --warmup 1)
  record "train 8x256" "oxalign f32" ours "$OX" bench train "${args[@]}"
  record "train 8x256" "PyTorch f32" peer "$PYTHON" "$HERE/bench_torch_train.py" "${args[@]}" --threads "$THREADS"
  if [ "${TORCH_BF16:-1}" != 0 ]; then
    record "train 8x256" "PyTorch bf16 autocast" peer "$PYTHON" "$HERE/bench_torch_train.py" "${args[@]}" --threads "$THREADS" --bf16
  fi
  record "train 8x256" "oxalign bf16-mixed" ours "$OX" bench train "${args[@]}" --precision bf16-mixed
}

rl_step_round() {
  local q="$WORK/q11m" p="$WORK/prompts.jsonl"
  if [ ! -f "$q/config.json" ]; then
    "$OX" init-model --family qwen2 --preset tiny --out "$WORK/tinyq" >/dev/null
    "$PYTHON" "$HERE/bench_trl_grpo.py" --make-model "$q" --tokenizer-from "$WORK/tinyq" --make-prompts "$p" >/dev/null
  fi
  record "GRPO step 16x8" "oxalign f32" ours "$OX" bench rl-step --model "$q" --prompts "$p" --steps 2 --warmup 1
  record "GRPO step 16x8" "TRL f32" peer "$PYTHON" "$HERE/bench_trl_grpo.py" --model "$q" --prompts "$p" --steps 2 --warmup 1 --threads "$THREADS"
  if [ "${TORCH_BF16:-1}" != 0 ]; then
    record "GRPO step 16x8 bf16" "oxalign bf16" ours "$OX" bench rl-step --model "$q" --prompts "$p" --steps 2 --warmup 1 --precision bf16-mixed --quant bf16
    record "GRPO step 16x8 bf16" "TRL bf16" peer "$PYTHON" "$HERE/bench_trl_grpo.py" --model "$q" --prompts "$p" --steps 2 --warmup 1 --threads "$THREADS" --bf16
  fi
}

qs_step_round() {
  local m="$WORK/qs" p="$WORK/prompts.jsonl"
  [ -f "$m/config.json" ] || "$OX" init-model --family llama --preset tiny --out "$m" >/dev/null
  [ -f "$p" ] || "$PYTHON" "$HERE/bench_trl_grpo.py" --make-prompts "$p" >/dev/null
  local args=(--model "$m" --prompts "$p" --prompts-per-step 16 --samples 4 --max-new-tokens 4 --steps 8 --warmup 2)
  record "GRPO step 0.8M 16x4" "oxalign f32" ours "$OX" bench rl-step "${args[@]}"
  record "GRPO step 0.8M 16x4" "TRL f32" peer "$PYTHON" "$HERE/bench_trl_grpo.py" "${args[@]}" --threads "$THREADS"
}

large_round() {
  local m="$WORK/large"
  [ -f "$m/config.json" ] || "$PYTHON" "$HERE/bench_make_llama.py" --out "$m" --tokenizer-from "$small" >/dev/null
  local t=(--model "$m" --batch 4 --seq 256 --steps 2 --warmup 1)
  record "246M train 4x256" "oxalign f32" ours "$OX" bench train "${t[@]}"
  record "246M train 4x256" "PyTorch f32" peer "$PYTHON" "$HERE/bench_torch_train.py" "${t[@]}" --threads "$THREADS"
  if [ "${TORCH_BF16:-1}" != 0 ]; then
    record "246M train 4x256" "PyTorch bf16 autocast" peer "$PYTHON" "$HERE/bench_torch_train.py" "${t[@]}" --threads "$THREADS" --bf16
  fi
  record "246M train 4x256" "oxalign bf16-mixed" ours "$OX" bench train "${t[@]}" --precision bf16-mixed
  local g=(--model "$m" --batch 32 --prompt-len 32 --new-tokens 64 --runs 2)
  record "246M generate b32" "oxalign f32" ours "$OX" bench generate "${g[@]}" --quant none
  record "246M generate b32" "HF f32" peer "$PYTHON" "$HERE/bench_hf_generate.py" "${g[@]}" --threads "$THREADS"
  record "246M generate b32" "oxalign bf16" ours "$OX" bench generate "${g[@]}" --quant bf16
  record "246M generate b32" "HF bf16" peer "$PYTHON" "$HERE/bench_hf_generate.py" "${g[@]}" --threads "$THREADS" --bf16
  record "246M generate b32" "oxalign int8" ours "$OX" bench generate "${g[@]}" --quant int8
}

echo "bench_peers: $ROUNDS rounds of ${ROWS[*]}; raw results in $RAW" >&2
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round" >&2
  for row in "${ROWS[@]}"; do
    case $row in
      generate) generate_round ;;
      train) train_round ;;
      rl-step)
        if "$PYTHON" -c "import trl" 2>/dev/null; then rl_step_round; else echo "bench_peers: no trl, rl-step skipped" >&2; fi ;;
      qs-step)
        if "$PYTHON" -c "import trl" 2>/dev/null; then qs_step_round; else echo "bench_peers: no trl, qs-step skipped" >&2; fi ;;
      large) large_round ;;
      *) echo "bench_peers: unknown row $row (generate, train, rl-step, qs-step, large)" >&2; exit 2 ;;
    esac
  done
done

model=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
flags=$(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|avx512_vnni|amx_bf16|amx_int8|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)
"$PYTHON" "$HERE/bench_peers_table.py" "$RAW" "$model" "${flags:-none}" "$(cut -d' ' -f1-3 /proc/loadavg)"
