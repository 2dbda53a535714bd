//! Store walks that may take long (`verify`, `evict`, `untrusted_entries`): run on a
//! thread of their own without the GIL, so that Ctrl-C stops them at the next entry.

use crate::errors::no_panic;
use pyo3::prelude::*;
use std::time::Duration;
use xla_pcache_core::{Store, VerifyReport};

/// Runs `f` (a long store walk) on a scoped thread without the GIL, while this thread
/// looks for signals every 20 ms: on Ctrl-C (KeyboardInterrupt from Python's handler) it
/// asks the store to stop at the next entry, waits for `f` to return, and raises. A walk
/// in the calling thread would see Ctrl-C only once it had finished. The walk's end is
/// received, not polled for: the caller gets control back as soon as the walk releases
/// what it held (another process may take the evictor lock at that instant).
pub fn interruptible<T: Send>(
    py: Python<'_>,
    store: &Store,
    f: impl FnOnce() -> PyResult<T> + Send,
) -> PyResult<T> {
    let _walk = store.walk();
    let (res, err) = py.detach(|| {
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let h = s.spawn(move || {
                // A send fails only if the receiver is gone, which it is not before the
                // scope ends.
                let _ = tx.send(f());
            });
            let mut err = None;
            let res = loop {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(res) => break res,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        if err.is_none() {
                            if let Err(e) = Python::attach(|py| py.check_signals()) {
                                store.interrupt();
                                err = Some(e);
                            }
                        }
                    }
                    // The sender was dropped without sending: `f` panicked.
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        break Err(pyo3::exceptions::PyRuntimeError::new_err(
                            "xla_pcache: the store walk panicked",
                        ))
                    }
                }
            };
            // Joined here, so that a panic of the walk is the error above and never
            // resumes in this thread when the scope ends.
            let _ = h.join();
            (res, err)
        })
    });
    match err {
        Some(e) => Err(e),
        None => res,
    }
}

/// `Store::verify` as an interruptible walk, telling `progress(done, total)` at most every
/// 50 ms and at the end; a `progress` that raises stops the walk, as Ctrl-C does, and its
/// exception is raised.
pub fn verify(
    py: Python<'_>,
    store: &Store,
    repair: bool,
    progress: Option<Py<PyAny>>,
) -> PyResult<VerifyReport> {
    let cb_err = std::sync::Mutex::new(None::<PyErr>);
    let r = interruptible(py, store, || {
        let mut last = std::time::Instant::now() - Duration::from_secs(1);
        let mut cb = |done: u64, total: u64| {
            let Some(p) = &progress else { return };
            if done != total && last.elapsed() < Duration::from_millis(50) {
                return;
            }
            last = std::time::Instant::now();
            Python::attach(|py| {
                if let Err(e) = p.call1(py, (done, total)) {
                    // A callback that raises stops the walk, as an interrupt does.
                    store.interrupt();
                    if let Ok(mut slot) = cb_err.lock() {
                        slot.get_or_insert(e);
                    }
                }
            });
        };
        no_panic("verify", || store.verify(repair, &mut cb))
    })?;
    if let Some(e) = cb_err.lock().ok().and_then(|mut s| s.take()) {
        return Err(e);
    }
    Ok(r)
}
