//! The cache's stored budget, kept in the file CONFIG at the cache root (`xla-pcache config`):
//! a byte budget and an age past which unused entries go. Every process that opens the cache
//! honours them; its own options may only be stricter.
//!
//! The file is a few text lines, a version on the first:
//!
//! ```text
//! xla_pcache-config 1
//! max-size 1073741824
//! max-age-seconds 604800
//! ```
//!
//! Anyone with write access to the directory can put anything there, so reading is as
//! careful as for every other file of the cache: no link followed, no FIFO waited on, a few
//! KiB at most, and a file that is not exactly this shape is not used at all (the caller
//! warns once and goes on as if there were none). What is written is held to the same
//! bounds as what is read (`StoredBudget::check`, `bounds.rs`), so a file this version
//! writes is one it reads.

use crate::bounds::{check_max_age, positive_size};
use crate::dir::{self, Dir, Kind, Name, Rel, Root};
use crate::error::{io_err, StoreError};
use std::io::{self, Write};
use std::time::Duration;

pub const CONFIG_FILE: &str = "CONFIG";
const CONFIG_NAME: Name = Name::fixed(CONFIG_FILE);
const CONFIG_REL: Rel = Rel::fixed(CONFIG_FILE);
const TMP_REL: Rel = Rel::fixed("tmp");
pub const CONFIG_VERSION: u32 = 1;
const CONFIG_TAG: &str = "xla_pcache-config";
/// A few short lines; never read more than this of it.
const MAX_CONFIG_LEN: u64 = 4096;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoredBudget {
    pub max_size: Option<u64>,
    pub max_age: Option<Duration>,
}

impl StoredBudget {
    pub fn is_empty(&self) -> bool {
        self.max_size.is_none() && self.max_age.is_none()
    }

    /// Whether these settings may be stored (`bounds.rs`): a budget of at least one byte, a
    /// max age from one second (the file holds whole seconds) to `MAX_DURATION`. `Invalid`
    /// names the field.
    pub fn check(&self) -> Result<(), StoreError> {
        if let Some(size) = self.max_size {
            positive_size("max_size", size.into())?;
        }
        if let Some(age) = self.max_age {
            check_max_age("max_age", age)?;
        }
        Ok(())
    }

    fn encode(&self) -> String {
        let mut text = format!("{CONFIG_TAG} {CONFIG_VERSION}\n");
        if let Some(m) = self.max_size {
            text.push_str(&format!("max-size {m}\n"));
        }
        if let Some(a) = self.max_age {
            text.push_str(&format!("max-age-seconds {}\n", a.as_secs()));
        }
        text
    }

    /// The version a config file's text names on its first line when it is a later
    /// release's (above `CONFIG_VERSION`), else None.
    fn later_version(bytes: &[u8]) -> Option<u32> {
        let first = bytes.split(|b| *b == b'\n').next()?;
        let mut words = std::str::from_utf8(first).ok()?.split_whitespace();
        match (
            words.next(),
            words.next().map(str::parse::<u32>),
            words.next(),
        ) {
            (Some(CONFIG_TAG), Some(Ok(v)), None) if v > CONFIG_VERSION => Some(v),
            _ => None,
        }
    }

    /// Parses the file's text; `Err` says why it is not used.
    pub fn parse(bytes: &[u8]) -> Result<StoredBudget, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string())?;
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        let mut words = first.split_whitespace();
        match (
            words.next(),
            words.next().map(str::parse::<u32>),
            words.next(),
        ) {
            (Some(CONFIG_TAG), Some(Ok(CONFIG_VERSION)), None) => {}
            (Some(CONFIG_TAG), Some(Ok(v)), None) => {
                return Err(format!(
                    "it is of version {v}; this xla_pcache {} reads version {CONFIG_VERSION}",
                    env!("CARGO_PKG_VERSION")
                ))
            }
            _ => return Err("its first line is not an xla_pcache config header".into()),
        }
        let mut out = StoredBudget::default();
        for line in lines {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
                return Err("a line is not `key value`".into());
            };
            let n: u64 = value
                .parse()
                .map_err(|_| format!("{key} is not a whole number"))?;
            let repeated = match key {
                "max-size" => out.max_size.replace(n).is_some(),
                "max-age-seconds" => out.max_age.replace(Duration::from_secs(n)).is_some(),
                _ => return Err("it holds a key this version does not know".into()),
            };
            // The bounds a writer keeps (`check`): a file out of them was not written by
            // this version, and is not used.
            if repeated || out.check().is_err() {
                return Err(format!("{key} is repeated or out of range"));
            }
        }
        Ok(out)
    }
}

/// Reads CONFIG. `Ok(None)` when there is none; `Err` (with why, for a warning) when there is
/// something there that is not a config file this version reads.
pub fn read(root: &Root) -> Result<Option<StoredBudget>, String> {
    let f = match root.open_file(&CONFIG_REL, libc::O_RDONLY, 0) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("it is a symbolic link (never followed)".into())
        }
        Err(e) => return Err(format!("it cannot be opened: {e}")),
    };
    let st = dir::fstat(&f).map_err(|e| format!("it cannot be examined: {e}"))?;
    if !st.is_file() {
        return Err(format!("it is {}", st.kind()));
    }
    if st.len() > MAX_CONFIG_LEN {
        return Err(format!("it is larger than {MAX_CONFIG_LEN} bytes"));
    }
    let bytes =
        dir::read_capped(&f, MAX_CONFIG_LEN + 1).map_err(|e| format!("it cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_CONFIG_LEN {
        return Err(format!("it is larger than {MAX_CONFIG_LEN} bytes"));
    }
    StoredBudget::parse(&bytes).map(Some)
}

/// The version of the CONFIG there when it is a later release's, which that release reads and
/// this one neither reads nor replaces; else None (none, this version's, or not a config).
pub fn later_version(root: &Root) -> Option<u32> {
    let f = root.open_file(&CONFIG_REL, libc::O_RDONLY, 0).ok()?;
    if !dir::fstat(&f).is_ok_and(|st| st.is_file()) {
        return None;
    }
    let bytes = dir::read_capped(&f, MAX_CONFIG_LEN).ok()?;
    StoredBudget::later_version(&bytes)
}

/// Writes CONFIG: the whole file to a temp file in `tmp/`, then renamed over the old one, so
/// a reader sees the old settings or the new, never a part. Settings with nothing set remove
/// the file. A later release's CONFIG is neither replaced nor removed (`Format`, naming its
/// version): what it holds, this release cannot write back.
pub fn write(root: &Root, settings: &StoredBudget, durable: bool) -> Result<(), StoreError> {
    settings.check()?;
    let path = root.path().join(CONFIG_FILE);
    if let Some(v) = later_version(root) {
        return Err(StoreError::Format(format!(
            "{} is of version {v}, a later release's (this xla_pcache {} writes version \
             {CONFIG_VERSION}): set the budget with that release, or remove the file first",
            path.display(),
            env!("CARGO_PKG_VERSION")
        )));
    }
    let top = root.dir().map_err(|e| io_err("open", root.path(), e))?;
    if settings.is_empty() {
        return match top.unlink(&CONFIG_NAME) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", &path, e)),
        };
    }
    // A directory standing in the file's place is not ours to remove: the rename fails.
    let tmp_dir: Dir = root
        .sub(&TMP_REL)
        .map_err(|e| io_err("open", &root.path().join("tmp"), e))?;
    let tmp = Name::checked(
        Kind::Made,
        &format!("CONFIG.{}", crate::clock::unique_suffix()),
    )
    .map_err(|e| io_err("name", root.path(), e))?;
    let tmp_path = root.path().join("tmp").join(tmp.as_str());
    let res = (|| -> io::Result<()> {
        let mut f =
            tmp_dir.open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o666)?;
        f.write_all(settings.encode().as_bytes())?;
        f.sync_all()?;
        drop(f);
        tmp_dir.rename(&tmp, &top, &CONFIG_NAME)?;
        if durable {
            top.sync()?;
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = tmp_dir.unlink(&tmp);
    }
    res.map_err(|e| io_err("write", &tmp_path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("tmp")).unwrap();
        let r = Root::open(d.path()).unwrap();
        (d, r)
    }

    #[test]
    fn round_trips_and_an_empty_one_removes_the_file() {
        let (d, r) = root();
        assert_eq!(read(&r), Ok(None));
        let s = StoredBudget {
            max_size: Some(1 << 30),
            max_age: Some(Duration::from_secs(3600)),
        };
        write(&r, &s, false).unwrap();
        assert_eq!(read(&r), Ok(Some(s)));
        let only_size = StoredBudget {
            max_size: Some(5),
            max_age: None,
        };
        write(&r, &only_size, false).unwrap();
        assert_eq!(read(&r), Ok(Some(only_size)));
        write(&r, &StoredBudget::default(), false).unwrap();
        assert_eq!(read(&r), Ok(None));
        assert!(!d.path().join(CONFIG_FILE).exists());
        // No temp file left behind.
        assert_eq!(std::fs::read_dir(d.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn malformed_files_are_refused_with_a_reason() {
        for bad in [
            &b""[..],
            b"hello\n",
            b"xla_pcache-config 2\nmax-size 5\n",
            b"xla_pcache-config 1\nmax-size -5\n",
            b"xla_pcache-config 1\nmax-size 0\n",
            b"xla_pcache-config 1\nmax-size 99999999999999999999999\n",
            b"xla_pcache-config 1\nmax-size 5\nmax-size 6\n",
            b"xla_pcache-config 1\nmax-age-seconds 99999999999\n",
            b"xla_pcache-config 1\ncolour blue\n",
            b"xla_pcache-config 1\nmax-size 5 6\n",
            b"xla_pcache-config 1\n\xff\n",
        ] {
            assert!(StoredBudget::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn links_fifos_directories_and_huge_files_are_not_read() {
        let (d, r) = root();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("c");
        std::fs::write(&target, "xla_pcache-config 1\nmax-size 5\n").unwrap();
        let p = d.path().join(CONFIG_FILE);
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert!(read(&r).unwrap_err().contains("symbolic link"));
        std::fs::remove_file(&p).unwrap();
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read(&r).unwrap_err().contains("FIFO"));
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert!(read(&r).unwrap_err().contains("directory"));
        // Writing does not remove a directory someone put there.
        assert!(write(
            &r,
            &StoredBudget {
                max_size: Some(5),
                max_age: None
            },
            false
        )
        .is_err());
        std::fs::remove_dir(&p).unwrap();
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(1 << 40).unwrap();
        assert!(read(&r).unwrap_err().contains("larger"));
    }
}
