#!/usr/bin/env bash
# Step 1, on the TPU: the LM once with other flags than the TPU's default (the latency-hiding
# scheduler off), writing records; the records alone come back as $OUT/records.tgz.
# A flag that changes the TPU's topology fingerprint on the TPU (seen: the launch barrier set
# to false) gives records no compile-only client can verify: precompile refuses them.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
W=$(mktemp -d)
LIBTPU_INIT_ARGS="${REC_FLAGS:---xla_tpu_use_enhanced_launch_barrier=true --xla_tpu_enable_latency_hiding_scheduler=false}" \
  XLA_PERSISTENT_CACHE_PATH=$W/made python3 bench/precompile/lm.py record-run | tee "$OUT/record-run.json"
python3 bench/precompile/records_only.py "$W/made" "$W/records"
python3 -c 'import importlib.util as u, jax, importlib.metadata as m; print("jax", jax.__version__, "libtpu", m.version("libtpu"), "zstandard", u.find_spec("zstandard") is not None)' | tee "$OUT/versions.txt"
tar -C "$W" -czf "$OUT/records.tgz" records
