//! Every mapping from core errors (and panics) to Python exceptions.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use xla_pcache_core::StoreError;

create_exception!(
    xla_pcache,
    CacheError,
    PyException,
    "Base class of every error the cache raises on purpose."
);
create_exception!(
    xla_pcache,
    FormatError,
    CacheError,
    "The directory holds a cache of an unknown or newer on-disk format."
);
create_exception!(
    xla_pcache,
    ReadOnlyError,
    CacheError,
    "A mutating operation was asked of a store opened read-only."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CacheError", py.get_type::<CacheError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("ReadOnlyError", py.get_type::<ReadOnlyError>())?;
    Ok(())
}

pub fn to_py(e: StoreError) -> PyErr {
    match e {
        StoreError::Invalid(msg) => PyValueError::new_err(msg),
        StoreError::Format(msg) => FormatError::new_err(msg),
        e @ StoreError::ReadOnly(_) => ReadOnlyError::new_err(e.to_string()),
        e => CacheError::new_err(e.to_string()),
    }
}

/// A call that failed for cache reasons (a `CacheError`: the directory or what is in it,
/// never the caller's arguments) as `instead`, a miss or a skipped write, so that the
/// cache never breaks the caller's program; logged with `became` (what the failure
/// became) when given. Any other error (a bad argument) is raised.
pub fn on_cache_error<T>(
    py: Python<'_>,
    res: PyResult<T>,
    instead: T,
    became: Option<&str>,
) -> PyResult<T> {
    match res {
        Err(e) if e.is_instance_of::<CacheError>(py) => {
            if let Some(became) = became {
                log::error!("xla_pcache: {e}; {became}");
            }
            Ok(instead)
        }
        other => other,
    }
}

/// Runs core code so that a panic never unwinds into Python: it becomes a `CacheError`.
pub fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T, StoreError>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(to_py),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(CacheError::new_err(format!(
                "internal error in {what}: {msg}"
            )))
        }
    }
}
