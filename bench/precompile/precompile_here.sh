#!/usr/bin/env bash
# Step 2, on a CPU host with jax[tpu] (no TPU): the TPU's records compiled for the TPU's
# default settings (JAX's TPU VM flag, zlib: no zstandard there) into bench/precompile/store.
# Usage: bench/precompile/precompile_here.sh records.tgz  (TPY: a Python with jax[tpu])
set -euo pipefail
cd "$(dirname "$0")/../.."
TPY=${TPY:-$HOME/.cache/xla-pcache-venv-jax-tpu-0.10.2/bin/python}
export PYTHONPATH=$PWD/python
W=$(mktemp -d)
tar -C "$W" -xzf "$1"
rm -rf bench/precompile/store
"$TPY" bench/precompile/records_only.py "$W/records" bench/precompile/store
env -u LIBTPU_INIT_ARGS -u XLA_FLAGS -u JAX_FORCE_TPU_INIT JAX_PLATFORMS=cpu \
  "$TPY" -m xla_pcache precompile --topology v5e:1x1 --path bench/precompile/store \
  --libtpu-init-args '' --compression zlib
