//! Listing the entries: every name under entries/, the shards, one shard's entries with
//! their headers and the index's last use and hits, and the keys of entries just moved to
//! trash/.

use super::{disk_bytes, Store};
use crate::dir::{Dir, Kind, Name, Rel};
use crate::error::{io_err, StoreError};
use crate::hash::{name_hex, parse_name_hex};
use crate::layout::{ENTRIES, TRASH};
use std::io;

/// One entry as `entries()` lists it.
#[derive(Debug, Clone)]
pub struct EntrySummary {
    pub name: String,
    pub key: Vec<u8>,
    pub key_is_text: bool,
    pub size: u64,
    pub disk_bytes: u64,
    pub created_ns: u64,
    pub last_use_ns: Option<u64>,
    /// Hits recorded, at most one per process per hit interval: a lower bound on uses.
    pub hits: u32,
    /// The signer's key name (signed entries), as the entry says: not a verdict on it.
    pub signer: Option<String>,
    pub meta: Vec<(String, String)>,
}

impl Store {
    /// Every entry with its header (walks the directory; headers only, payloads unread).
    pub fn entries(&self) -> Result<Vec<EntrySummary>, StoreError> {
        let mut out = Vec::new();
        for shard in self.entry_shards()? {
            out.extend(self.shard_entries(&shard)?);
        }
        Ok(out)
    }

    /// The names under entries/, sorted: `shard_entries` of each, in turn, lists every
    /// entry, a shard at a time (so a caller can show the first ones at once, at any size).
    pub fn entry_shards(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .list_entries_dir()?
            .map(|(_, names)| names.into_iter().map(|n| n.to_string()).collect())
            .unwrap_or_default())
    }

    /// entries/ and the names in it, sorted; None when there is no entries/ yet.
    fn list_entries_dir(&self) -> Result<Option<(Dir, Vec<Name>)>, StoreError> {
        let entries = match self.dir(&ENTRIES) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("list", &self.layout.entries(), e)),
        };
        let mut names = entries
            .list()
            .map_err(|e| io_err("list", &self.layout.entries(), e))?;
        names.sort();
        Ok(Some((entries, names)))
    }

    /// The entries of one shard with their headers, last use and hits from the index
    /// (looked up together: the snapshot blocks of one shard's names, each read once).
    /// Nothing for a name that is no shard directory.
    pub fn shard_entries(&self, shard: &str) -> Result<Vec<EntrySummary>, StoreError> {
        let Some(shard_name) = Name::new(Kind::Shard, shard) else {
            return Ok(Vec::new());
        };
        let rel = ENTRIES.join(&shard_name);
        let d = match self.dir(&rel) {
            Ok(d) => d,
            Err(_) => return Ok(Vec::new()),
        };
        let names = match d.list() {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list", &self.layout.entries().join(shard), e)),
        };
        let mut files: Vec<(u128, Name)> = names
            .into_iter()
            .filter_map(|f| parse_name_hex(f.as_str()).map(|n| (n, f)))
            .collect();
        files.sort_unstable();
        let uses = {
            let mut st = self.state();
            let _ = self.refresh(&mut st);
            let names: Vec<u128> = files.iter().map(|f| f.0).collect();
            st.view.entries.get_sorted(&names)
        };
        let mut out = Vec::with_capacity(files.len());
        for ((name, file), info) in files.into_iter().zip(uses) {
            let Ok((h, m)) = self.read_header(&rel.join(&file)) else {
                continue;
            };
            out.push(EntrySummary {
                name: name_hex(name),
                key: h.key.clone(),
                key_is_text: h.key_is_text,
                size: h.payload_len,
                disk_bytes: disk_bytes(&m),
                created_ns: h.created_ns,
                last_use_ns: info.map(|i| i.last_use),
                hits: info.map_or(0, |i| i.hits),
                signer: h.signature.map(|f| f.signer),
                meta: h.meta,
            });
        }
        Ok(out)
    }

    /// The keys of entries just evicted or deleted (file names as `EvictReport::names`
    /// gives them), read from their headers in trash/ while they are there (a few minutes):
    /// a report can name what it removed without listing the cache first.
    pub fn trashed_keys(&self, names: &[String]) -> Vec<(String, Vec<u8>, bool)> {
        let wanted: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        let Ok(trash) = self.dir(&TRASH) else {
            return Vec::new();
        };
        let Ok(files) = trash.list() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for f in files {
            let Some((name, _)) = f.as_str().split_once('.') else {
                continue;
            };
            if !wanted.contains(name) {
                continue;
            }
            if let Ok((h, _)) = self.read_header(&TRASH.join(&f)) {
                out.push((name.to_string(), h.key, h.key_is_text));
            }
        }
        out
    }

    /// Every name under entries/ (walks the directory): (Some(shard), file) for the names
    /// in real shard directories, (None, name) for anything else directly under entries/
    /// (a stray file, or a shard that is not a real directory).
    pub(super) fn entry_files(&self) -> Result<Vec<(Option<Name>, Name)>, StoreError> {
        let mut out = Vec::new();
        let Some((entries, shards)) = self.list_entries_dir()? else {
            return Ok(out);
        };
        for shard in shards {
            if !entries.stat(&shard).is_ok_and(|m| m.is_dir()) {
                out.push((None, shard));
                continue;
            }
            let Ok(d) = entries.sub(&shard) else {
                out.push((None, shard));
                continue;
            };
            let names = match d.list() {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(io_err(
                        "list",
                        &self.layout.entries().join(shard.as_str()),
                        e,
                    ))
                }
            };
            out.extend(names.into_iter().map(|n| (Some(shard.clone()), n)));
        }
        Ok(out)
    }

    pub(super) fn entry_display(&self, shard: Option<&Name>, file: &Name) -> String {
        self.layout
            .entries()
            .join(shard.map_or("", Name::as_str))
            .join(file.as_str())
            .display()
            .to_string()
    }
}

/// `entries/<shard>`, or `entries` itself for a name directly under it.
pub(super) fn entries_rel(shard: Option<&Name>) -> Rel {
    match shard {
        Some(s) => ENTRIES.join(s),
        None => ENTRIES,
    }
}
