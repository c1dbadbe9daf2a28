#!/usr/bin/env bash
# The one script for the GPU machine (see docs/guides/gpu-ops.md). In one call, well inside
# 8 minutes: build the C++ extension in place, run the GPU-marked tests, run the GPU benchmarks, write
# OUTDIR/gpu_report.json and print a short table last. Without CUDA every GPU step is skipped and says so.
#
#   benchmarks/gpu_check.sh OUTDIR
#
# Environment: PYTHON (default python3); GPU_CHECK_SKIP_BUILD=1 skips the build (the CPU test of this
# script uses it). Exit status: 0 when no step failed, 1 otherwise (every step runs either way).
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUTDIR=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}

# GPU benchmark scripts: each takes --json PATH and writes {"rows": [...]} or {"skipped": "why"}
# (bench_train_gpu.py writes its report under "training" instead of rows). A new kernel's benchmark adds
# its script here.
BENCH_SCRIPTS=(
    benchmarks/bench_ops_gpu.py
    benchmarks/bench_vision_gpu.py
    benchmarks/bench_train_gpu.py
)
# step time limits in seconds; even if every step ran to its limit the total stays within 8 minutes
# (build + tests + the two kernel benchmarks + training = 90 + 150 + 2 * 90 + 60 = 480 s)
BUILD_LIMIT=90
TEST_LIMIT=150
BENCH_LIMIT=90
TRAIN_LIMIT=60
limit_of() { case $1 in *bench_train_gpu.py) echo "$TRAIN_LIMIT" ;; *) echo "$BENCH_LIMIT" ;; esac; }

# real kernels on the GPU: the Triton interpreter is only for CPU-only CI
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1
STEPS="$OUTDIR/steps.tsv"
: > "$STEPS"

# record NAME STATUS SECONDS DETAIL
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$STEPS"; echo "[gpu_check] $1: $2 ($3 s) $4"; }

has_cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
if [ "$has_cuda" != 1 ]; then
    echo "[gpu_check] no CUDA device: the GPU tests and benchmarks are skipped"
fi
command -v nvidia-smi > /dev/null && nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1

# 1. the C++ extension, in place, with this python, no build isolation, no downloads
if [ "${GPU_CHECK_SKIP_BUILD:-0}" = 1 ]; then
    record build skipped 0 "GPU_CHECK_SKIP_BUILD=1"
else
    start=$SECONDS
    if timeout "$BUILD_LIMIT" "$PY" setup.py build_ext --inplace > "$OUTDIR/build.log" 2>&1 \
        && "$PY" -c 'import omnibal_kernels._C' >> "$OUTDIR/build.log" 2>&1; then
        record build ok $((SECONDS - start)) "build.log"
    else
        record build failed $((SECONDS - start)) "see build.log: $(tail -n 1 "$OUTDIR/build.log" | cut -c1-200)"
    fi
fi

# 2. the GPU-marked tests
if [ "$has_cuda" = 1 ]; then
    start=$SECONDS
    timeout "$TEST_LIMIT" "$PY" -m pytest -m gpu -q -p no:cacheprovider \
        --junitxml="$OUTDIR/pytest_gpu.xml" > "$OUTDIR/pytest_gpu.log" 2>&1
    rc=$?
    case $rc in
        0) status=passed ;;
        5) status=none ;;  # no test collected
        124) status=timeout ;;
        *) status=failed ;;
    esac
    record gpu_tests "$status" $((SECONDS - start)) "rc=$rc, $(tail -n 1 "$OUTDIR/pytest_gpu.log" | cut -c1-200)"
else
    record gpu_tests skipped 0 "no CUDA device"
fi

# 3. the GPU benchmarks (each script skips itself without CUDA)
for script in "${BENCH_SCRIPTS[@]}"; do
    name=$(basename "$script" .py)
    start=$SECONDS
    if timeout "$(limit_of "$script")" "$PY" "$script" --json "$OUTDIR/$name.json" > "$OUTDIR/$name.log" 2>&1; then
        status=ok
        [ "$has_cuda" = 1 ] || status=skipped
    else
        status=failed
    fi
    record "$name" "$status" $((SECONDS - start)) "$name.json"
done

# 4. the report and the table, last
"$PY" benchmarks/gpu_report.py "$OUTDIR" "${BENCH_SCRIPTS[@]}"
