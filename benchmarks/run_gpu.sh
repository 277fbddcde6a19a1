#!/usr/bin/env bash
# The device run of the GPU benchmarks (see benchmarks/RESULTS.md, "On a GPU").
#   bash benchmarks/run_gpu.sh OUTDIR [float32-budget-s] [float64-budget-s]
# Installs the peers carried as wheels in .whl/ (dynamax and its needs) when present.
set -u
out=${1:?output folder}; b32=${2:-200}; b64=${3:-80}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import jax, numpyro, optax, statseq; print(jax.__version__, jax.devices(), numpyro.__version__, optax.__version__)" 2>&1 | tee -a "$out/gpu.txt"
python3 benchmarks/bench_gpu.py --out "$out" --budget-s "$b32" 2>&1 | tail -n 80
python3 benchmarks/bench_gpu.py --out "$out" --precision float64 --max-t 1e5 --budget-s "$b64" 2>&1 | tail -n 40
