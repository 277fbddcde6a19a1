#!/usr/bin/env bash
# The device run of the backbone benchmark (issue 15, point 6; benchmarks/RESULTS.md,
# "Modern backbones: training step by mode and length"). Never run by CI.
#   bash benchmarks/run_gpu_backbones.sh OUTDIR              # on an H100: about 9 minutes at most
#   BB_QUICK=1 bash benchmarks/run_gpu_backbones.sh OUTDIR   # tiny grid, to test the script on a CPU
#   bash benchmarks/run_gpu_backbones.sh OUTDIR --backbones s4d,s5   # extra arguments: passed on
# What it runs: benchmarks/bench_backbones.py over every backbone installed in statseq (and
# the causal softmax attention reference) and every evaluation mode, a training step
# (value and gradient of -mean log p, batch 32, Gaussian head, d = 64, 2 layers, float32) at
# T = 10^2, 10^3, 10^4, 10^5; a program XLA estimates above 40 GiB is compiled but not run,
# a case extrapolated (from the shorter lengths) above 10 s per step is not compiled, a
# warm-up call over 2 s is the one timing, a case whose XLA estimate extrapolated from a
# shorter length exceeds 160 GiB (4x the cap) is not even compiled (XLA:GPU autotunes on
# real buffers while compiling), and no new case starts after 420 s (so the
# 10^5 column may be partly skipped: the rows say so). Records nvidia-smi (GPU, driver,
# memory) before and after, jax's devices, the JSON of rows and the Markdown table, in
# OUTDIR (results.tgz and the .md), refreshed after every length in case the run is cut off.
set -u
out=${1:?output folder}; shift  # further arguments go to bench_backbones.py
mkdir -p "$out"
work=/tmp/gpu_backbones_results; rm -rf "$work"; mkdir -p "$work"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
export STATSEQ_NO_COMPILATION_CACHE=1  # honest compile times
py=${PYTHON:-python3}
if [ "${BB_QUICK:-0}" = 1 ]; then  # CPU-sized: every path of the script, in minutes
  ARGS="--lengths 16,32,64 --batch 2 --hidden 8 --mem-cap-gb 0.0005 --max-step-s 0.05 \
        --max-call-s 0.02 --min-time-s 0.05 --budget-s 400"; LIMIT=500
else
  ARGS="--lengths 100,1000,10000,100000 --batch 32 --hidden 64 --layers 2 --mem-cap-gb 40 \
        --max-step-s 10 --max-call-s 2 --min-time-s 0.5 --budget-s 420"; LIMIT=530
fi
smi() { nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm \
          --format=csv 2>&1 || echo "no nvidia-smi"; }
{ echo "== before ($(date -u +%H:%M:%S))"; smi
  timeout 60 $py -c "import jax, statseq; print(jax.__version__, jax.devices(), statseq.__file__)" 2>&1
  echo "cores: $(nproc)"; } > "$work/gpu.txt"
echo "== backbones ($(date -u +%H:%M:%S))"
# shellcheck disable=SC2086
timeout "$LIMIT" $py benchmarks/bench_backbones.py $ARGS "$@" --out "$work/backbones_gpu.json" \
  > "$work/backbones.out" 2> "$work/backbones.err"
echo "rc=$?" | tee -a "$work/backbones.out"
{ echo "== after ($(date -u +%H:%M:%S))"; smi; } >> "$work/gpu.txt"
tail -n 3 "$work/backbones.err"
tar czf "$out/results.tgz" -C "$work" .
cp "$work"/*.md "$work/gpu.txt" "$out"/ 2>/dev/null || true
ls "$out"
