//! `Store` for Python (its `Blob` and `Claim` results are in blob.rs and claim.rs, the
//! conversions of its arguments and results in convert.rs).

use crate::blob::PyBlob;
use crate::buffer::{gathered, HeldBuffer, KeyArg};
use crate::chain::ChainHooks;
use crate::claim::PyClaim;
use crate::convert::{
    bad_arg, bool_arg, counters_into, durable_arg, entry_dict, evict_report, key_object,
    positive_size, read_only_arg, seconds, sign_arg, verify_report,
};
use crate::errors::{no_panic, on_cache_error, to_py, CacheError};
use crate::verdict::PyRefusal;
use crate::{options, walk};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use xla_pcache_core::{EntrySummary, Key, Store, StoreError, StoredBudget};

/// A persistent key -> blob store rooted at a directory.
#[pyclass(name = "Store", module = "xla_pcache._core", frozen, subclass)]
pub struct PyStore {
    inner: Arc<Store>,
    closed: Arc<AtomicBool>,
    chain: OnceLock<ChainHooks>,
}

impl PyStore {
    fn store(&self) -> PyResult<&Store> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(CacheError::new_err(format!(
                "the store at {} is closed",
                self.inner.root().display()
            )));
        }
        Ok(&self.inner)
    }

    /// `f` of this store, `key` and the bytes of the whole entry file `data` (borrowed, not
    /// copied), run without the GIL: what the methods that take an entry file share.
    fn with_entry_file<T: Send>(
        &self,
        py: Python<'_>,
        what: &str,
        key: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        f: impl FnOnce(&Store, Key<'_>, &[u8]) -> Result<T, StoreError> + Send,
    ) -> PyResult<T> {
        let key = KeyArg::extract(key)?;
        let buf = HeldBuffer::get(data, "data")?;
        let store = self.store()?;
        let res = py.detach(|| no_panic(what, || f(store, key.key(), buf.as_slice())));
        drop(buf);
        res
    }

    /// Puts `value` under `key`; what it published goes to the chain's tiers, told whether it
    /// replaces what their plain name holds (`replace`: `Store.replace`) or only creates it.
    fn put_then_copy(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        meta: Option<&Bound<'_, PyAny>>,
        sign: bool,
        replace: bool,
    ) -> PyResult<bool> {
        let key = KeyArg::extract(key)?;
        let buf = HeldBuffer::get(value, "value")?;
        let mut pairs = Vec::new();
        if let Some(m) = meta.filter(|m| !m.is_none()) {
            let m = m
                .cast::<PyDict>()
                .map_err(|_| bad_arg("meta", "a dict of str to str", m))?;
            for (k, v) in m.iter() {
                let (Ok(k), Ok(v)) = (k.extract::<String>(), v.extract::<String>()) else {
                    return Err(PyTypeError::new_err("meta must map str to str"));
                };
                pairs.push((k, v));
            }
        }
        let store = self.store()?;
        let res = py.detach(|| {
            no_panic("put", || {
                store.put_published(key.key(), buf.as_slice(), &pairs, sign)
            })
        });
        let published = on_cache_error(py, res, None, Some("not cached"))?;
        let stored = published.is_some();
        if let (Some(published), Some(chain)) = (published, self.chain.get()) {
            // The bytes just written go to the tiers, copied once from the caller's buffer
            // and the head the put encoded: the file is not read back.
            chain.published(py, published, buf.as_slice(), replace);
        }
        drop(buf);
        Ok(stored)
    }
}

#[pymethods]
impl PyStore {
    #[new]
    // The durations' defaults are the core's (None here, `StoreOptions::default()` there,
    // `STORE_DEFAULTS` for Python): written once.
    #[pyo3(signature = (path, *, max_size=None, read_only=false, durable=false, lock_mode=None,
        lock_timeout=None, lease_time=None, hit_interval=None, trash_grace=None, tmp_grace=None,
        claim_lease=None, read_mode=None, evict_trace=None, signing_key=None, trusted_keys=None,
        own_root_fd=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        max_size: Option<i128>,
        #[pyo3(from_py_with = read_only_arg)] read_only: bool,
        #[pyo3(from_py_with = durable_arg)] durable: bool,
        lock_mode: Option<String>,
        lock_timeout: Option<f64>,
        lease_time: Option<f64>,
        hit_interval: Option<f64>,
        trash_grace: Option<f64>,
        tmp_grace: Option<f64>,
        claim_lease: Option<f64>,
        read_mode: Option<String>,
        evict_trace: Option<&Bound<'_, PyAny>>,
        signing_key: Option<(String, Vec<u8>)>,
        trusted_keys: Option<Vec<(String, Vec<u8>)>>,
        own_root_fd: Option<i32>,
    ) -> PyResult<Self> {
        let (path, opts) = options::store_options(options::Args {
            path,
            max_size,
            read_only,
            durable,
            lock_mode,
            lock_timeout,
            lease_time,
            hit_interval,
            trash_grace,
            tmp_grace,
            claim_lease,
            read_mode,
            evict_trace,
            signing_key,
            trusted_keys,
            own_root_fd,
        })?;
        let store = py.detach(|| no_panic("Store()", || Store::open(&path, opts)))?;
        Ok(Self {
            inner: Arc::new(store),
            closed: Arc::new(AtomicBool::new(false)),
            chain: OnceLock::new(),
        })
    }

    #[getter]
    fn path(&self) -> PyResult<String> {
        no_panic("path", || Ok(self.inner.root().display().to_string()))
    }

    #[getter]
    fn read_only(&self) -> PyResult<bool> {
        no_panic("read_only", || Ok(self.inner.options().read_only))
    }

    #[getter]
    fn max_size(&self) -> PyResult<Option<u64>> {
        no_panic("max_size", || Ok(self.inner.max_size()))
    }

    #[getter]
    fn max_age(&self) -> PyResult<Option<f64>> {
        no_panic("max_age", || {
            Ok(self.inner.max_age().map(|a| a.as_secs_f64()))
        })
    }

    /// The cache's stored budget (its CONFIG file) as this handle last read it. The name
    /// is the Python API's, kept.
    fn cache_settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store()?;
        let s = no_panic("cache_settings", || Ok(store.stored_budget()))?;
        let d = PyDict::new(py);
        d.set_item("max_size", s.max_size)?;
        d.set_item("max_age_s", s.max_age.map(|a| a.as_secs_f64()))?;
        Ok(d)
    }

    /// Replaces the cache's stored budget; None unsets a field.
    #[pyo3(signature = (*, max_size=None, max_age=None))]
    fn write_cache_settings(
        &self,
        py: Python<'_>,
        max_size: Option<i128>,
        max_age: Option<f64>,
    ) -> PyResult<()> {
        // The core's bounds (`StoredBudget::check`), each refusal a ValueError naming its
        // argument.
        let s = StoredBudget {
            max_size: positive_size("max_size", max_size)?,
            max_age: max_age
                .map(|a| xla_pcache_core::max_age_secs("max_age", a))
                .transpose()
                .map_err(to_py)?,
        };
        let store = self.store()?;
        py.detach(|| no_panic("write_cache_settings", || store.write_stored_budget(&s)))
    }

    #[getter]
    fn mmap_reads(&self) -> PyResult<bool> {
        no_panic("mmap_reads", || Ok(self.inner.mmap_reads()))
    }

    #[getter]
    fn filesystem(&self) -> PyResult<String> {
        no_panic("filesystem", || Ok(self.inner.filesystem().name.clone()))
    }

    /// Puts a chain of remote tiers behind the directory: `fetch(names, max_bytes, accept)`
    /// is called after each local miss (the names to ask for in the core's order, the
    /// budget, and an `Accept` whose first taken value `get` returns); `on_publish(names,
    /// data, replace)` after each put that published (the entry file as written, the names a
    /// tier keeps it under, and whether it replaces what the plain name holds there). Once
    /// per store (xla_pcache.store.Store calls it when a chain is configured).
    fn _set_chain(&self, fetch: Py<PyAny>, on_publish: Py<PyAny>) -> PyResult<()> {
        self.chain
            .set(ChainHooks { fetch, on_publish })
            .map_err(|_| PyValueError::new_err("this store already has a chain"))
    }

    #[pyo3(signature = (key, value, *, meta=None, sign=true))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        meta: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = sign_arg)] sign: bool,
    ) -> PyResult<bool> {
        self.put_then_copy(py, key, value, meta, sign, false)
    }

    /// `put` (signed), whose copy to the tiers overwrites their plain name's object rather
    /// than only creating it: `xla_pcache.store.Store.replace`, after deleting the entry.
    #[pyo3(signature = (key, value, *, meta=None))]
    fn _put_replacing(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        meta: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.put_then_copy(py, key, value, meta, true, true)
    }

    /// The verified entry, or None. With `count=False` the lookup counts nothing and records
    /// no use (a read ahead of the lookup it may serve: `count_hit` counts it when it does).
    #[pyo3(signature = (key, *, count=true))]
    fn get(&self, py: Python<'_>, key: &Bound<'_, PyAny>, count: bool) -> PyResult<Py<PyAny>> {
        let key = KeyArg::extract(key)?;
        let store = self.store()?;
        let res = py.detach(|| {
            no_panic("get", || {
                if count {
                    store.get(key.key())
                } else {
                    store.get_uncounted(key.key())
                }
            })
        });
        let local = on_cache_error(py, res, None, Some("treated as a miss"))?;
        if let Some(inner) = local {
            return Ok(Py::new(py, PyBlob { inner })?.into_any());
        }
        let Some(chain) = self.chain.get() else {
            return Ok(py.None());
        };
        let (found, _) = chain.fetch(py, &self.inner, &self.closed, key)?;
        Ok(match found {
            Some(blob) => Py::new(py, blob)?.into_any(),
            None => py.None(),
        })
    }

    /// Asks the tiers for `key` as a local miss does, without looking in the directory or
    /// counting a miss: their verified entry (published here unless read-only) or None, and
    /// what the chain's fetch returned (its account of what each tier refused and why; None
    /// also when the store has no chain).
    fn _fetch(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<(Option<PyBlob>, Py<PyAny>)> {
        let key = KeyArg::extract(key)?;
        self.store()?;
        match self.chain.get() {
            Some(chain) => chain.fetch(py, &self.inner, &self.closed, key),
            None => Ok((None, py.None())),
        }
    }

    /// The verified entry file for `key` as bytes, or None.
    fn get_entry_file<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = KeyArg::extract(key)?;
        let store = self.store()?;
        let res = py.detach(|| no_panic("get_entry_file", || store.get_entry_file(key.key())));
        Ok(on_cache_error(py, res, None, None)?.map(|b| PyBytes::new(py, &b)))
    }

    /// The names (32 hex digits) an entry of `key` may be under for this store's reads, in
    /// the order they are tried: the plain name, then each trusted signer's own name.
    fn entry_names(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
        let key = KeyArg::extract(key)?;
        let store = self.store()?;
        let names = py.detach(|| no_panic("entry_names", || store.entry_names(key.key())))?;
        Ok(names.into_iter().map(xla_pcache_core::name_hex).collect())
    }

    /// The entry file under `name` when it holds an entry of `key` this store hands out,
    /// filed correctly there; None otherwise.
    fn entry_file_named<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        name: &str,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = KeyArg::extract(key)?;
        let store = self.store()?;
        let res = py.detach(|| {
            no_panic("entry_file_named", || {
                store.entry_file_named(key.key(), name)
            })
        });
        Ok(on_cache_error(py, res, None, None)?.map(|b| PyBytes::new(py, &b)))
    }

    /// Verifies a whole entry file in memory and returns its payload as a Blob, writing
    /// nothing; None if it does not verify.
    fn verify_entry_file(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PyBlob>> {
        let res = self.with_entry_file(py, "verify_entry_file", key, data, |s, k, b| {
            s.verify_entry_file(k, b.to_vec()).map(Result::ok)
        });
        Ok(on_cache_error(py, res, None, None)?.map(|inner| PyBlob { inner }))
    }

    /// A whole entry file received in `pieces` (buffers, in order): gathered into one
    /// buffer (the only copy), verified once, published when `publish`, and its payload
    /// returned as a Blob; None if it does not verify (nothing is written).
    fn take_entry_file(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        pieces: &Bound<'_, PyAny>,
        publish: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PyBlob>> {
        let key = KeyArg::extract(key)?;
        let publish = bool_arg("publish", publish)?;
        let mut held = Vec::new();
        let iter = pieces
            .try_iter()
            .map_err(|_| bad_arg("pieces", "an iterable of buffers", pieces))?;
        for piece in iter {
            held.push(HeldBuffer::get(&piece?, "pieces")?);
        }
        let store = self.store()?;
        let res = py.detach(|| {
            no_panic("take_entry_file", || match gathered(&held) {
                Some(file) => store
                    .take_entry_file(key.key(), file, publish)
                    .map(Result::ok),
                None => Ok(None),
            })
        });
        drop(held);
        Ok(on_cache_error(py, res, None, None)?.map(|inner| PyBlob { inner }))
    }

    /// A new unnamed file under the cache's tmp/, reached with no link followed, as a file
    /// descriptor the caller owns (and closes): where a tier streams a large entry file
    /// before a fetch's `Accept` reads it. CacheError when tmp/ cannot be used.
    fn _spool_fd(&self, py: Python<'_>) -> PyResult<i32> {
        use std::os::fd::IntoRawFd;
        let store = self.store()?;
        let file = py.detach(|| no_panic("spool_file", || store.spool_file()))?;
        Ok(file.into_raw_fd())
    }

    /// A new descriptor of the cache's directory (`O_PATH`: a base for the `*at` calls), the
    /// caller's to close: the directory the store works in, which for a store opened on
    /// `own_root_fd` is that one, whatever was renamed since.
    fn _root_fd(&self, py: Python<'_>) -> PyResult<i32> {
        use std::os::fd::IntoRawFd;
        let store = self.store()?;
        let fd = py.detach(|| no_panic("root_fd", || store.root_fd()))?;
        Ok(fd.into_raw_fd())
    }

    /// Publishes a whole entry file after verifying it: whether it published it (False:
    /// one was there, or a skipped write), or the core's `Refusal` when it does not verify
    /// (nothing is written): what an importer reports, from the check itself.
    fn put_entry_file<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let res = self.with_entry_file(py, "put_entry_file", key, data, |s, k, b| {
            s.put_entry_file(k, b)
        });
        match on_cache_error(py, res, Ok(false), None)? {
            Ok(published) => Ok(PyBool::new(py, published).to_owned().into_any()),
            Err(why) => Ok(Bound::new(py, PyRefusal::from(why))?.into_any()),
        }
    }

    /// Claims `key` for compiling, or waits up to `wait` seconds for another process's
    /// claim on it to end (see `Store.claim` in xla_pcache.store).
    fn claim(&self, py: Python<'_>, key: &Bound<'_, PyAny>, wait: f64) -> PyResult<PyClaim> {
        let key = KeyArg::extract(key)?;
        let wait = seconds("wait", wait)?;
        let store = self.store()?;
        let outcome = py.detach(|| no_panic("claim", || store.claim(key.key(), wait)))?;
        Ok(PyClaim::new(outcome))
    }

    /// Waits up to `timeout` seconds for another process's claim on `key` to end; never
    /// claims.
    fn wait_for(&self, py: Python<'_>, key: &Bound<'_, PyAny>, timeout: f64) -> PyResult<PyClaim> {
        let key = KeyArg::extract(key)?;
        let timeout = seconds("timeout", timeout)?;
        let store = self.store()?;
        let outcome = py.detach(|| no_panic("wait_for", || store.wait_for(key.key(), timeout)))?;
        Ok(PyClaim::new(outcome))
    }

    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = KeyArg::extract(key)?;
        let store = self.store()?;
        py.detach(|| no_panic("contains", || store.contains(key.key())))
    }

    /// Records a use of `key`'s entry, as a hit does, counting nothing (`Store::touch`).
    fn touch(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = KeyArg::extract(key)?;
        let store = self.store()?;
        py.detach(|| no_panic("touch", || store.touch(key.key())))
    }

    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = KeyArg::extract(key)?;
        let store = self.store()?;
        py.detach(|| no_panic("delete", || store.delete(key.key())))
    }

    /// Removes every entry but a later release's (`all`: those too); how many it removed.
    #[pyo3(signature = (*, all=false))]
    fn clear(&self, py: Python<'_>, all: bool) -> PyResult<u64> {
        let store = self.store()?;
        py.detach(|| no_panic("clear", || store.clear(all)))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let store = self.store()?;
        py.detach(|| no_panic("len", || store.len()))
            .map(|n| n as usize)
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let store = self.store()?;
        let entries = py.detach(|| no_panic("keys", || store.entries()))?;
        PyList::new(
            py,
            entries
                .iter()
                .map(|e| key_object(py, &e.key, e.key_is_text)),
        )
    }

    #[pyo3(signature = (shard=None))]
    fn entries<'py>(
        &self,
        py: Python<'py>,
        shard: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let shard: Option<String> = match shard {
            Some(s) if !s.is_none() => Some(
                s.extract()
                    .map_err(|_| bad_arg("shard", "a str (two hex digits)", s))?,
            ),
            _ => None,
        };
        let store = self.store()?;
        let entries: Vec<EntrySummary> = py.detach(|| match &shard {
            Some(s) => no_panic("entries", || store.shard_entries(s)),
            None => no_panic("entries", || store.entries()),
        })?;
        let out = PyList::empty(py);
        for e in &entries {
            out.append(entry_dict(py, e)?)?;
        }
        Ok(out)
    }

    /// The names of the keys this store trusts (None: it serves every verified entry) and
    /// of its signing key (None: puts are unsigned). Never a private key.
    #[getter]
    fn trusted_key_names(&self) -> PyResult<Option<Vec<String>>> {
        let store = self.store()?;
        Ok(store
            .options()
            .trust
            .as_ref()
            .map(|t| t.names().map(str::to_string).collect()))
    }

    /// The trusted keys as (name, 32-byte public key) pairs, in order (None without).
    #[getter]
    fn trusted_keys<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let store = self.store()?;
        let Some(trust) = store.options().trust.as_ref() else {
            return Ok(None);
        };
        let out = PyList::empty(py);
        for (name, public) in trust.public_keys() {
            out.append((name, PyBytes::new(py, &public)))?;
        }
        Ok(Some(out))
    }

    #[getter]
    fn signing_key_name(&self) -> PyResult<Option<String>> {
        let store = self.store()?;
        Ok(store
            .options()
            .signer
            .as_ref()
            .map(|s| s.name().to_string()))
    }

    /// The entries a reader with this store's trusted keys would not serve, as (path, key,
    /// why) tuples; with `remove`, they are removed. ValueError without trusted keys.
    #[pyo3(signature = (remove=false))]
    fn untrusted_entries<'py>(
        &self,
        py: Python<'py>,
        remove: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let store = self.store()?;
        let found = walk::interruptible(py, store, || {
            no_panic("untrusted_entries", || store.untrusted_entries(remove))
        })?;
        let out = PyList::empty(py);
        for (path, key, why) in found {
            let key = key_object(py, &key, true);
            out.append((path, key, why))?;
        }
        Ok(out)
    }

    fn entry_shards<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let store = self.store()?;
        let shards = py.detach(|| no_panic("entry_shards", || store.entry_shards()))?;
        PyList::new(py, shards)
    }

    fn trashed_keys<'py>(
        &self,
        py: Python<'py>,
        names: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if names.is_instance_of::<PyString>() {
            return Err(bad_arg("names", "a list of str", names));
        }
        let names: Vec<String> = names
            .extract()
            .map_err(|_| bad_arg("names", "a list of str", names))?;
        let store = self.store()?;
        let found = py.detach(|| no_panic("trashed_keys", || Ok(store.trashed_keys(&names))))?;
        let d = PyDict::new(py);
        for (name, key, is_text) in found {
            d.set_item(name, key_object(py, &key, is_text))?;
        }
        Ok(d)
    }

    fn interrupt(&self) -> PyResult<()> {
        let store = self.store()?;
        no_panic("interrupt", || {
            store.interrupt();
            Ok(())
        })
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store()?;
        let s = py.detach(|| no_panic("stats", || store.stats()))?;
        let d = PyDict::new(py);
        counters_into(&d, &s.counters, &s.tiers)?;
        d.set_item("hit_rate", s.hit_rate())?;
        d.set_item("entries", s.entries)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("max_size", store.max_size())?;
        d.set_item("max_age_s", store.max_age().map(|a| a.as_secs_f64()))?;
        d.set_item("processes", s.journals)?;
        d.set_item("view_age_s", s.view_age.map(|a| a.as_secs_f64()))?;
        d.set_item("view_fresh", s.view_fresh)?;
        d.set_item("path", store.root().display().to_string())?;
        d.set_item("filesystem", store.filesystem().name.clone())?;
        d.set_item("read_only", store.options().read_only)?;
        d.set_item("mmap_reads", store.mmap_reads())?;
        Ok(d)
    }

    /// Adds each `(tier, counter, n)` of `counts`: `n` to counter `counter` of the remote
    /// tier named `tier` (and to its `remote_*` total), aggregated across processes by
    /// `stats` like the rest. All are checked before any is added (ValueError naming the
    /// first that is not valid): a remote hit's counts cross from Python in one call.
    fn add_tier_counters(&self, counts: Vec<(String, String, u64)>) -> PyResult<()> {
        let store = self.store()?;
        no_panic("add_tier_counters", || store.add_tier_counts(&counts))
    }

    /// Counts a lookup served from another program's cache files (an adopted JAX entry of
    /// `nbytes` payload bytes) as a hit and as adopted; `compile_time_s` (seconds, None when
    /// unknown) is added to the compile time saved.
    #[pyo3(signature = (nbytes, compile_time_s=None))]
    fn count_adopted(&self, nbytes: u64, compile_time_s: Option<f64>) -> PyResult<()> {
        let ms = match compile_time_s {
            None => None,
            Some(s) if s.is_finite() && s >= 0.0 => {
                Some((s * 1000.0).round().min(u64::MAX as f64) as u64)
            }
            Some(s) => {
                return Err(PyValueError::new_err(format!(
                    "compile_time_s must be a finite number of seconds >= 0 or None, got {s}"
                )))
            }
        };
        let store = self.store()?;
        no_panic("count_adopted", || {
            store.count_adopted(nbytes, ms);
            Ok(())
        })
    }

    /// Counts a miss (already counted by the `get` that missed) of a key another build of
    /// the framework's runtime has an entry for (`other_build` in `stats`).
    fn count_other_build(&self) -> PyResult<()> {
        let store = self.store()?;
        no_panic("count_other_build", || {
            store.count_other_build();
            Ok(())
        })
    }

    /// Counts a later release's entry a remote tier holds (format `version`), refused after
    /// its first bytes (`entry_head_check`), as a lookup here counts one (`newer_format`,
    /// one warning naming the version).
    fn count_newer_format(&self, version: u16) -> PyResult<()> {
        let store = self.store()?;
        no_panic("count_newer_format", || {
            store.count_newer_format(version);
            Ok(())
        })
    }

    /// Counts a process start that hashed its runtime's binaries with no record to keep
    /// their identities in (`build_rehashes` in `stats`).
    fn count_build_rehash(&self) -> PyResult<()> {
        let store = self.store()?;
        no_panic("count_build_rehash", || {
            store.count_build_rehash();
            Ok(())
        })
    }

    /// Counts a lookup served by `blob`, an entry read earlier with `get(count=False)`: a
    /// hit, its bytes, its recorded compile time and a use of its entry, as `get` would.
    fn count_hit(&self, blob: PyRef<'_, PyBlob>) -> PyResult<()> {
        let store = self.store()?;
        no_panic("count_hit", || {
            store.count_hit(&blob.inner);
            Ok(())
        })
    }

    /// Adds each `(counter, n)` of `counts` to the prefetch counter `counter` (one of
    /// `PREFETCH_COUNTERS`; `stats` names it `prefetch_<counter>`). All are checked before
    /// any is added (ValueError naming the first that is not one).
    fn add_prefetch_counters(&self, counts: Vec<(String, u64)>) -> PyResult<()> {
        let store = self.store()?;
        no_panic("add_prefetch_counters", || {
            store.add_prefetch_counts(&counts)
        })
    }

    /// Counts `n` misses of lookups a framework made in a copy the store filled (torch_xla's
    /// host-local copy), so that `stats` counts them with the store's own.
    fn count_misses(&self, n: u64) -> PyResult<()> {
        let store = self.store()?;
        no_panic("count_misses", || {
            store.count_misses(n);
            Ok(())
        })
    }

    /// This process's own counters (no journal is read): what it did with this store.
    fn process_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store()?;
        let d = PyDict::new(py);
        let (values, tiers) = no_panic("process_stats", || {
            Ok((store.counters().snapshot(), store.counters().tiers()))
        })?;
        counters_into(&d, &values, &tiers)?;
        Ok(d)
    }

    #[pyo3(signature = (max_size=None, older_than=None))]
    fn evict<'py>(
        &self,
        py: Python<'py>,
        max_size: Option<u64>,
        older_than: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let older = older_than.map(|s| seconds("older_than", s)).transpose()?;
        let store = self.store()?;
        let r = walk::interruptible(py, store, || {
            no_panic("evict", || store.evict(max_size, older))
        })?;
        evict_report(py, r)
    }

    #[pyo3(signature = (repair=false, progress=None))]
    fn verify<'py>(
        &self,
        py: Python<'py>,
        repair: bool,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store()?;
        let r = walk::verify(py, store, repair, progress)?;
        verify_report(py, &r)
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store()?;
        py.detach(|| {
            no_panic("flush", || {
                store.flush();
                Ok(())
            })
        })
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if !self.closed.swap(true, Ordering::Relaxed) {
            py.detach(|| {
                no_panic("close", || {
                    self.inner.close_claims();
                    self.inner.flush();
                    Ok(())
                })
            })?;
        }
        Ok(())
    }

    /// Called in a forked child (xla_pcache.store registers it with os.register_at_fork):
    /// the child gets its own journal on its next write, holds no lock or claim of the
    /// parent's, runs no heartbeat thread of the parent's, and no mutex another thread of
    /// the parent held at the fork stays locked.
    fn _after_fork_child(&self) -> PyResult<()> {
        no_panic("_after_fork_child", || {
            // SAFETY: os.register_at_fork(after_in_child=) runs in the child right after
            // fork(), before the child starts any thread; this thread holds no guard into
            // the store.
            unsafe { self.inner.after_fork_child() };
            Ok(())
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        let o = self.inner.options();
        format!(
            "<xla_pcache.Store {:?}{}{}>",
            self.inner.root().display().to_string(),
            self.inner
                .max_size()
                .map(|m| format!(" max_size={m}"))
                .unwrap_or_default(),
            if o.read_only { " read_only" } else { "" }
        )
    }
}
