//! Borrowing the bytes of any contiguous buffer-protocol object (bytes, bytearray,
//! memoryview, numpy arrays) without copying, so they can be read with the GIL released.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// A held `Py_buffer`; released on drop (which needs the GIL: drop it before detaching ends).
pub struct HeldBuffer {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the exporter keeps the memory alive and fixed until PyBuffer_Release; we only read
// it, and release it with the GIL held (drop happens in GIL-holding code).
unsafe impl Send for HeldBuffer {}
unsafe impl Sync for HeldBuffer {}

impl HeldBuffer {
    pub fn get(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        if obj.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(format!(
                "{what} must be a bytes-like object, not str (encode it first)"
            )));
        }
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: obj is a live object; view points to writable storage for a Py_buffer.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_SIMPLE) };
        if rc != 0 {
            let _ = PyErr::take(obj.py());
            return Err(PyTypeError::new_err(format!(
                "{what} must be a contiguous bytes-like object (bytes, bytearray, memoryview, \
                 array), not {}",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "?".into())
            )));
        }
        Ok(Self { view })
    }

    pub fn as_slice(&self) -> &[u8] {
        if self.view.len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: a PyBUF_SIMPLE buffer is `len` contiguous bytes at `buf`, alive until release.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.view.len as usize) }
    }
}

/// The bytes of `pieces`, in order, in one buffer (the only copy): None when they do not
/// fit in memory, which the allocation says rather than aborting (an object larger than
/// memory allows is a miss).
pub fn gathered(pieces: &[HeldBuffer]) -> Option<Vec<u8>> {
    let total = pieces
        .iter()
        .try_fold(0usize, |n, b| n.checked_add(b.as_slice().len()))?;
    let mut out = Vec::new();
    out.try_reserve_exact(total).ok()?;
    for b in pieces {
        out.extend_from_slice(b.as_slice());
    }
    Some(out)
}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: the view was filled by PyObject_GetBuffer and is released exactly once.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// Key bytes and whether the key was text, from a `str` or `bytes` object.
pub enum KeyArg {
    Text(String),
    Bytes(Vec<u8>),
}

impl KeyArg {
    pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(KeyArg::Text(s.to_str()?.to_owned()));
        }
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(KeyArg::Bytes(b.as_bytes().to_vec()));
        }
        Err(PyTypeError::new_err(format!(
            "key must be str or bytes, not {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into())
        )))
    }

    pub fn key(&self) -> xla_pcache_core::Key<'_> {
        match self {
            KeyArg::Text(s) => xla_pcache_core::Key {
                bytes: s.as_bytes(),
                is_text: true,
            },
            KeyArg::Bytes(b) => xla_pcache_core::Key {
                bytes: b,
                is_text: false,
            },
        }
    }
}
