#!/usr/bin/env bash
# The device run of the DEER benchmark at scale (issue 14, point 6; benchmarks/RESULTS.md,
# "DEER on a GPU" and "DEER at scale").
#   bash benchmarks/run_gpu_deer.sh OUTDIR              # on an H100: about 6 minutes at most
#   DEER_QUICK=1 bash benchmarks/run_gpu_deer.sh OUTDIR # tiny grid, to test the script on a CPU
# Steps, each under its own `timeout` (a hang or crash leaves the others' results):
#   deer   GRU and LSTM, H = 16, 64, 256, T = 10^4, 10^5, 10^6, 10^3 in that order (every H at
#          one length before the next), batch 1, sequential vs deer vs quasi-deer, forward and
#          value+grad; dense DEER cases whose memory estimate exceeds 40 GiB are skipped with
#          the estimate recorded; a sequential call over 1 s is timed once; a sequential
#          program extrapolated (linearly in T, from a shorter T of the run) to more than
#          5 s is not run, and the extrapolation is recorded (marked) instead.
#   model  the model-level training step: value and gradient of ss.GRU / ss.LSTM's
#          log-likelihood (the compiled filter fit_sgd differentiates) under each
#          evaluation=, H = 16, 64, T = 10^4, 10^5.
#   elk    ELK and quasi-ELK against the sequential scan at a few points (H = 16, 64,
#          T = 10^4).
#   probe  first: GRU, H = 16, T = 10^3 compiled in 6 threads; if it fails or hangs (40 s),
#          the steps above compile serially (fewer cases fit in the time).
# The programs of one case compile in 6 threads at once (the host has 16 cores).
# Worst case (every step to its limit) about 6 minutes. Everything ends up in
# OUTDIR/results.tgz (JSON, logs), plus the Markdown tables in OUTDIR, both refreshed after
# every step in case the run is cut off.
set -u
out=${1:?output folder}
mkdir -p "$out"
work=/tmp/gpu_deer_results; rm -rf "$work"; mkdir -p "$work"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
export STATSEQ_NO_COMPILATION_CACHE=1  # honest compile times (steps share shapes)
py=${PYTHON:-python3}
if [ "${DEER_QUICK:-0}" = 1 ]; then  # CPU-sized: every path of the script, in minutes
  H="4"; HM="4"; T="100,300"; TM="100"; HE="4"; TE="100"
  LIM="--mem-limit-gb 0.00025 --max-call-s 0.005 --extrapolate-s 0.002"
  B1=100; B2=10; B3=10; S0=300; S1=900; S2=600; S3=400; THREADS=2; HP=4; TP=100
else
  H="16,64,256"; HM="16,64"; T="10000,100000,1000000,1000"; TM="10000,100000"
  HE="16,64"; TE="10000"
  LIM="--mem-limit-gb 40 --max-call-s 1 --extrapolate-s 5"
  B1=135; B2=45; B3=15; S0=40; S1=175; S2=75; S3=40; THREADS=6; HP=16; TP=1000
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  timeout 30 $py -c "import jax, statseq; print(jax.__version__, jax.devices(), statseq.__file__)" 2>&1
  nproc; } > "$work/gpu.txt"
step() {  # step NAME SECONDS COMMAND...: run with a limit, keep its output
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" > "$work/$name.out" 2> "$work/$name.err"; echo "rc=$?" >> "$work/$name.out"
  tail -n 2 "$work/$name.out"; tail -n 3 "$work/$name.err"
  tar czf "$out/results.tgz" -C "$work" .; cp "$work"/*.md "$out"/ 2>/dev/null  # if cut off
  grep -q "^rc=0" "$work/$name.out"
}
# probe: the T = 10^3 GRU case, compiled in $THREADS threads; if that fails or hangs
# (parallel XLA:GPU compiles autotune on the one device), the other steps compile serially
if ! step probe "$S0" $py benchmarks/bench_deer.py --cells gru --hidden "$HP" --lengths "$TP" \
    --methods sequential,deer,quasi-deer --batch 1 --min-time-s 0.1 --compile-threads "$THREADS" \
    $LIM --out "$work/probe.json"; then
  echo "probe failed: compiling serially"; THREADS=1
fi
common="--batch 1 --min-time-s 0.1 --compile-threads $THREADS $LIM"
step deer "$S1" $py benchmarks/bench_deer.py --cells gru,lstm --hidden "$H" --lengths "$T" \
  --methods sequential,deer,quasi-deer $common --budget-s "$B1" --out "$work/deer.json"
step model "$S2" $py benchmarks/bench_deer.py --model --cells gru,lstm --hidden "$HM" \
  --lengths "$TM" --methods sequential,deer,quasi-deer $common --budget-s "$B2" \
  --out "$work/model.json"
step elk "$S3" $py benchmarks/bench_deer.py --cells gru,lstm --hidden "$HE" --lengths "$TE" \
  --methods sequential,elk,quasi-elk $common --budget-s "$B3" --out "$work/elk.json"
tar czf "$out/results.tgz" -C "$work" .
cp "$work"/*.md "$out"/ 2>/dev/null || true
ls "$out"
