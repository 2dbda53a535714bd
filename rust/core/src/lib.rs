//! xla_pcache_core: a persistent, bounded, multi-process and NFS-safe store of compiled XLA
//! executables. No Python here: the pyo3 binding lives in its own crate.
//!
//! Dependencies point one way: `store` uses `entry`, `publish`, `index` (which uses
//! `journal`, `snapshot`, `overlay` and `lru`), `lock`, `fsinfo`, `layout`; those use only `hash`, `clock`, `error`.

pub mod blob;
pub mod clock;
pub mod dir;
pub mod entry;
pub mod error;
pub mod forksafe;
pub mod fsinfo;
#[cfg(test)]
mod fuzz_tests;
pub mod hash;
pub mod index;
pub mod journal;
pub mod layout;
pub mod lock;
pub mod lru;
pub mod overlay;
pub mod publish;
pub mod snapshot;
pub mod stats;
pub mod store;

pub use blob::Blob;
pub use error::StoreError;
pub use hash::{hash_parts, KeyHasher};
pub use layout::FORMAT_VERSION;
pub use lock::LockMode;
pub use store::{
    Claim, ClaimOutcome, ClaimState, EvictReport, Key, ReadMode, Stats, Store, StoreOptions,
    VerifyReport,
};
