//! `own_directory`: the core's rule for a directory of this user's own, for the host-local
//! directories the package keeps.

use crate::errors::CacheError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// Makes `path` (mode 0700, missing parents too) unless it exists, and checks that it is a
/// directory of this user's own: not a link, owned by the effective user, writable by no
/// one else. `CacheError` naming it and why otherwise.
#[pyfunction]
pub fn own_directory(py: Python<'_>, path: PathBuf) -> PyResult<()> {
    py.detach(|| xla_pcache_core::make_own_dir(&path))
        .map(drop)
        .map_err(CacheError::new_err)
}
