//! The core's bounds (`bounds.rs` there) for Python's own checks of what it parses (the
//! environment, the command's options, a bucket's budget object), so that each rule is
//! written once, in the core; `ValueError` naming the value otherwise.

use crate::errors::to_py;
use pyo3::prelude::*;

/// `value` as a byte size (a budget): at least one byte.
#[pyfunction]
pub fn check_size(name: &str, value: i128) -> PyResult<u64> {
    xla_pcache_core::positive_size(name, value).map_err(to_py)
}

/// `seconds` as a max age: from 1 second (CONFIG holds whole seconds) to `MAX_DURATION_S`.
#[pyfunction]
pub fn check_max_age(name: &str, seconds: f64) -> PyResult<f64> {
    xla_pcache_core::max_age_secs(name, seconds)
        .map(|a| a.as_secs_f64())
        .map_err(to_py)
}
