//! This process's memory map (`/proc/self/maps`): which files it has mapped, to tell a
//! framework's loaded binary from one installed over it since.

use super::{Loaded, StatKey};
use crate::dir;
use std::fs::File;
use std::path::{Path, PathBuf};

/// A file of this process's memory map: its device (as `st_dev`), inode, path, and
/// whether the kernel says it was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub dev: u64,
    pub ino: u64,
    pub path: PathBuf,
    pub deleted: bool,
}

/// The files mapped into this process (`/proc/self/maps`), once each; empty where there
/// is no such file.
pub fn mapped_objects() -> Vec<Mapped> {
    let Ok(f) = File::open("/proc/self/maps") else {
        return Vec::new();
    };
    // Bounded: a process maps at most tens of thousands of regions.
    let Ok(bytes) = dir::read_capped(&f, 64 << 20) else {
        return Vec::new();
    };
    parse_maps(&String::from_utf8_lossy(&bytes))
}

fn parse_maps(text: &str) -> Vec<Mapped> {
    let mut out: Vec<Mapped> = Vec::new();
    for line in text.lines() {
        // address perms offset dev inode path
        let mut cols = line.splitn(6, ' ');
        let (Some(_), Some(_), Some(_), Some(dev), Some(ino), Some(rest)) = (
            cols.next(),
            cols.next(),
            cols.next(),
            cols.next(),
            cols.next(),
            cols.next(),
        ) else {
            continue;
        };
        let path = rest.trim_start();
        if !path.starts_with('/') {
            continue;
        }
        let Ok(ino) = ino.parse::<u64>() else {
            continue;
        };
        let Some((major, minor)) = dev.split_once(':') else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (
            u64::from_str_radix(major, 16),
            u64::from_str_radix(minor, 16),
        ) else {
            continue;
        };
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (path, false),
        };
        let m = Mapped {
            dev: makedev(major, minor),
            ino,
            path: PathBuf::from(path),
            deleted,
        };
        if !out.contains(&m) {
            out.push(m);
        }
    }
    out
}

/// glibc's `makedev`: `st_dev` from a major and minor number.
fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xffff_f000) << 32)
        | ((major & 0x0000_0fff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0x0000_00ff)
}

/// Whether the file at `path` (of stat `key`) is the one mapped under its real path.
pub(super) fn loaded(path: &Path, key: &StatKey, mapped: &[Mapped]) -> Loaded {
    // The map names files by their real path: resolved only for a name it holds.
    let name = path.file_name();
    if !mapped.iter().any(|m| m.path.file_name() == name) {
        return Loaded::No;
    }
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut found = Loaded::No;
    for m in mapped.iter().filter(|m| m.path == real) {
        if m.deleted || (m.dev, m.ino) != (key[0], key[1]) {
            return Loaded::Replaced;
        }
        found = Loaded::Same;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build_id::BuildIdRecord;

    #[test]
    fn the_map_tells_a_loaded_file_from_one_replaced_since() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("lib.so");
        std::fs::write(&p, vec![1u8; 8192]).unwrap();
        let f = File::open(&p).unwrap();
        // SAFETY: a private read-only mapping of a file this test owns and does not change.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let rec = BuildIdRecord::at(None);
        let ident = |rec: &BuildIdRecord| {
            rec.identify(std::slice::from_ref(&p), &mapped_objects())
                .remove(0)
                .unwrap()
                .loaded
        };
        assert_eq!(ident(&rec), Loaded::Same);
        // Installed anew over it (a new inode at the path): the mapped one is not this.
        let new = t.path().join("new.so");
        std::fs::write(&new, vec![2u8; 8192]).unwrap();
        std::fs::rename(&new, &p).unwrap();
        assert_eq!(ident(&rec), Loaded::Replaced);
        drop(map);
        assert_eq!(ident(&rec), Loaded::No);
        let text = "7f00-7f01 r-xp 00000000 fd:01 1234 /usr/lib/libx.so\n\
                    7f01-7f02 r--p 00001000 fd:01 1234 /usr/lib/libx.so\n\
                    7f02-7f03 rw-p 00000000 00:00 0 \n\
                    7f03-7f04 r--p 00000000 103:02 99 /a b/lib y.so (deleted)\n\
                    garbage\n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].dev, makedev(0xfd, 1));
        assert_eq!(
            (m[1].path.to_str(), m[1].deleted),
            (Some("/a b/lib y.so"), true)
        );
        assert_eq!(m[1].dev, makedev(0x103, 2));
    }
}
