//! The core's test hooks for the package's own points (`xla_pcache._testhook`): one
//! implementation, one variable, and off in a build without the `test-hooks` feature.

use pyo3::prelude::*;

/// Says that this process reached `point` (the file `<dir>/<point>.<pid>`, created
/// exclusively, no link followed); false when hooks are off or the mark could not be made.
#[pyfunction]
pub fn test_hook_reached(py: Python<'_>, point: &str) -> bool {
    py.detach(|| xla_pcache_core::test_hook_reached(point))
}

/// Whether the test created `<dir>/<point>.go`.
#[pyfunction]
pub fn test_hook_released(py: Python<'_>, point: &str) -> bool {
    py.detach(|| xla_pcache_core::test_hook_released(point))
}
