//! The core's `hash` module (rust/core/src/hash.rs and hash/long.rs) compiled on its own,
//! with its tests. `scripts/test_hash_paths.sh` builds it once per vector path of twox-hash
//! forced through `RUSTFLAGS`, which rebuilds every crate of a build: here that is this
//! module and its two hash crates, not the whole core and its dependencies.
#![allow(dead_code)]

#[path = "../../core/src/hash.rs"]
pub mod hash;
