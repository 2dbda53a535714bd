#!/usr/bin/env bash
# Step 3, on the TPU with its default settings: cold (empty store), the precompiled store
# (every program a hit), warm (the cold run's store again); fresh processes; $OUT/table.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
unset LIBTPU_INIT_ARGS XLA_FLAGS
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
W=$(mktemp -d)
cp -r bench/precompile/store "$W/pre"
R=$OUT/runs.jsonl
XLA_PERSISTENT_CACHE_PATH=$W/cold python3 bench/precompile/lm.py cold | tee -a "$R"
XLA_PERSISTENT_CACHE_PATH=$W/pre python3 bench/precompile/lm.py precompiled | tee -a "$R"
XLA_PERSISTENT_CACHE_PATH=$W/cold python3 bench/precompile/lm.py warm | tee -a "$R"
python3 bench/precompile/table.py "$R" | tee "$OUT/table.md"
