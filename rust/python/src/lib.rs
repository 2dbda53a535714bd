//! The pyo3 binding of xla_pcache_core, built by maturin as `xla_pcache._core`: type
//! conversion, GIL release and error mapping. Every rule about the cache lives in the core:
//! its files and entries, trust and keys, the budget, the bounds of sizes, durations and
//! ages (`bounds.rs` there: the binding hands Python's numbers to it as they are), tier
//! names and counters. The binding checks only what a conversion needs (an argument's
//! type, a path with no NUL byte and not empty, a compile time in seconds turned into
//! milliseconds: `convert.rs`, `store.rs`), and decides how the core meets Python: a get or
//! put that fails for cache reasons is a miss or a skipped write, logged, and no panic gets
//! out (`errors.rs`); a walk (`verify`, `evict`) runs on a thread of its own so that Ctrl-C
//! stops it (`walk.rs`); the remote tiers are Python objects it calls back after a local
//! miss or a publish (`chain.rs`), and the core's verdict on what they hold reaches them
//! as a `Refusal` (`verdict.rs`); a report shows the remote counters only once a tier
//! counted (`convert.rs`).

mod blob;
mod bounds;
mod buffer;
mod builds;
mod chain;
mod claim;
mod convert;
mod errors;
mod hashing;
mod logging;
mod options;
mod owndir;
mod signing;
mod store;
mod testhook;
mod verdict;
mod walk;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", xla_pcache_core::FORMAT_VERSION)?;
    // The core's bounds and defaults, for Python to read rather than restate.
    m.add(
        "MAX_DURATION_S",
        xla_pcache_core::MAX_DURATION.as_secs_f64(),
    )?;
    m.add("MAX_SIZE", xla_pcache_core::MAX_SIZE)?;
    // No object smaller than this holds an entry file (a fixed header and a key of a byte).
    m.add("ENTRY_MIN_BYTES", xla_pcache_core::ENTRY_MIN_BYTES)?;
    m.add("STORE_DEFAULTS", convert::store_defaults(m.py())?)?;
    m.add(
        "TIER_COUNTERS",
        xla_pcache_core::TIER_COUNTER_NAMES.to_vec(),
    )?;
    // The test hooks' variable, and whether this build honours it (a test build only).
    m.add("TEST_HOOKS_VAR", xla_pcache_core::TEST_HOOKS_VAR)?;
    m.add("TEST_HOOKS", xla_pcache_core::TEST_HOOKS)?;
    m.add(
        "PREFETCH_COUNTERS",
        xla_pcache_core::PREFETCH_COUNTER_NAMES.to_vec(),
    )?;
    errors::register(m)?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<blob::PyBlob>()?;
    m.add_class::<claim::PyClaim>()?;
    m.add_class::<hashing::PyHasher>()?;
    m.add_class::<chain::PyAccept>()?;
    m.add_class::<verdict::PyRefusal>()?;
    m.add_class::<owndir::PyOwnDir>()?;
    m.add_function(wrap_pyfunction!(hashing::hash_key, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::entry_name, m)?)?;
    m.add_function(wrap_pyfunction!(verdict::entry_head_check, m)?)?;
    m.add_function(wrap_pyfunction!(verdict::entry_head_key, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::signed_entry_name, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::hash_impl, m)?)?;
    m.add_function(wrap_pyfunction!(builds::identify_binaries, m)?)?;
    m.add_function(wrap_pyfunction!(signing::generate_signing_key, m)?)?;
    m.add_function(wrap_pyfunction!(signing::signing_public_key, m)?)?;
    m.add_function(wrap_pyfunction!(signing::check_key_name, m)?)?;
    m.add_function(wrap_pyfunction!(signing::check_signing_key, m)?)?;
    m.add_function(wrap_pyfunction!(signing::check_trusted_keys, m)?)?;
    m.add_function(wrap_pyfunction!(bounds::check_size, m)?)?;
    m.add_function(wrap_pyfunction!(bounds::check_max_age, m)?)?;
    m.add_function(wrap_pyfunction!(owndir::own_directory, m)?)?;
    m.add_function(wrap_pyfunction!(testhook::test_hook_reached, m)?)?;
    m.add_function(wrap_pyfunction!(testhook::test_hook_released, m)?)?;
    Ok(())
}
