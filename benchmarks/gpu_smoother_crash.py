"""Which HMM smoother crashes XLA:GPU's compiler (triton_tiling_propagation check failure,
seen with jax 0.11.2 on an H100), and does disabling Triton GEMM fusion avoid it?

    python benchmarks/gpu_smoother_crash.py OUTFILE

Each case runs in its own process (the failure aborts the process).
"""
import os
import subprocess
import sys

CHILD = r'''
import sys, jax
impl, k, t, dt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_enable_x64", dt == "float64")
sys.path.insert(0, "benchmarks")
import bench_gpu as b
import jax.numpy as jnp
args = b.hmm_inputs(k, t, jnp.float64 if dt == "float64" else jnp.float32)
impls, pick = b.hmm_impls("smoother")
jax.block_until_ready(impls[impl](*args))
print("ok")
'''

cases = [("statseq sequential", 16, 10000, "float32"), ("statseq parallel", 16, 10000, "float32"),
         ("dynamax sequential", 16, 10000, "float32"), ("dynamax parallel", 16, 10000, "float32"),
         ("statseq sequential", 2, 10000, "float64"), ("statseq parallel", 2, 10000, "float64")]
lines = []
for flags in ("", "--xla_gpu_enable_triton_gemm=false"):
    for impl, k, t, dt in cases:
        env = dict(os.environ, XLA_FLAGS=flags)
        try:
            r = subprocess.run([sys.executable, "-c", CHILD, impl, str(k), str(t), dt], env=env,
                               capture_output=True, text=True, timeout=40)
            rc = r.returncode
            why = next((ln for ln in r.stderr.splitlines() if "Check failed" in ln), "")[:160]
        except subprocess.TimeoutExpired:
            rc, why = "timeout", ""
        line = f"flags={flags or '(none)'} | {impl} K={k} T={t} {dt} | rc={rc} {why}"
        print(line, flush=True)
        lines.append(line)
        if flags and rc == 0 and impl.startswith("dynamax"):
            pass
with open(sys.argv[1], "w") as fh:
    fh.write("\n".join(lines) + "\n")
