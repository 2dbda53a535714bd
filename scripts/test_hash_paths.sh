#!/usr/bin/env bash
# Runs the hash tests once per vector path of twox-hash that this CPU can execute, each
# forced at build time (twox-hash picks at run time, so a plain `cargo test` covers only the
# best path of the machine). Each path builds into its own target dir.
set -euo pipefail
cd "$(dirname "$0")/.."

paths=(scalar)
case "$(uname -m)" in
  x86_64)
    paths+=(sse2)
    grep -qw avx2 /proc/cpuinfo && paths+=(avx2)
    ;;
  aarch64) paths+=(neon) ;;
esac
for p in "${paths[@]}"; do
  echo "-- hash path $p"
  RUSTFLAGS="--cfg _internal_xxhash3_force_$p" CARGO_TARGET_DIR="target/hash-$p" \
    cargo test -q -p xla_pcache_core --lib hash::
done
