//! The core's error type. Only operations that a caller asked for explicitly (open, clear,
//! delete, evict, verify) return errors; get and put turn failures into misses.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{0}")]
    Format(String),
    #[error("the cache at {0} is read-only")]
    ReadOnly(PathBuf),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("cache directory {0} does not exist")]
    NotFound(PathBuf),
    /// A lock's error (`lock::LockError`, converted there: this module imports none above it).
    #[error("cannot take the evictor lock: {0}")]
    Lock(#[source] Box<dyn std::error::Error + Send + Sync>),
}

pub fn io_err(op: &'static str, path: &Path, source: io::Error) -> StoreError {
    StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}
