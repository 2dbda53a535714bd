//! `hash_key` and `Hasher`: xxh3-128 over str/bytes/buffer parts.

use crate::buffer::HeldBuffer;
use crate::buffer::KeyArg;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};
use xla_pcache_core::KeyHasher;

/// Parts larger than this are hashed with the GIL released.
const DETACH_BYTES: usize = 64 * 1024;

fn update(py: Python<'_>, h: &mut KeyHasher, part: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(s) = part.cast::<PyString>() {
        h.update(s.to_str()?.as_bytes());
        return Ok(());
    }
    let buf = HeldBuffer::get(part, "each part")?;
    if buf.as_slice().len() >= DETACH_BYTES {
        py.detach(|| h.update(buf.as_slice()));
    } else {
        h.update(buf.as_slice());
    }
    Ok(())
}

/// xxh3-128 hex digest of the parts (str as UTF-8), each length-prefixed.
#[pyfunction]
#[pyo3(signature = (*parts))]
pub fn hash_key(py: Python<'_>, parts: &Bound<'_, PyTuple>) -> PyResult<String> {
    let mut h = KeyHasher::new();
    for p in parts.iter() {
        update(py, &mut h, &p)?;
    }
    Ok(h.hexdigest())
}

/// Streaming xxh3-128 over str/bytes/buffer parts.
#[pyclass(name = "Hasher", module = "xla_pcache._core")]
pub struct PyHasher {
    inner: KeyHasher,
}

#[pymethods]
impl PyHasher {
    #[new]
    #[pyo3(signature = (*parts))]
    fn new(py: Python<'_>, parts: &Bound<'_, PyTuple>) -> PyResult<Self> {
        let mut inner = KeyHasher::new();
        for p in parts.iter() {
            update(py, &mut inner, &p)?;
        }
        Ok(Self { inner })
    }

    fn update(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        update(py, &mut self.inner, data)
    }

    fn hexdigest(&self) -> String {
        self.inner.hexdigest()
    }

    fn digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.digest128().to_be_bytes())
    }
}

/// The file name (32 hex digits) under which the store files `key`.
#[pyfunction]
pub fn entry_name(key: &Bound<'_, PyAny>) -> PyResult<String> {
    let key = KeyArg::extract(key)?;
    Ok(xla_pcache_core::name_hex(xla_pcache_core::entry_name(
        key.key().bytes,
    )))
}

/// The xxh3 vector path in use (`avx512`, `avx2`, `sse2`, `neon`, `scalar`, or `portable-*`).
#[pyfunction]
pub fn hash_impl() -> &'static str {
    xla_pcache_core::active_hash_impl().path()
}
