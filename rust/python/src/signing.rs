//! Key pairs for signed entries: generation, the public half of a private key, and the
//! core's checks of keys as a store takes them (for Python's parsers of key files and
//! lists). The cryptography and the rules are the core's (`sign.rs`); this is conversion
//! only.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;
use xla_pcache_core::{default_verification_record_place, Signer, TrustSet, VerificationRecord};

/// 32 random bytes from the operating system: a new Ed25519 private key.
#[pyfunction]
pub fn generate_signing_key<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
    let seed = xla_pcache_core::generate_seed().map_err(PyValueError::new_err)?;
    Ok(PyBytes::new(py, &seed))
}

/// The 32-byte public key of a 32-byte private key.
#[pyfunction]
pub fn signing_public_key<'py>(py: Python<'py>, private: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let public = xla_pcache_core::public_key(private)
        .map_err(|e| PyValueError::new_err(format!("private: {e}")))?;
    Ok(PyBytes::new(py, &public))
}

/// Raises ValueError unless `name` is a valid key name (versioned: `ci-1`).
#[pyfunction]
pub fn check_key_name(name: &str) -> PyResult<()> {
    xla_pcache_core::check_key_name(name).map_err(PyValueError::new_err)
}

/// Raises ValueError unless `key` (name, 32-byte private key) is a signing key the core
/// takes (`Signer::new`: the name's rule, the key's length): what `Store(signing_key=)`
/// checks, for a caller that reads a key file.
#[pyfunction]
pub fn check_signing_key(key: (String, Vec<u8>)) -> PyResult<()> {
    signer(Some(key)).map(drop)
}

/// Raises ValueError unless `keys` ((name, 32-byte public key) pairs) is a trusted set the
/// core takes (`TrustSet::new`: each name's rule, no name twice, each key 32 bytes and an
/// Ed25519 key): what `Store(trusted_keys=)` checks, for a caller that parses a list.
#[pyfunction]
pub fn check_trusted_keys(keys: Vec<(String, Vec<u8>)>) -> PyResult<()> {
    trusted_set(&keys).map(drop)
}

fn trusted_set(keys: &[(String, Vec<u8>)]) -> PyResult<TrustSet> {
    TrustSet::new(keys).map_err(|e| PyValueError::new_err(format!("trusted_keys: {e}")))
}

/// The `signing_key` argument of Store: (name, 32-byte private key).
pub fn signer(arg: Option<(String, Vec<u8>)>) -> PyResult<Option<Arc<Signer>>> {
    arg.map(|(name, seed)| {
        Signer::new(&name, &seed)
            .map(Arc::new)
            .map_err(|e| PyValueError::new_err(format!("signing_key: {e}")))
    })
    .transpose()
}

/// The `trusted_keys` argument of Store: (name, 32-byte public key) pairs. Signatures
/// verified are kept in this user's record (`$XDG_CACHE_HOME/xla_pcache-verified`, else a
/// directory of this user's own on this host where that cannot be written).
pub fn trust(arg: Option<Vec<(String, Vec<u8>)>>) -> PyResult<Option<Arc<TrustSet>>> {
    arg.map(|keys| {
        let record = Arc::new(VerificationRecord::in_place(
            default_verification_record_place(),
        ));
        trusted_set(&keys).map(|t| Arc::new(t.with_record(Some(record))))
    })
    .transpose()
}
