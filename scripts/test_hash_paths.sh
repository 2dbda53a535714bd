#!/usr/bin/env bash
# Runs the hash tests once per vector path of twox-hash that this CPU can execute, each
# forced at build time (twox-hash picks at run time, so a plain `cargo test` covers only the
# best path of the machine). Each path builds into its own target dir, and only the hash
# module with its two hash crates (the crate rust/hash-paths), not the whole core: a forced
# path is a RUSTFLAGS change, which rebuilds every crate of the build. Every run also tests
# the project's own AVX-512 loop (hash/long.rs) where the CPU has AVX-512F, and its shared
# block and streaming code with a scalar kernel everywhere; XLA_PCACHE_EXPECT_AVX512 makes
# the tests fail if the AVX-512 path is not the one in use on such a CPU.
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
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export XLA_PCACHE_EXPECT_AVX512=1
  echo "-- AVX-512F present: the avx512 path is tested in every run below"
fi
for p in "${paths[@]}"; do
  echo "-- hash path $p"
  RUSTFLAGS="--cfg _internal_xxhash3_force_$p" CARGO_TARGET_DIR="target/hash-$p" \
    cargo test -q -p xla_pcache_hash_paths --lib hash::
done
