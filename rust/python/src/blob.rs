//! `Blob` for Python: a verified entry, its payload through the buffer protocol.

use crate::convert::{key_object, meta_dict, ns_to_secs};
use crate::errors::no_panic;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::os::raw::{c_int, c_void};
use xla_pcache_core::Blob;

/// A verified cache entry; its payload is exposed through the buffer protocol, no copy.
#[pyclass(name = "Blob", module = "xla_pcache._core", frozen)]
pub struct PyBlob {
    pub(crate) inner: Blob,
}

#[pymethods]
impl PyBlob {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let payload = no_panic("Blob buffer", || Ok(slf.get().inner.payload()))?;
        // SAFETY: the payload lives as long as the Blob, which the view keeps alive through
        // its `obj` reference (set by PyBuffer_FillInfo); the buffer is read-only.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                payload.as_ptr() as *mut c_void,
                payload.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> PyResult<usize> {
        no_panic("Blob len", || Ok(self.inner.payload().len()))
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let payload = no_panic("Blob bytes", || Ok(self.inner.payload()))?;
        Ok(PyBytes::new(py, payload))
    }

    #[getter]
    fn key<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        key_object(py, &self.inner.header.key, self.inner.header.key_is_text)
    }

    #[getter]
    fn meta<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        meta_dict(py, &self.inner.header.meta)
    }

    /// The signer's key name of a signed entry (as the entry says; a store with trusted
    /// keys served it only if that key signed it), else None.
    #[getter]
    fn signer(&self) -> Option<String> {
        self.inner
            .header
            .signature
            .as_ref()
            .map(|f| f.signer.clone())
    }

    #[getter]
    fn created(&self) -> f64 {
        ns_to_secs(self.inner.header.created_ns)
    }

    #[getter]
    fn mapped(&self) -> PyResult<bool> {
        no_panic("Blob.mapped", || Ok(self.inner.is_mapped()))
    }

    fn __repr__(&self) -> String {
        format!(
            "<xla_pcache.Blob {} bytes, {}>",
            self.inner.payload().len(),
            if self.inner.is_mapped() {
                "mapped"
            } else {
                "in memory"
            }
        )
    }
}
