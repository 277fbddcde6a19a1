#!/usr/bin/env bash
# The device run of the GPU benchmarks (see benchmarks/RESULTS.md, "On a GPU").
#   bash benchmarks/run_gpu.sh OUTDIR
# Installs the peers carried as wheels in .whl/ (dynamax and its needs) when present.
# Each step has its own time limit, so one that hangs or crashes leaves the others' results;
# everything ends up in OUTDIR/results.tgz (the device tool returns at most 8 files).
set -u
out=${1:?output folder}
work=/tmp/gpu_results; rm -rf "$work"; mkdir -p "$work"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$work/gpu.txt" 2>&1
python3 -c "import jax, numpyro, optax, statseq; print(jax.__version__, jax.devices(), numpyro.__version__, optax.__version__)" >> "$work/gpu.txt" 2>&1
step() {  # step NAME SECONDS COMMAND...: run with a limit, keep its output
  local name=$1 limit=$2; shift 2
  echo "== $name"; timeout "$limit" "$@" > "$work/$name.out" 2>&1; echo "rc=$?" >> "$work/$name.out"
  tail -n 3 "$work/$name.out"
}
step f32 130 python3 benchmarks/bench_gpu.py --out "$work" --lengths 1e4,1e6,1e3 --budget-s 90 --max-call-s 2
step scan 50 python3 benchmarks/bench_gpu.py --out "$work" --tag _scan --families scan --lengths 1e5,1e6 --budget-s 30
for fam in kalman hmm; do
  step "f64_$fam" 35 python3 benchmarks/bench_gpu.py --out "$work" --precision float64 --tag "_$fam" --families $fam --lengths 1e4 --budget-s 22 --max-call-s 2
done
if [ -f benchmarks/bench_deer.py ]; then
  step deer 130 python3 benchmarks/bench_deer.py --cells gru,lstm --hidden 16,64 --lengths 10000,100000 --batch 1,16 --methods sequential,deer,quasi-deer --budget-s 95 --out "$work/deer.json"
  step elk 40 python3 benchmarks/bench_deer.py --cells gru --hidden 16 --lengths 10000 --batch 1 --methods sequential,elk,quasi-elk --budget-s 15 --out "$work/elk.json"
fi
tar czf "$out/results.tgz" -C "$work" .
cp "$work"/*.md "$out"/ 2>/dev/null | true
ls "$out"
