//! The core's verdicts for Python: `Refusal` (why an entry file, or its first bytes, is not
//! taken), the checks of an object's first bytes a tier makes (`entry_head_check`,
//! `entry_head_key`), and taking a whole value received from a tier (a buffer, its pieces,
//! or a spooled file) through the core's gate (`take`), for `Accept` and `Store`. The
//! rules are the core's (`store/gate.rs`); this converts.

use crate::buffer::{gathered, HeldBuffer};
use crate::convert::key_object;
use crate::errors::no_panic;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use xla_pcache_core::{Blob, Key, Refusal, Store};

/// Why the core does not take an entry file (or an object by its first bytes): `kind` is
/// `corrupt`, `untrusted`, `other_key` or `newer_format`; `why` says it for people;
/// `version` is a later release's format version (`newer_format` only); `garbage` whether it
/// proves the object no entry of its name for any reader of any release (damage, another
/// key's entry): what a writer may remove.
#[pyclass(name = "Refusal", module = "xla_pcache._core", frozen)]
pub struct PyRefusal {
    #[pyo3(get)]
    kind: &'static str,
    #[pyo3(get)]
    why: String,
    #[pyo3(get)]
    version: Option<u16>,
    #[pyo3(get)]
    garbage: bool,
}

#[pymethods]
impl PyRefusal {
    fn __repr__(&self) -> String {
        format!("<Refusal {}: {}>", self.kind, self.why)
    }
}

impl From<Refusal> for PyRefusal {
    fn from(r: Refusal) -> Self {
        PyRefusal {
            kind: r.kind(),
            why: r.to_string(),
            version: match r {
                Refusal::NewerFormat(v) => Some(v),
                _ => None,
            },
            garbage: r.proves_garbage(),
        }
    }
}

/// The verdict on the first bytes `head` of an object of `size` bytes a tier holds under the
/// entry name `name`: None when they hold the whole header of an entry filed under that name
/// whose file is `size` bytes long (the rest may be read), else the core's `Refusal`.
#[pyfunction]
pub fn entry_head_check(
    py: Python<'_>,
    head: &Bound<'_, PyAny>,
    name: &str,
    size: u64,
) -> PyResult<Option<PyRefusal>> {
    let buf = HeldBuffer::get(head, "head")?;
    let name = name.to_owned();
    let res = py.detach(|| {
        no_panic("entry_head_check", || {
            Ok(xla_pcache_core::judge_head(buf.as_slice(), &name, size).err())
        })
    });
    drop(buf);
    Ok(res?.map(PyRefusal::from))
}

/// The key an entry file's first bytes `head` name (str for a text key, else bytes), read
/// untrusted for a caller to fetch and verify whole under it; the core's `Refusal` when they
/// name none (`newer_format` for a later release's entry).
#[pyfunction]
pub fn entry_head_key<'py>(
    py: Python<'py>,
    head: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let buf = HeldBuffer::get(head, "head")?;
    let res = py.detach(|| {
        no_panic("entry_head_key", || {
            Ok(xla_pcache_core::head_key(buf.as_slice()))
        })
    });
    drop(buf);
    match res? {
        Ok((key, is_text)) => Ok(key_object(py, &key, is_text)),
        Err(why) => Ok(Bound::new(py, PyRefusal::from(why))?.into_any()),
    }
}

/// What became of a value received whole: taken (its payload), refused (the core's
/// verdict), or not judged (it could not be read: a miss that proves nothing).
pub enum Taken {
    Blob(Box<Blob>),
    Refused(Refusal),
    Unread,
}

/// Takes `value` (a buffer, a list or tuple of buffers to be joined in order, or a spooled
/// file: an object with an open descriptor `fd`, read from its start) for `key` through the
/// core's gate (`Store::take_entry_file`): verified once, published when `publish`. The GIL
/// is released while the core reads and hashes. A failure of the cache is a `CacheError`
/// (the caller's to turn into a miss); a value of no such kind a `ValueError` naming `what`.
pub fn take(
    py: Python<'_>,
    store: &Store,
    key: Key<'_>,
    value: &Bound<'_, PyAny>,
    publish: bool,
    what: &str,
) -> PyResult<Taken> {
    let judged = |r: Result<Blob, Refusal>| match r {
        Ok(blob) => Taken::Blob(Box::new(blob)),
        Err(why) => Taken::Refused(why),
    };
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let mut held = Vec::new();
        for piece in value.try_iter()? {
            held.push(HeldBuffer::get(&piece?, what)?);
        }
        let res = py.detach(|| {
            no_panic("take_entry_file", || match gathered(&held) {
                Some(file) => store.take_entry_file(key, file, publish).map(judged),
                None => Ok(Taken::Unread),
            })
        });
        drop(held);
        return res;
    }
    if let Ok(buf) = HeldBuffer::get(value, what) {
        let res = py.detach(|| {
            no_panic("take_entry_file", || {
                store
                    .take_entry_file(key, buf.as_slice().to_vec(), publish)
                    .map(judged)
            })
        });
        drop(buf);
        return res;
    }
    let fd: i32 = value
        .getattr("fd")
        .and_then(|fd| fd.extract())
        .map_err(|_| {
            PyValueError::new_err(format!(
                "{what} must be a buffer, a list of buffers or a spooled file (fd)"
            ))
        })?;
    let file = borrowed_file(fd)?;
    py.detach(|| {
        no_panic("take_entry_from_file", || {
            store
                .take_entry_from_file(key, &file, publish)
                .map(|t| t.map_or(Taken::Unread, judged))
        })
    })
}

/// A duplicate of the open descriptor `fd` the caller holds, ours to close.
fn borrowed_file(fd: i32) -> PyResult<std::fs::File> {
    use std::os::fd::BorrowedFd;
    if fd < 0 {
        return Err(PyValueError::new_err(format!(
            "fd must be an open file descriptor, got {fd}"
        )));
    }
    // SAFETY: the caller passes a descriptor it holds open for this call; duplicating one
    // that is not open fails (EBADF) and is reported naming the argument.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .map_err(|e| PyValueError::new_err(format!("fd {fd} is not an open file: {e}")))?;
    Ok(std::fs::File::from(owned))
}
