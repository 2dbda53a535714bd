//! Whole entry files as bytes: what a remote tier or a bundle carries between caches.

use super::*;

impl Store {
    /// The verified entry file (header, key, metadata, payload) for `key`, or None when it is
    /// missing, corrupt or filed under another key. Does not count as a use.
    pub fn get_entry_file(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(&key)?;
        let path = self.layout.entry_path(entry_name(key.bytes));
        let Ok(file) = fs::read(&path) else {
            return Ok(None);
        };
        match entry::verify(&file) {
            Ok(h) if h.key == key.bytes => Ok(Some(file)),
            _ => Ok(None),
        }
    }

    /// Publishes an entry received as a whole file, after verifying its header, length,
    /// payload checksum and that it is filed under `key`. Ok(None) if it does not verify
    /// (nothing is written); otherwise what `put` returns.
    pub fn put_entry_file(&self, key: Key<'_>, file: &[u8]) -> Result<Option<bool>, StoreError> {
        check_key(&key)?;
        let h = match entry::verify(file) {
            Ok(h) if h.key == key.bytes => h,
            _ => return Ok(None),
        };
        let payload = &file[h.header_len..];
        self.put(key, payload, &h.meta).map(Some)
    }
}
