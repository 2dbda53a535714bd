//! The chain of remote tiers behind a store, as the binding sees it: two Python hooks (a fetch after a
//! local miss, a copy after a publish) and `Accept`, which the fetch hands each remote value
//! to. A remote hit crosses into Python once (the fetch) and back once per value (`Accept`):
//! the names, the budget and the bytes just written travel as arguments rather than being
//! asked for.

use crate::blob::PyBlob;
use crate::buffer::KeyArg;
use crate::errors::{no_panic, on_cache_error, CacheError};
use crate::verdict::{take, PyRefusal, Taken};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use xla_pcache_core::{name_hex, tier_names, Blob, Published, Store};

/// What the chain behind the directory (set by `xla_pcache.store.Store`) is asked, from Python:
/// `fetch(names, max_bytes, accept)` after a local miss, `on_publish(names, data, replace)`
/// after a put this process published. A store without a chain has none, so its hits and
/// misses run no Python code.
pub struct ChainHooks {
    pub fetch: Py<PyAny>,
    pub on_publish: Py<PyAny>,
}

fn hex(names: Vec<u128>) -> Vec<String> {
    names.into_iter().map(name_hex).collect()
}

impl ChainHooks {
    /// After a local miss of `key`: the tiers' entry, verified by `Accept` (and published
    /// unless the store is read-only), or None; and what the hook returned (the chain's
    /// account of the fetch: what each tier refused, with the core's verdict), None when it
    /// failed. A failure of the hook is logged and a miss.
    pub fn fetch(
        &self,
        py: Python<'_>,
        store: &Arc<Store>,
        closed: &Arc<AtomicBool>,
        key: KeyArg,
    ) -> PyResult<(Option<PyBlob>, Py<PyAny>)> {
        let (names, max_bytes) = py.detach(|| {
            no_panic("entry_names", || {
                Ok((store.entry_names(key.key())?, store.max_size()))
            })
        })?;
        let accept = Py::new(
            py,
            PyAccept {
                store: Arc::clone(store),
                closed: Arc::clone(closed),
                key,
                taken: Mutex::new(None),
            },
        )?;
        let told = match self
            .fetch
            .call1(py, (hex(names), max_bytes, accept.clone_ref(py)))
        {
            Ok(told) => told,
            Err(e) => {
                log::error!("xla_pcache: remote tier: {e}; treated as a miss");
                py.None()
            }
        };
        let taken = accept
            .get()
            .taken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        Ok((taken.map(|inner| PyBlob { inner }), told))
    }

    /// After a put published `published` with the payload `payload`: the whole entry file
    /// (its head as written, then the payload, in one buffer the tiers may keep) goes to the
    /// tiers under its names, replacing what their plain name holds with `replace`
    /// (`Store.replace`), else only created there. A failure of the hook is logged: the put
    /// succeeded.
    pub fn published(&self, py: Python<'_>, published: Published, payload: &[u8], replace: bool) {
        let head = &published.head;
        let data = PyBytes::new_with(py, head.len() + payload.len(), |buf| {
            buf[..head.len()].copy_from_slice(head);
            buf[head.len()..].copy_from_slice(payload);
            Ok(())
        });
        let res = data.and_then(|data| {
            self.on_publish
                .call1(py, (hex(published.names), data, replace))
                .map(drop)
        });
        if let Err(e) = res {
            log::error!("xla_pcache: remote tier: {e}; not written there");
        }
    }
}

/// What a fetch hands each remote value to, for one key: the store's one gate (the whole
/// entry file verified, a trusting store's trust included) and, for the first value it takes,
/// the local publish (unless read-only). Called with a buffer, a list of buffers (a value's
/// pieces, in order) or a spooled file (an object with the descriptor `fd`, read from its
/// start). Returns, for a value it takes, the names under which the tiers before the one
/// that answered are to be backfilled (none for a read-only store, which writes nowhere);
/// for a value it refuses, the core's verdict (`Refusal`: whoever fetched learns why from
/// the check itself); None for a value it could not read, which proves nothing, and for any
/// value once it took one.
#[pyclass(name = "Accept", module = "xla_pcache._core", frozen)]
pub struct PyAccept {
    store: Arc<Store>,
    closed: Arc<AtomicBool>,
    key: KeyArg,
    taken: Mutex<Option<Blob>>,
}

#[pymethods]
impl PyAccept {
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(CacheError::new_err(format!(
                "the store at {} is closed",
                self.store.root().display()
            )));
        }
        if self
            .taken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return Ok(None);
        }
        let store = &self.store;
        let publish = !store.options().read_only;
        let res = take(py, store, self.key.key(), value, publish, "value");
        let blob = match on_cache_error(py, res, Taken::Unread, None)? {
            Taken::Blob(blob) => blob,
            Taken::Refused(why) => {
                return Ok(Some(Bound::new(py, PyRefusal::from(why))?.into_any()))
            }
            Taken::Unread => return Ok(None),
        };
        let names = if publish {
            let signer = blob.header.signature.as_ref().map(|f| f.signer.as_str());
            hex(tier_names(&blob.header.key, signer))
        } else {
            Vec::new()
        };
        *self.taken.lock().unwrap_or_else(|p| p.into_inner()) = Some(*blob);
        Ok(Some(PyTuple::new(py, names)?.into_any()))
    }
}
