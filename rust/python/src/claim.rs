//! `Claim` for Python: how a `Store.claim` or `Store.wait_for` ended, and the claim when ours.

use crate::errors::no_panic;
use pyo3::prelude::*;
use std::sync::Mutex;
use xla_pcache_core::{Claim, ClaimOutcome};

/// How a `Store.claim` or `Store.wait_for` ended; holds the claim when it is ours.
#[pyclass(name = "Claim", module = "xla_pcache._core", frozen)]
pub struct PyClaim {
    state: &'static str,
    waited: f64,
    took_over: bool,
    inner: Mutex<Option<Claim>>,
}

impl PyClaim {
    pub(crate) fn new(outcome: ClaimOutcome) -> Self {
        PyClaim {
            state: outcome.state.as_str(),
            waited: outcome.waited.as_secs_f64(),
            took_over: outcome.took_over,
            inner: Mutex::new(outcome.claim),
        }
    }

    fn claim(&self) -> std::sync::MutexGuard<'_, Option<Claim>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyClaim {
    #[getter]
    fn state(&self) -> &'static str {
        self.state
    }

    #[getter]
    fn waited(&self) -> f64 {
        self.waited
    }

    #[getter]
    fn took_over(&self) -> bool {
        self.took_over
    }

    #[getter]
    fn held(&self) -> PyResult<bool> {
        no_panic("Claim.held", || {
            Ok(self.claim().as_ref().is_some_and(|c| c.held()))
        })
    }

    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.claim().take();
        if let Some(mut c) = taken {
            py.detach(|| {
                no_panic("release", || {
                    c.release();
                    Ok(())
                })
            })?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.release(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<xla_pcache.Claim {}{}{}>",
            self.state,
            if self.waited > 0.0 {
                format!(" waited={:.3}s", self.waited)
            } else {
                String::new()
            },
            if self.held().unwrap_or(false) {
                " held"
            } else {
                ""
            }
        )
    }
}
