//! `hash_key` and `Hasher`: xxh3-128 over str/bytes/buffer parts.

use crate::buffer::HeldBuffer;
use crate::buffer::KeyArg;
use crate::errors::no_panic;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};
use xla_pcache_core::KeyHasher;

/// Parts larger than this are hashed with the GIL released.
const DETACH_BYTES: usize = 64 * 1024;

fn update(py: Python<'_>, h: &mut KeyHasher, part: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(s) = part.cast::<PyString>() {
        let bytes = s.to_str()?.as_bytes();
        return no_panic("hash", || {
            h.update(bytes);
            Ok(())
        });
    }
    let buf = HeldBuffer::get(part, "each part")?;
    let data = buf.as_slice();
    let mut hash = || {
        no_panic("hash", || {
            h.update(data);
            Ok(())
        })
    };
    if data.len() >= DETACH_BYTES {
        py.detach(hash)
    } else {
        hash()
    }
}

/// xxh3-128 hex digest of the parts (str as UTF-8), each length-prefixed.
#[pyfunction]
#[pyo3(signature = (*parts))]
pub fn hash_key(py: Python<'_>, parts: &Bound<'_, PyTuple>) -> PyResult<String> {
    let mut h = KeyHasher::new();
    for p in parts.iter() {
        update(py, &mut h, &p)?;
    }
    no_panic("hash_key", || Ok(h.hexdigest()))
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

    fn hexdigest(&self) -> PyResult<String> {
        no_panic("hexdigest", || Ok(self.inner.hexdigest()))
    }

    fn digest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let digest = no_panic("digest", || Ok(self.inner.digest128()))?;
        Ok(PyBytes::new(py, &digest.to_be_bytes()))
    }
}

/// The file name (32 hex digits) under which the store files `key`.
#[pyfunction]
pub fn entry_name(key: &Bound<'_, PyAny>) -> PyResult<String> {
    let key = KeyArg::extract(key)?;
    no_panic("entry_name", || {
        Ok(xla_pcache_core::name_hex(xla_pcache_core::entry_name(
            key.key().bytes,
        )))
    })
}

/// The name (32 hex digits) of `signer`'s own copy of `key`'s entry, beside the plain one:
/// where a signed put also goes, so that an entry squatting the plain name stops no one.
#[pyfunction]
pub fn signed_entry_name(key: &Bound<'_, PyAny>, signer: &str) -> PyResult<String> {
    let key = KeyArg::extract(key)?;
    if let Err(e) = xla_pcache_core::check_key_name(signer) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "signer: {e}"
        )));
    }
    no_panic("signed_entry_name", || {
        Ok(xla_pcache_core::name_hex(xla_pcache_core::signed_name(
            key.key().bytes,
            signer,
        )))
    })
}

/// The xxh3 vector path in use (`avx512`, `avx2`, `sse2`, `neon`, `scalar`, or `portable-*`).
#[pyfunction]
pub fn hash_impl() -> PyResult<&'static str> {
    no_panic("hash_impl", || {
        Ok(xla_pcache_core::active_hash_impl().path())
    })
}
