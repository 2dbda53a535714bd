//! The pyo3 binding of xla_pcache_core, built by maturin as `xla_pcache._core`. Type
//! conversion, GIL release and error mapping only: every decision lives in the core.

mod blob;
mod buffer;
mod claim;
mod convert;
mod errors;
mod hashing;
mod logging;
mod signing;
mod store;
mod tier;

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
    m.add("STORE_DEFAULTS", convert::store_defaults(m.py())?)?;
    m.add(
        "TIER_COUNTERS",
        xla_pcache_core::TIER_COUNTER_NAMES.to_vec(),
    )?;
    m.add(
        "PREFETCH_COUNTERS",
        xla_pcache_core::PREFETCH_COUNTER_NAMES.to_vec(),
    )?;
    errors::register(m)?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<blob::PyBlob>()?;
    m.add_class::<claim::PyClaim>()?;
    m.add_class::<hashing::PyHasher>()?;
    m.add_class::<tier::PyAccept>()?;
    m.add_function(wrap_pyfunction!(hashing::hash_key, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::entry_name, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::entry_file_len, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::signed_entry_name, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::hash_impl, m)?)?;
    m.add_function(wrap_pyfunction!(signing::generate_signing_key, m)?)?;
    m.add_function(wrap_pyfunction!(signing::signing_public_key, m)?)?;
    m.add_function(wrap_pyfunction!(signing::check_key_name, m)?)?;
    Ok(())
}
