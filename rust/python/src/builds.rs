//! `identify_binaries`: the identity of a framework's installed binaries, for Python. The
//! reading, hashing and the user's record are the core's (`build_id/`).

use crate::errors::no_panic;
use pyo3::prelude::*;
use std::path::PathBuf;
use xla_pcache_core::{
    default_build_record_place, mapped_objects, BuildIdRecord, Loaded, RecordPlace, RecordUse,
};

/// One file's identity as Python sees it: (kind, id hex, changed ns, computed now,
/// loaded, size), or why it could not be read.
type Identified = Result<(String, String, u64, bool, String, u64), String>;

/// The identity of each file of `paths` (`("build-id" | "blake3", hex, ctime ns, computed
/// now, "no" | "same" | "replaced", size)`, or a message when it cannot be read), how many
/// times the user's record was refused (one warning each, logged), and where the record is
/// (`(directory read from or written to, or None; the directories before it that could not
/// be used, with why; why identities computed now are remembered nowhere, or None)`).
/// `record_dir`: the record's directory and no other; by default
/// `$XDG_CACHE_HOME/xla_pcache-builds`, else a directory of this user's own on this host
/// where that cannot be written. Hashing runs with the GIL released.
#[pyfunction]
#[pyo3(signature = (paths, record_dir=None))]
pub fn identify_binaries(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    record_dir: Option<PathBuf>,
) -> PyResult<(Vec<Py<PyAny>>, u64, Placed)> {
    let place = record_dir.map_or_else(default_build_record_place, RecordPlace::only);
    let (found, problems, used): (Vec<Identified>, u64, RecordUse) = py.detach(|| {
        no_panic("identify_binaries", || {
            let record = BuildIdRecord::in_place(place);
            let mapped = mapped_objects();
            let out = record
                .identify(&paths, &mapped)
                .into_iter()
                .zip(&paths)
                .map(|(r, p)| match r {
                    Ok(id) => Ok((
                        id.kind.as_str().to_string(),
                        id.hex(),
                        id.changed_ns,
                        id.computed,
                        match id.loaded {
                            Loaded::No => "no",
                            Loaded::Same => "same",
                            Loaded::Replaced => "replaced",
                        }
                        .to_string(),
                        id.size,
                    )),
                    Err(e) => Err(format!("{}: {e}", p.display())),
                })
                .collect();
            Ok((out, record.take_problems(), record.used()))
        })
    })?;
    let out = found
        .into_iter()
        .map(|r| match r {
            Ok(t) => Ok(t.into_pyobject(py)?.into_any().unbind()),
            Err(m) => Ok(m.into_pyobject(py)?.into_any().unbind()),
        })
        .collect::<PyResult<Vec<_>>>()?;
    let placed = (
        used.dir.map(|d| d.display().to_string()),
        used.skipped,
        used.unkept,
    );
    Ok((out, problems, placed))
}

/// Where a record is, for Python: (its directory, or None; those before it that could not
/// be used, with why; why what was computed is kept nowhere, or None).
type Placed = (Option<String>, Vec<String>, Option<String>);
