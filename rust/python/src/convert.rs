//! Conversions between Python objects and the core's types, for `Store` (store.rs) and
//! `Blob` (blob.rs): arguments in, each error naming its argument; results out, as the
//! dicts and values the stubs (`_core.pyi`) describe.

use crate::errors::to_py;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use std::path::PathBuf;
use std::time::Duration;
use xla_pcache_core::{
    EntrySummary, EvictReport, StoreOptions, TierCounters, VerifyReport, COUNTER_NAMES,
    TIER_COUNTER_NAMES,
};

// ---- arguments in

/// A duration argument in seconds, by the core's bounds (`duration_secs`: finite, not
/// negative, at most `MAX_DURATION`), else a `ValueError` naming the argument.
pub(crate) fn seconds(name: &str, v: f64) -> PyResult<Duration> {
    xla_pcache_core::duration_secs(name, v).map_err(to_py)
}

/// A byte size argument (a budget), by the core's bounds (`positive_size`: from one byte
/// to `MAX_SIZE`), else a `ValueError` naming the argument.
pub(crate) fn positive_size(name: &str, v: Option<i128>) -> PyResult<Option<u64>> {
    v.map(|n| xla_pcache_core::positive_size(name, n))
        .transpose()
        .map_err(to_py)
}

/// A choice argument (`lock_mode`, `read_mode`): parsed by the core, the error naming the
/// argument.
pub(crate) fn choice<T: std::str::FromStr>(name: &str, value: Option<String>) -> PyResult<Option<T>>
where
    T::Err: std::fmt::Display,
{
    value
        .map(|s| {
            s.parse::<T>()
                .map_err(|e| PyValueError::new_err(format!("invalid {name} {s:?}: {e}")))
        })
        .transpose()
}

/// A conversion of the argument `name` that failed, as a TypeError that names it.
pub(crate) fn bad_arg(name: &str, want: &str, got: &Bound<'_, PyAny>) -> PyErr {
    let ty = got
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("{name} must be {want}, not {ty}"))
}

/// The argument `name` as a bool (True or False only).
pub(crate) fn bool_arg(name: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    v.extract::<bool>()
        .map_err(|_| bad_arg(name, "True or False", v))
}

pub(crate) fn read_only_arg(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    bool_arg("read_only", v)
}

pub(crate) fn durable_arg(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    bool_arg("durable", v)
}

pub(crate) fn sign_arg(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    bool_arg("sign", v)
}

/// The argument `name` as a path (str or os.PathLike), without NUL bytes.
pub(crate) fn path_arg(name: &str, v: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let p: PathBuf = v
        .extract()
        .map_err(|_| bad_arg(name, "a str or os.PathLike", v))?;
    if std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).contains(&0) {
        return Err(PyValueError::new_err(format!(
            "{name} must not contain a NUL byte"
        )));
    }
    Ok(p)
}

// ---- results out

/// The core's defaults of the options `Store()` takes in seconds, by argument name.
pub(crate) fn store_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = StoreOptions::default();
    let out = PyDict::new(py);
    for (name, v) in [
        ("lock_timeout", d.lock_timeout),
        ("lease_time", d.lease_time),
        ("hit_interval", d.hit_interval),
        ("trash_grace", d.trash_grace),
        ("tmp_grace", d.tmp_grace),
        ("claim_lease", d.claim_lease),
    ] {
        out.set_item(name, v.as_secs_f64())?;
    }
    Ok(out)
}

/// Counters into a report: the core's own always; the remote tiers' (`remote_*` totals,
/// then `remote_<tier>_<counter>` for each tier counted) only when some tier counted, so
/// that a store without tiers reports none.
pub(crate) fn counters_into(
    d: &Bound<'_, PyDict>,
    counters: &[u64],
    tiers: &TierCounters,
) -> PyResult<()> {
    // The remote totals by name: counters appended after them (`untrusted`) are the core's.
    let remote = |name: &str| name.starts_with("remote_");
    let any_remote = !tiers.is_empty()
        || COUNTER_NAMES
            .iter()
            .zip(counters)
            .any(|(name, v)| remote(name) && *v > 0);
    for (name, v) in COUNTER_NAMES.iter().zip(counters) {
        if !remote(name) || any_remote {
            d.set_item(*name, *v)?;
        }
    }
    for (tier, values) in tiers {
        for (counter, v) in TIER_COUNTER_NAMES.iter().zip(values) {
            d.set_item(format!("remote_{tier}_{counter}"), *v)?;
        }
    }
    Ok(())
}

/// A key as it was given: str when it was text (and is UTF-8), else bytes.
pub(crate) fn key_object<'py>(py: Python<'py>, key: &[u8], is_text: bool) -> Bound<'py, PyAny> {
    match (is_text, std::str::from_utf8(key)) {
        (true, Ok(s)) => PyString::new(py, s).into_any(),
        _ => PyBytes::new(py, key).into_any(),
    }
}

/// An entry's metadata as a dict of str.
pub(crate) fn meta_dict<'py>(
    py: Python<'py>,
    meta: &[(String, String)],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in meta {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// Nanoseconds since the epoch, as Python's seconds.
pub(crate) fn ns_to_secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// One entry of `Store.entries()`.
pub(crate) fn entry_dict<'py>(py: Python<'py>, e: &EntrySummary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("key", key_object(py, &e.key, e.key_is_text))?;
    d.set_item("name", &e.name)?;
    d.set_item("size", e.size)?;
    d.set_item("disk_bytes", e.disk_bytes)?;
    d.set_item("created", ns_to_secs(e.created_ns))?;
    d.set_item("last_use", e.last_use_ns.map(ns_to_secs))?;
    d.set_item("hits", e.hits)?;
    d.set_item("meta", meta_dict(py, &e.meta)?)?;
    d.set_item("signer", &e.signer)?;
    Ok(d)
}

/// `Store.evict()`'s report.
pub(crate) fn evict_report(py: Python<'_>, r: EvictReport) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("removed", r.removed)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("dropped", r.dropped)?;
    d.set_item("added", r.added)?;
    d.set_item("names", r.names)?;
    d.set_item("skipped", r.skipped)?;
    d.set_item("skipped_files", r.skipped_files)?;
    d.set_item("interrupted", r.interrupted)?;
    Ok(d)
}

/// `Store.verify()`'s report.
pub(crate) fn verify_report<'py>(
    py: Python<'py>,
    r: &VerifyReport,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("entries", r.entries)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("corrupt", &r.corrupt)?;
    d.set_item("foreign", &r.foreign)?;
    d.set_item("newer_format", &r.newer_format)?;
    d.set_item("unindexed", r.unindexed)?;
    d.set_item("dangling", r.dangling)?;
    d.set_item("stale_tmp", r.stale_tmp)?;
    d.set_item("stale_trash", r.stale_trash)?;
    d.set_item("problems", r.problems())?;
    d.set_item("repaired", r.repaired)?;
    d.set_item("interrupted", r.interrupted)?;
    d.set_item("skipped_files", &r.skipped_files)?;
    Ok(d)
}
