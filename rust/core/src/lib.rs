//! xla_pcache_core: a persistent, bounded, multi-process and NFS-safe store of compiled XLA
//! executables. No Python here: the pyo3 binding lives in its own crate.
//!
//! The modules are private to the crate; what the binding and the integration tests use is
//! re-exported below. They form three levels (ARCHITECTURE.md, "Layering"; checked by
//! `layering_tests.rs`): `store` (with admission and claims); then `view`, `entries`,
//! `journal`, `snapshot`, `entry`, `sign`, `blob`, `lock`; then `dir`, `layout`,
//! `stored_budget`, `bounds`, `publish`, `fsinfo`, `lru`, `stats`, `forksafe`, `hash`,
//! `clock`, `error`, `owndir`, `record_place`, `testhook`, `verified`, `build_id`. A module
//! uses only its own level and those below, and no modules use each other in a circle.

pub(crate) mod blob;
pub(crate) mod bounds;
pub(crate) mod build_id;
pub(crate) mod clock;
pub(crate) mod dir;
#[cfg(test)]
mod dirstate_fuzz_tests;
pub(crate) mod entries;
pub(crate) mod entry;
pub(crate) mod error;
pub(crate) mod forksafe;
pub(crate) mod fsinfo;
#[cfg(test)]
mod fuzz_tests;
pub(crate) mod hash;
pub(crate) mod journal;
#[cfg(test)]
mod layering_tests;
pub(crate) mod layout;
pub(crate) mod lock;
pub(crate) mod lru;
pub(crate) mod owndir;
pub(crate) mod publish;
pub(crate) mod record_place;
pub(crate) mod sign;
pub(crate) mod snapshot;
pub(crate) mod stats;
pub(crate) mod store;
pub(crate) mod stored_budget;
pub(crate) mod testhook;
pub(crate) mod verified;
pub(crate) mod view;

pub use blob::Blob;
pub use bounds::{
    check_duration, check_max_age, duration_secs, max_age_secs, positive_size, MAX_DURATION,
    MAX_SIZE, MIN_MAX_AGE,
};
pub use build_id::{
    default_place as default_build_record_place, mapped_objects, BuildIdRecord, FileId, IdKind,
    Loaded, Mapped, RecordUse,
};
pub use entry::ENTRY_MIN_BYTES;
pub use error::StoreError;
pub use fsinfo::FsInfo;
pub use hash::{active as active_hash_impl, entry_name, hash_parts, name_hex, HashImpl, KeyHasher};
pub use layout::FORMAT_VERSION;
pub use lock::{LeaseView, LockDir, LockError, LockGuard, LockMode, LockOptions};
pub use owndir::{open_own_fd, Found as OwnFound, Opened as OwnOpened, Rule as OwnRule};
pub use record_place::Place as RecordPlace;
pub use sign::{
    check_key_name, digest as blake3_digest, generate_seed, public_key, signed_name, SigFields,
    Signer, TrustSet, Untrusted,
};
pub use stats::{
    valid_tier_name, Counter, Counters, TierCounters, COUNTER_NAMES, MAX_TIERS, MAX_TIER_NAME,
    PREFETCH_COUNTER_NAMES, TIER_COUNTER_NAMES,
};
pub use store::{
    head_key, judge_head, tier_names, Claim, ClaimOutcome, ClaimState, EntrySummary, EvictReport,
    Key, Published, ReadMode, Refusal, Stats, Store, StoreOptions, VerifyReport,
};
pub use stored_budget::StoredBudget;
pub use testhook::{
    reached as test_hook_reached, released as test_hook_released, COMPILED as TEST_HOOKS,
    VAR as TEST_HOOKS_VAR,
};
pub use verified::{default_place as default_verification_record_place, VerificationRecord};
