//! The write path: put, through a temp file (payload hashed as it is written) published
//! without replacing anything, after admission (`admission.rs`); where a put goes when a
//! name is squatted; an emptied cache laid out again.

use super::admission::Refusal;
use super::{check_key, disk_bytes, gate, Key, Store};
use crate::clock::unique_suffix;
use crate::dir::{self as cdir, Dir, Kind, Name, Stat};
use crate::entry::{self, EntryError};
use crate::error::StoreError;
use crate::hash::{entry_name, name_hex};
use crate::journal::Record;
use crate::layout::{Layout, ENTRIES, TMP, TRASH};
use crate::publish::publish_no_replace;
use crate::sign::{self, TrustSet};
use crate::stats::Counter;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Write (and hash) the payload in pieces that stay in the CPU cache.
const WRITE_CHUNK: usize = 256 << 10;

/// A put refused by admission (`admission.rs`) after its file was written: why no eviction
/// made room for it.
#[derive(Debug)]
struct Refused(Refusal);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no room within the cache's budget")
    }
}

impl std::error::Error for Refused {}

/// Who vouches for a put's bytes.
pub(super) enum Signing {
    /// This process produced them: its signer, if any, signs.
    Own,
    /// Received whole with these signature fields, already verified against this store's
    /// keys: kept as they are.
    Carried(Vec<(String, String)>),
    /// Received, and not vouched for by a key this store checked: written unsigned.
    Unsigned,
}

/// An entry a put just published, as a copy of it elsewhere (a remote tier) needs it without
/// reading the file back: the head of the entry file as written (header, key, metadata,
/// padding; the payload follows it) and the names a tier keeps it under (`gate::tier_names`).
pub struct Published {
    pub head: Vec<u8>,
    pub names: Vec<u128>,
}

impl Store {
    /// Stores `value` under `key`. Ok(true) if this call published it; Ok(false) if the key
    /// exists, the store is read-only, the value is larger than the budget, or writing failed.
    /// A claim this process holds on `key` is released by the put (see `claim.rs`).
    ///
    /// This store's signer, if any, signs it: `put` is for bytes this process produced
    /// (compiled); bytes it received are put with `put_unsigned` or `put_entry_file`.
    pub fn put(
        &self,
        key: Key<'_>,
        value: &[u8],
        meta: &[(String, String)],
    ) -> Result<bool, StoreError> {
        self.put_published(key, value, meta, true)
            .map(|p| p.is_some())
    }

    /// As `put` (`put_unsigned` when not `sign`), and what it published, or None: what the
    /// binding hands the remote tiers after a publish.
    pub fn put_published(
        &self,
        key: Key<'_>,
        value: &[u8],
        meta: &[(String, String)],
        sign: bool,
    ) -> Result<Option<Published>, StoreError> {
        let signing = if sign {
            Signing::Own
        } else {
            Signing::Unsigned
        };
        let res = self.put_entry(key, value, meta, signing);
        self.release_claim_after_put(&key);
        res
    }

    /// As `put`, for bytes this process did not produce (a file another program's cache
    /// left, adopted): published unsigned, whatever signer the store holds, since a
    /// signature says "I compiled this".
    pub fn put_unsigned(
        &self,
        key: Key<'_>,
        value: &[u8],
        meta: &[(String, String)],
    ) -> Result<bool, StoreError> {
        self.put_published(key, value, meta, false)
            .map(|p| p.is_some())
    }

    pub(super) fn put_entry(
        &self,
        key: Key<'_>,
        value: &[u8],
        meta: &[(String, String)],
        signing: Signing,
    ) -> Result<Option<Published>, StoreError> {
        check_key(&key)?;
        if let Some((k, _)) = meta.iter().find(|(k, _)| k.starts_with(sign::META_PREFIX)) {
            return Err(StoreError::Invalid(format!(
                "meta name {k:?}: names starting with {:?} are reserved for signatures",
                sign::META_PREFIX
            )));
        }
        if self.opts.read_only {
            return Ok(None);
        }
        let bad = |e: EntryError| StoreError::Invalid(format!("cannot encode entry: {e}"));
        // The signer, and which trusted set decides whether an entry already there stands
        // for this one.
        let own = match signing {
            Signing::Own => self.opts.signer.as_deref(),
            _ => None,
        };
        let (signer, accept) = match (&signing, own) {
            (Signing::Carried(f), _) => (sign::fields_signer(f), self.opts.trust.as_deref()),
            (_, Some(s)) => (Some(s.name().to_string()), self.write_trust.as_ref()),
            _ => (None, None),
        };
        let Some((name, replace)) = self.put_target(key, accept.zip(signer.as_deref())) else {
            self.maybe_flush_stats(false);
            return Ok(None);
        };
        // Signed only once it is known to be written.
        let sig = match (signing, own) {
            (Signing::Carried(f), _) => Some(f),
            (_, Some(s)) => Some(s.sign(key.bytes, key.is_text, value, meta).map_err(bad)?),
            _ => None,
        };
        let signed = sig.is_some();
        let mut all_meta;
        let meta = match sig {
            Some(f) => {
                all_meta = meta.to_vec();
                all_meta.extend(f);
                &all_meta[..]
            }
            None => meta,
        };
        // The payload checksum is filled in as the payload is written (write_and_publish).
        let mut header = entry::encode_header(
            key.bytes,
            key.is_text,
            meta,
            value.len() as u64,
            0,
            crate::clock::unix_ns(),
        )
        .map_err(bad)?;
        let total = (header.len() + value.len()) as u64;
        if let Some(max) = self.max_size() {
            if total > max {
                self.counters.inc(Counter::TooLarge);
                self.warn("too-large", || {
                    format!("not caching a {total}-byte entry: it is larger than the cache budget of {max} bytes")
                });
                return Ok(None);
            }
            if let Err(why) = self.admits(max, total, false) {
                self.refused(why);
                return Ok(None);
            }
        }
        let outcome = self
            .write_and_publish(name, &mut header, value, replace)
            .or_else(|e| {
                // The root may have been replaced by an empty directory: lay it out again, once.
                if e.kind() == io::ErrorKind::NotFound && self.relayout() {
                    self.write_and_publish(name, &mut header, value, replace)
                } else {
                    Err(e)
                }
            });
        match outcome {
            Ok(Some(disk)) => {
                self.counters.inc(Counter::Puts);
                self.counters.add(Counter::BytesWritten, total);
                let mut st = self.state();
                let rec = Record::Touch {
                    name,
                    disk_bytes: disk,
                    t: crate::clock::unix_ns(),
                    put: true,
                };
                self.append_locked(&mut st, &[rec]);
                st.pending_bytes += disk;
                self.flush_stats_locked(&mut st, false);
                self.maybe_evict(&mut st);
                drop(st);
                let names = gate::tier_names(key.bytes, signer.as_deref().filter(|_| signed));
                Ok(Some(Published {
                    head: header,
                    names,
                }))
            }
            Ok(None) => {
                self.counters.inc(Counter::PutExists);
                self.maybe_flush_stats(false);
                Ok(None)
            }
            Err(e) if e.get_ref().is_some_and(|r| r.is::<Refused>()) => {
                let why = e
                    .get_ref()
                    .and_then(|r| r.downcast_ref::<Refused>())
                    .map_or(Refusal::NoRoom, |r| r.0);
                self.refused(why);
                Ok(None)
            }
            // Counted and warned where it was met.
            Err(e) if cdir::is_unsafe(&e) => {
                self.maybe_flush_stats(false);
                Ok(None)
            }
            Err(e) => {
                self.counters.inc(Counter::Errors);
                self.warn("write", || {
                    format!(
                        "cannot write cache entry under {}: {e}; not cached",
                        self.layout.root.display()
                    )
                });
                self.maybe_flush_stats(false);
                Ok(None)
            }
        }
    }

    /// Where a put of `key` goes: Some((name, replace)), or None when it is not to be
    /// written (counted). The plain file unless it is there already; a signed put (`signed`:
    /// the set that decides what stands for it, and the signer's name) whose plain file holds
    /// an entry that set would not serve goes to the signer's own file, replacing whatever
    /// is there that is not a trusted entry of that signer: no unsigned or untrusted writer
    /// can squat a key for a trusted one.
    fn put_target(&self, key: Key<'_>, signed: Option<(&TrustSet, &str)>) -> Option<(u128, bool)> {
        let exists = |name: u128| match self.dir(&Layout::shard_rel(name)) {
            Ok(shard) => match shard.stat(&Name::entry(name)) {
                Ok(m) if m.is_file() => Some(true),
                // A directory, FIFO, link or socket stands at the name: no entry, and it would
                // fail every put of the key for ever. Moved aside (or the put is skipped).
                Ok(m) => self.clear_squatter(&shard, name, &m),
                Err(_) => Some(false),
            },
            // Not a real directory inside the cache (counted and warned): a skipped write.
            Err(e) if cdir::is_unsafe(&e) => None,
            // Missing: made again when the entry is published.
            Err(_) => Some(false),
        };
        let plain = entry_name(key.bytes);
        if !exists(plain)? {
            return Some((plain, false));
        }
        let put_exists = || {
            self.counters.inc(Counter::PutExists);
            None
        };
        let Some((trust, signer)) = signed else {
            return put_exists();
        };
        if self.holds_trusted(plain, key, trust, None) {
            return put_exists();
        }
        let own = sign::signed_name(key.bytes, signer);
        if !exists(own)? {
            return Some((own, false));
        }
        if self.holds_trusted(own, key, trust, Some(signer)) {
            return put_exists();
        }
        Some((own, true))
    }

    /// Clears an entry name held by something that is no file (`found`: a directory, a FIFO,
    /// a symbolic link, a socket), as `verify --repair` would: renamed into trash/ through
    /// the directory handles (a link is moved as itself, never followed; the trash sweep
    /// removes it, a directory tree beneath its handle), else removed in place. Counted
    /// (`unsafe_paths`) and warned once. Whether an entry file stands there now (Some(false):
    /// the name is free), or None when it could not be cleared (the put is skipped).
    pub(super) fn clear_squatter(&self, shard: &Dir, name: u128, found: &Stat) -> Option<bool> {
        let what = squatter_kind(found);
        self.counters.inc(Counter::UnsafePaths);
        self.warn("squatted-name", || {
            format!(
                "{} is {what}, not an entry file: moved aside to trash/ (never followed), so \
                 that the key can be written (someone with write access to the cache \
                 directory put it there)",
                self.layout.entry_path(name).display()
            )
        });
        let file = Name::entry(name);
        let aside = Name::new(Kind::Made, &format!("{file}.squat.{}", unique_suffix()));
        let moved = match (self.dir(&TRASH), aside) {
            (Ok(trash), Some(aside)) => match shard.rename(&file, &trash, &aside) {
                Ok(()) => match trash.stat(&aside) {
                    // Raced with a writer that published a real file there meanwhile: it
                    // goes back, and the name is taken.
                    Ok(m) if m.is_file() => {
                        let _ = publish_no_replace(&trash, &aside, shard, &file);
                        let _ = trash.unlink(&aside);
                        return Some(true);
                    }
                    _ => true,
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => true,
                Err(_) => false,
            },
            _ => false,
        };
        (moved || shard.remove_any(&file).is_ok()).then_some(false)
    }

    /// Whether the file `name` is a whole entry of `key` that `trust` would serve (signed by
    /// `signer` when given).
    fn holds_trusted(
        &self,
        name: u128,
        key: Key<'_>,
        trust: &TrustSet,
        signer: Option<&str>,
    ) -> bool {
        self.read_entry(&Layout::entry_rel(name), Some(trust))
            .is_ok_and(|b| gate::belongs(&b.header, key.bytes, signer).is_ok())
    }

    fn refused(&self, why: Refusal) {
        self.counters.inc(Counter::PutsRefused);
        self.warn("refused", || match why {
            Refusal::LockHeld => format!(
                "not caching an entry: with it the cache under {} would be over its budget, \
                 and another process held the evictor lock for all of {:?} (lock_timeout) \
                 without its eviction making room",
                self.layout.root.display(),
                self.opts.lock_timeout
            ),
            Refusal::NoRoom => format!(
                "not caching an entry: with it the cache under {} would be over its budget, \
                 and what this process could see and remove in the eviction time a put may \
                 take did not make room (entries it could not remove, or more to evict than \
                 that: the next puts go on with it)",
                self.layout.root.display(),
            ),
        });
        self.maybe_flush_stats(false);
    }

    /// Writes a temp file and links it into place. Ok(Some(disk bytes)) if published,
    /// Ok(None) if another writer got there first. With `replace`, renamed over what is
    /// there (a signer's own file held by an entry no trusting reader serves).
    pub(super) fn write_and_publish(
        &self,
        name: u128,
        header: &mut [u8],
        value: &[u8],
        replace: bool,
    ) -> io::Result<Option<u64>> {
        let tmp_dir = self.dir(&TMP)?;
        let tmp = Name::checked(
            Kind::Made,
            &format!("{}.{}.tmp", name_hex(name), unique_suffix()),
        )?;
        let file = Name::entry(name);
        let shard_rel = Layout::shard_rel(name);
        let res = (|| {
            let f =
                tmp_dir.open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o666)?;
            // Payload first, each chunk hashed just before it is written, while it is in
            // cache: one pass over the value instead of two, and a large value is read from
            // memory once.
            // The header, which holds the checksum, goes in last, at offset 0.
            let mut hasher = crate::hash::Checksum::new();
            let mut at = header.len() as u64;
            for chunk in value.chunks(WRITE_CHUNK) {
                hasher.update(chunk);
                f.write_all_at(chunk, at)?;
                at += chunk.len() as u64;
            }
            entry::set_payload_checksum(header, hasher.digest());
            f.write_all_at(header, 0)?;
            if self.opts.durable {
                f.sync_all()?;
            }
            let disk = disk_bytes(&cdir::fstat(&f)?);
            // close() is where NFS flushes to the server and reports errors such as ENOSPC.
            close_checked(f)?;
            // Looked at again now that the value is written: the other writers' puts may
            // have filled the budget meanwhile (only a comparison while under it).
            if let Some(max) = self.max_size() {
                if let Err(why) = self.admits(max, disk, true) {
                    return Err(io::Error::other(Refused(why)));
                }
            }
            let shard = match self.dir(&shard_rel) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // The shard directory was removed (e.g. by hand); recreate it once.
                    match self
                        .dir(&ENTRIES)?
                        .mkdir(&Name::shard((name >> 120) as u8), 0o777)
                    {
                        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                        _ => {}
                    }
                    self.dir(&shard_rel)?
                }
                other => other?,
            };
            let published = if replace {
                tmp_dir.rename(&tmp, &shard, &file)?;
                true
            } else {
                publish_no_replace(&tmp_dir, &tmp, &shard, &file)?
            };
            if published && self.opts.durable {
                shard.sync()?;
            }
            Ok(published.then_some(disk))
        })();
        if !matches!(res, Ok(Some(_))) {
            let _ = tmp_dir.unlink(&tmp);
        }
        res
    }

    /// Re-creates the layout if the root exists but lost its sub-directories. Never creates
    /// the root itself: a missing root may be an unmounted filesystem.
    pub(super) fn relayout(&self) -> bool {
        // A lookup can fail on a network filesystem's stale view while every directory is
        // still there: then nothing was emptied, and the put is retried without a warning.
        let intact = self.root.dir().is_ok_and(|top| {
            crate::layout::SUBDIRS
                .iter()
                .all(|d| top.stat(d).is_ok_and(|s| s.is_dir()))
        });
        let ok = self.layout.create(&self.root).is_ok();
        if ok && intact {
            log::debug!(
                "xla_pcache: a put into {} found a file or directory missing while the layout is whole; retrying once",
                self.layout.root.display()
            );
        } else if ok {
            if let Ok(entries) = self.root.sub(&ENTRIES) {
                for shard in 0..=255u8 {
                    let _ = entries.mkdir(&Name::shard(shard), 0o777);
                }
            }
            log::warn!(
                "xla_pcache: cache directory {} was emptied or replaced; re-created its layout",
                self.layout.root.display()
            );
        }
        ok
    }
}

/// Closes a file and reports the error close() returns (NFS reports write errors there).
fn close_checked(f: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: fd was just released from a File that owned it; it is closed exactly once.
    let rc = unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What stands at an entry's name when it is no regular file.
pub(super) fn squatter_kind(m: &Stat) -> &'static str {
    match m.file_type() {
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFSOCK => "a socket",
        _ => "a device",
    }
}
