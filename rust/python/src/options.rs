//! A `Store`'s arguments from Python turned into the core's `StoreOptions`: each checked
//! for what its conversion needs and named when refused; the bounds are the core's.

use crate::convert::{choice, path_arg, positive_size, seconds};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use xla_pcache_core::{LockMode, ReadMode, StoreOptions};

/// The arguments of `Store(...)` as pyo3 extracted them.
pub struct Args<'a, 'py> {
    pub path: &'a Bound<'py, PyAny>,
    pub max_size: Option<i128>,
    pub read_only: bool,
    pub durable: bool,
    pub lock_mode: Option<String>,
    pub lock_timeout: Option<f64>,
    pub lease_time: Option<f64>,
    pub hit_interval: Option<f64>,
    pub trash_grace: Option<f64>,
    pub tmp_grace: Option<f64>,
    pub claim_lease: Option<f64>,
    pub read_mode: Option<String>,
    pub evict_trace: Option<&'a Bound<'py, PyAny>>,
    pub signing_key: Option<(String, Vec<u8>)>,
    pub trusted_keys: Option<Vec<(String, Vec<u8>)>>,
    pub own_root_fd: Option<i32>,
}

/// The cache's path and the core's options for `a`: a duration left None is the core's
/// default (`StoreOptions::default()`, written once).
pub fn store_options(a: Args<'_, '_>) -> PyResult<(PathBuf, StoreOptions)> {
    let path = path_arg("path", a.path)?;
    let evict_trace = match a.evict_trace {
        Some(v) if !v.is_none() => Some(path_arg("evict_trace", v)?),
        _ => None,
    };
    let max_size = positive_size("max_size", a.max_size)?;
    let lock_mode = choice::<LockMode>("lock_mode", a.lock_mode)?.unwrap_or(LockMode::Auto);
    let read_mode = choice::<ReadMode>("read_mode", a.read_mode)?.unwrap_or(ReadMode::Auto);
    if path.as_os_str().is_empty() {
        return Err(PyValueError::new_err("path must not be empty"));
    }
    let d = StoreOptions::default();
    let or_default = |name: &str, v: Option<f64>, default: Duration| match v {
        Some(v) => seconds(name, v),
        None => Ok(default),
    };
    let opts = StoreOptions {
        max_size,
        read_only: a.read_only,
        durable: a.durable,
        lock_mode,
        lock_timeout: or_default("lock_timeout", a.lock_timeout, d.lock_timeout)?,
        lease_time: or_default("lease_time", a.lease_time, d.lease_time)?,
        hit_interval: or_default("hit_interval", a.hit_interval, d.hit_interval)?,
        trash_grace: or_default("trash_grace", a.trash_grace, d.trash_grace)?,
        tmp_grace: or_default("tmp_grace", a.tmp_grace, d.tmp_grace)?,
        claim_lease: or_default("claim_lease", a.claim_lease, d.claim_lease)?,
        read_mode,
        evict_trace,
        signer: crate::signing::signer(a.signing_key)?,
        trust: crate::signing::trust(a.trusted_keys)?,
        own_root: own_root(a.own_root_fd)?,
        ..d
    };
    Ok((path, opts))
}

/// The store's `own_root`: a duplicate of the caller's descriptor (which stays the caller's).
fn own_root(fd: Option<i32>) -> PyResult<Option<Arc<std::os::fd::OwnedFd>>> {
    let Some(raw) = fd else {
        return Ok(None);
    };
    if raw < 0 {
        return Err(PyValueError::new_err(format!(
            "own_root_fd must be an open descriptor, not {raw}"
        )));
    }
    // SAFETY: the caller's descriptor, borrowed only to duplicate it.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    let owned = fd
        .try_clone_to_owned()
        .map_err(|e| PyValueError::new_err(format!("own_root_fd {raw}: {e}")))?;
    Ok(Some(Arc::new(owned)))
}
