//! `own_directory`: the core's rule for a directory of this user's own, for the host-local
//! directories the package keeps.

use crate::errors::CacheError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::path::PathBuf;
use xla_pcache_core::{OwnFound, OwnRule};

/// A directory `own_directory` checked.
#[pyclass(name = "OwnDir", module = "xla_pcache._core", frozen)]
pub struct PyOwnDir {
    /// A descriptor of the directory, opened for reading: the caller's, to use for
    /// everything in it and to close.
    #[pyo3(get)]
    fd: i32,
    /// Where it is (for messages).
    #[pyo3(get)]
    path: PathBuf,
    /// "own", "made" or "repaired".
    #[pyo3(get)]
    found: &'static str,
    /// Repaired: the mode it had.
    #[pyo3(get)]
    mode: Option<u32>,
    /// Repaired: how many names it held, discarded.
    #[pyo3(get)]
    discarded: u64,
    /// Under rule "named": the mode of the named root when others can write it (the
    /// directory is then the one beneath it); None otherwise.
    #[pyo3(get)]
    open_root: Option<u32>,
}

/// Opens `path` (with `dir_fd`, its last component beneath that descriptor of its parent),
/// making it mode 0700 (missing parents too) when absent, and checks that it is a directory
/// of this user's own: not a link, owned by the effective user, writable by no one else.
/// `rule` says what becomes of one of this user's that others can write: "refuse",
/// "repair" (made 0700 and emptied) or "named" (a root the user named: left as it is, and
/// our own directory beneath it used). `CacheError` naming it and why when it is refused.
#[pyfunction]
#[pyo3(signature = (path, *, dir_fd=None, rule="refuse"))]
pub fn own_directory(
    py: Python<'_>,
    path: PathBuf,
    dir_fd: Option<i32>,
    rule: &str,
) -> PyResult<PyOwnDir> {
    let rule = match rule {
        "refuse" => OwnRule::Refuse,
        "repair" => OwnRule::Repair,
        "named" => OwnRule::Named,
        other => {
            return Err(PyValueError::new_err(format!(
                "rule must be 'refuse', 'repair' or 'named', not {other:?}"
            )))
        }
    };
    let (opened, fd) = match dir_fd {
        None => py.detach(|| xla_pcache_core::open_own_fd(None, &path, rule)),
        Some(raw) => {
            if raw < 0 {
                return Err(PyValueError::new_err(format!(
                    "dir_fd must be an open descriptor, not {raw}"
                )));
            }
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(PyValueError::new_err(format!(
                    "path {} has no parent for dir_fd",
                    path.display()
                )));
            };
            // SAFETY: the caller's descriptor, borrowed for this call only (duplicated by
            // the core before use); a closed or foreign number fails in that dup.
            let base = unsafe { BorrowedFd::borrow_raw(raw) };
            let name = PathBuf::from(name);
            py.detach(|| xla_pcache_core::open_own_fd(Some((base, parent)), &name, rule))
        }
    }
    .map(|(fd, o)| (o, fd))
    .map_err(CacheError::new_err)?;
    let (found, mode, discarded) = match opened.found {
        OwnFound::Own => ("own", None, 0),
        OwnFound::Made => ("made", None, 0),
        OwnFound::Repaired { mode, discarded } => ("repaired", Some(mode), discarded),
    };
    Ok(PyOwnDir {
        fd: fd.into_raw_fd(),
        path: opened.path,
        found,
        mode,
        discarded,
        open_root: opened.open_root,
    })
}
