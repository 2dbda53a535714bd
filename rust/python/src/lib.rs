//! The pyo3 binding of xla_pcache_core, built by maturin as `xla_pcache._core`. Type
//! conversion, GIL release and error mapping only: every decision lives in the core.

mod buffer;
mod errors;
mod hashing;
mod logging;
mod store;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", xla_pcache_core::FORMAT_VERSION)?;
    errors::register(m)?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<store::PyBlob>()?;
    m.add_class::<store::PyClaim>()?;
    m.add_class::<hashing::PyHasher>()?;
    m.add_function(wrap_pyfunction!(hashing::hash_key, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::entry_name, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::entry_file_len, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::hash_impl, m)?)?;
    Ok(())
}
