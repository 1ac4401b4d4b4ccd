#!/usr/bin/env bash
# GPU check of the `cuda` feature: nvidia-smi, a `--features cuda` build of oxalign-kernels,
# and its GPU tests (the fused ops and the NCCL collectives: one rank, and two ranks when a
# second GPU is there), with a short report in $OUT/gpu-check.txt (or ./gpu-check.txt).
#
#   bash tools/gpu-check.sh          # from the repository root, on a machine with a GPU
#
# What the machine needs (it may have no internet, so nothing is fetched):
#   * an NVIDIA driver (libcuda.so.1) and nvcc (CUDA 11.4 to 13.2; cudarc 0.19's range);
#   * cargo and rustc >= 1.85 on PATH, or in $OXALIGN_TOOLCHAIN/bin;
#   * the crates: either a `vendor/` folder made with `cargo vendor` on a machine with
#     internet (the script then builds with `--offline` from it), or a CARGO_HOME that
#     already holds them. A prebuilt target folder can be reused with CARGO_TARGET_DIR;
#   * the CUDA libraries the binaries link (cuda, nvrtc, cublas, cublasLt, curand, nccl),
#     found in the system's library path, $CUDA_HOME, or pip's nvidia-* wheels of
#     `python3` (nvidia-nccl-cu13 and friends); their unversioned links are made here.
# Linking needs libnccl: candle-core builds cudarc with dynamic *linking*, and cudarc cannot
# load some libraries at run time and link others, so NCCL is linked like cuBLAS.
# The whole check stops after 9 minutes (OXALIGN_GPU_CHECK_TIMEOUT seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT="${OUT:-.}/gpu-check.txt"
LIMIT="${OXALIGN_GPU_CHECK_TIMEOUT:-540}"
LOG="$(mktemp -d)"
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }

say "oxalign gpu-check $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ)"
if ! nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader >"$LOG/smi" 2>&1; then
  say "FAIL nvidia-smi: $(head -3 "$LOG/smi")"; exit 1
fi
say "GPUs:"; sed 's/^/  /' "$LOG/smi" | tee -a "$REPORT"
[ -n "${OXALIGN_TOOLCHAIN:-}" ] && export PATH="$OXALIGN_TOOLCHAIN/bin:$PATH"
if ! command -v cargo >/dev/null; then
  say "FAIL no cargo on PATH (set OXALIGN_TOOLCHAIN to a Rust toolchain folder)"; exit 1
fi
say "toolchain: $(rustc --version) / nvcc: $(nvcc --version 2>/dev/null | tail -1)"

# Unversioned links to the CUDA libraries, for the linker.
LIBS="$LOG/lib"; mkdir -p "$LIBS"
DIRS="$(python3 -c 'import glob,os,site; print(" ".join(sorted({os.path.dirname(p) for s in site.getsitepackages() for p in glob.glob(s+"/nvidia/**/lib*.so*", recursive=True)})))' 2>/dev/null)"
DIRS="$DIRS ${CUDA_HOME:-/usr/local/cuda}/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64"
for name in cuda nvrtc cublas cublasLt curand nccl; do
  hit=""
  for d in $DIRS; do
    hit="$(ls "$d/lib$name.so" "$d"/lib"$name".so.[0-9]* 2>/dev/null | head -1)"
    [ -n "$hit" ] && break
  done
  if [ -z "$hit" ]; then say "FAIL lib$name.so not found in: $DIRS"; exit 1; fi
  ln -sf "$hit" "$LIBS/lib$name.so"
  LD_DIRS="${LD_DIRS:-}:$(dirname "$hit")"
done
export LIBRARY_PATH="$LIBS:${LIBRARY_PATH:-}" LD_LIBRARY_PATH="${LD_DIRS#:}:${LD_LIBRARY_PATH:-}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}"

OFFLINE=(--offline)
if [ -d vendor ]; then
  OFFLINE+=(--config 'source.crates-io.replace-with="vendored"' --config 'source.vendored.directory="vendor"')
fi
TESTS=(-p oxalign-kernels --features cuda --test cuda_ops --test collective_nccl --lib)
say "build: cargo test ${TESTS[*]} --no-run"
if ! timeout "$((LIMIT - SECONDS))" cargo test "${OFFLINE[@]}" "${TESTS[@]}" --no-run >"$LOG/build" 2>&1; then
  say "FAIL build (last lines):"; tail -25 "$LOG/build" | tee -a "$REPORT"; exit 1
fi
say "tests (NCCL with 1 rank, and 2 when a second GPU opens):"
left=$((LIMIT - SECONDS)); [ "$left" -gt 10 ] || left=10
timeout "$left" cargo test "${OFFLINE[@]}" "${TESTS[@]}" -- --test-threads=1 >"$LOG/test" 2>&1
rc=$?
grep -E '^test |test result|skipping|panicked' "$LOG/test" | tee -a "$REPORT"
say "$([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc $rc)")"
exit $rc
