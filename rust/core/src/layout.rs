//! Where things live under the cache root, and the FORMAT file that names the layout version.

use crate::dir::{Dir, Kind, Name, Rel, Root};
use crate::error::{io_err, StoreError};
use crate::hash::name_hex;
use std::io::{self, Write};
use std::path::PathBuf;

/// On-disk layout version. Bump it for any change an older reader would misread.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_FILE: Name = Name::fixed("FORMAT");
const FORMAT_TAG: &str = "xla_pcache-format";
/// FORMAT is a few short lines; never read more than this of it.
const MAX_FORMAT_LEN: u64 = 4096;
pub const SUBDIRS: [Name; 6] = [
    Name::fixed("entries"),
    Name::fixed("journal"),
    Name::fixed("index"),
    Name::fixed("locks"),
    Name::fixed("tmp"),
    Name::fixed("trash"),
];
/// The directories beneath the root, as paths the root opens.
pub const ENTRIES: Rel = Rel::fixed("entries");
pub const JOURNAL: Rel = Rel::fixed("journal");
pub const INDEX: Rel = Rel::fixed("index");
pub const LOCKS: Rel = Rel::fixed("locks");
pub const TMP: Rel = Rel::fixed("tmp");
pub const TRASH: Rel = Rel::fixed("trash");

#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }
    pub fn format_file(&self) -> PathBuf {
        self.root.join(FORMAT_FILE.as_str())
    }
    pub fn entries(&self) -> PathBuf {
        self.root.join("entries")
    }
    /// Shard directory number `shard` (00..ff).
    pub fn shard(&self, shard: u8) -> PathBuf {
        self.entries().join(format!("{shard:02x}"))
    }
    pub fn shard_dir(&self, name: u128) -> PathBuf {
        self.shard((name >> 120) as u8)
    }
    pub fn entry_path(&self, name: u128) -> PathBuf {
        self.shard_dir(name).join(name_hex(name))
    }
    pub fn journal_dir(&self) -> PathBuf {
        self.root.join("journal")
    }
    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }
    pub fn trash(&self) -> PathBuf {
        self.root.join("trash")
    }

    /// `entries/xx`, relative to the root.
    pub fn shard_rel(name: u128) -> Rel {
        Rel::shard_of(name)
    }
    /// `entries/xx/<32 hex>`, relative to the root.
    pub fn entry_rel(name: u128) -> Rel {
        Rel::entry(name)
    }

    /// Reads FORMAT. `Ok(None)` when there is none (not a cache, or not yet initialised).
    /// Opened without following a link or waiting on a FIFO, and read up to a few KiB: a
    /// FORMAT that is anything but a small regular file is refused, saying what it is.
    pub fn read_format(&self, root: &Root) -> Result<Option<u32>, StoreError> {
        let path = self.format_file();
        let f = match root.open_file(&Rel::of(&FORMAT_FILE), libc::O_RDONLY, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(StoreError::Format(format!(
                    "{} is a symbolic link, not an xla_pcache format file (links in a cache \
                     directory are never followed)",
                    path.display()
                )))
            }
            Err(e) => return Err(io_err("read", &path, e)),
        };
        let st = crate::dir::fstat(&f).map_err(|e| io_err("stat", &path, e))?;
        if !st.is_file() {
            return Err(StoreError::Format(format!(
                "{} is {}, not an xla_pcache format file",
                path.display(),
                st.kind()
            )));
        }
        let bytes =
            crate::dir::read_capped(&f, MAX_FORMAT_LEN).map_err(|e| io_err("read", &path, e))?;
        let text = String::from_utf8_lossy(&bytes);
        let first = text.lines().next().unwrap_or("");
        let mut words = first.split_whitespace();
        match (words.next(), words.next().map(str::parse::<u32>)) {
            (Some(FORMAT_TAG), Some(Ok(v))) if v == FORMAT_VERSION => Ok(Some(v)),
            (Some(FORMAT_TAG), Some(Ok(v))) => Err(StoreError::Format(format!(
                "{} holds a cache of on-disk format {v}; this xla_pcache {} reads format {FORMAT_VERSION} only{}",
                self.root.display(),
                env!("CARGO_PKG_VERSION"),
                if v > FORMAT_VERSION { " (upgrade xla_pcache, or use another directory)" } else { "" }
            ))),
            _ => Err(StoreError::Format(format!(
                "{} is not an xla_pcache format file (first line {:?})",
                path.display(),
                first.chars().take(80).collect::<String>()
            ))),
        }
    }

    /// Creates the sub-directories and FORMAT under the open root. Safe to race with other
    /// processes: FORMAT is written to a temp file and linked into place, so every creator
    /// agrees.
    pub fn create(&self, root: &Root) -> Result<(), StoreError> {
        let top = root.dir().map_err(|e| io_err("open", &self.root, e))?;
        for d in &SUBDIRS {
            let p = self.root.join(d.as_str());
            match top.mkdir(d, 0o777) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !top.stat(d).is_ok_and(|s| s.is_dir()) {
                        return Err(StoreError::Format(format!(
                            "{} exists but is not a directory (symbolic links are not followed)",
                            p.display()
                        )));
                    }
                }
                Err(e) => return Err(io_err("create directory", &p, e)),
            }
        }
        if self.read_format(root)?.is_some() {
            return Ok(());
        }
        let tmp_dir = root.sub(&TMP).map_err(|e| io_err("open", &self.tmp(), e))?;
        let tmp = Name::checked(
            Kind::Made,
            &format!("FORMAT.{}", crate::clock::unique_suffix()),
        )
        .map_err(|e| io_err("create", &self.tmp(), e))?;
        let text = format!(
            "{FORMAT_TAG} {FORMAT_VERSION}\ncreated-by xla_pcache {}\ncreated-unix {}\n",
            env!("CARGO_PKG_VERSION"),
            crate::clock::unix_ns() / 1_000_000_000
        );
        let tmp_path = self.tmp().join(tmp.as_str());
        let mut f = tmp_dir
            .open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o666)
            .map_err(|e| io_err("create", &tmp_path, e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| io_err("write", &tmp_path, e))?;
        drop(f);
        let linked = crate::publish::publish_no_replace(&tmp_dir, &tmp, &top, &FORMAT_FILE);
        let _ = tmp_dir.unlink(&tmp);
        linked.map_err(|e| io_err("publish", &self.format_file(), e))?;
        // Whoever won, the file must now be ours to read.
        self.read_format(root)?;
        Ok(())
    }
}

/// Prefix of the marker directories `freshen_dir` makes (and removes at once).
pub const FRESHEN_PREFIX: &str = ".fresh.";

/// Makes a network filesystem client's view of `dir` fresh: creating and removing a
/// directory inside it through this mount drops the client's cached listing, and the next
/// listing brings the sizes of the files in it from the server (sshfs, whose stat and
/// open+fstat otherwise serve cached sizes for 20 s; NFS revalidates a directory it
/// changed). Two metadata operations; false if `dir` cannot be written.
pub fn freshen_dir(dir: &Dir) -> bool {
    let Some(marker) = Name::new(
        Kind::Made,
        &format!("{FRESHEN_PREFIX}{}", crate::clock::unique_suffix()),
    ) else {
        return false;
    };
    if dir.mkdir(&marker, 0o777).is_err() {
        return false;
    }
    dir.rmdir(&marker).is_ok()
}
