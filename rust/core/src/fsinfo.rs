//! What filesystem a path is on, and whether mapping its files is safe.
//!
//! mmap is used only on local filesystems: on NFS and other network filesystems a file
//! replaced or removed by another host can turn a mapped page into SIGBUS, so reads there
//! go through `pread` into memory instead.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsInfo {
    /// Filesystem type name, e.g. "ext4", "nfs", "fuse.sshfs", or "unknown(0x...)".
    pub name: String,
    /// Whether the filesystem is local, so mapping files from it is safe.
    pub local: bool,
}

// Magic numbers from statfs(2); only those that decide something are listed.
const LOCAL_MAGICS: &[(i64, &str)] = &[
    (0xEF53, "ext4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x0102_1994, "tmpfs"),
    (0x794C_7630, "overlay"),
    (0x2FC1_2FC1, "zfs"),
    (0xF2F5_2010, "f2fs"),
    (0x8584_58F6, "ramfs"),
];
const REMOTE_MAGICS: &[(i64, &str)] = &[
    (0x6969, "nfs"),
    (0x6573_5546, "fuse"),
    (0x517B, "smb"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x00C3_6400, "ceph"),
    (0x4750_4653, "gpfs"),
    (0x0BD0_0BD0, "lustre"),
    (0x0102_1997, "9p"),
    (0x5346_414F, "afs"),
];

/// Looks up the filesystem of `path` with statfs, and the exact type name (which tells
/// `fuse.sshfs` from other FUSE filesystems) from /proc/self/mountinfo when available.
pub fn probe(path: &Path) -> FsInfo {
    let magic = statfs_magic(path);
    let by_magic = magic.and_then(|m| {
        LOCAL_MAGICS
            .iter()
            .map(|&(v, n)| (v, n, true))
            .chain(REMOTE_MAGICS.iter().map(|&(v, n)| (v, n, false)))
            .find(|&(v, _, _)| v == m)
    });
    let mount_name = mountinfo_type(path);
    match by_magic {
        Some((_, name, local)) => FsInfo {
            name: mount_name.unwrap_or_else(|| name.to_string()),
            local,
        },
        None => FsInfo {
            name: mount_name
                .unwrap_or_else(|| magic.map_or("unknown".into(), |m| format!("unknown({m:#x})"))),
            local: false,
        },
    }
}

fn statfs_magic(path: &Path) -> Option<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and buf a properly sized statfs struct.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    if rc != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    Some(buf.f_type as i64)
}

/// The fstype column of the mount that holds `path` (longest matching mount point).
fn mountinfo_type(path: &Path) -> Option<String> {
    let canonical = std::fs::canonicalize(path).ok()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in text.lines() {
        // Fields: id parent major:minor root mountpoint options [optional...] - fstype source superopts
        let mut parts = line.split(" - ");
        let (Some(left), Some(right)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let Some(fstype) = right.split(' ').next() else {
            continue;
        };
        let mount_point = unescape_mount(mount_point);
        if canonical.starts_with(&mount_point)
            && best
                .as_ref()
                .is_none_or(|(len, _)| mount_point.len() >= *len)
        {
            best = Some((mount_point.len(), fstype.to_string()));
        }
    }
    best.map(|(_, t)| t)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dir_is_probed() {
        let d = tempfile::tempdir().unwrap();
        let info = probe(d.path());
        assert!(!info.name.is_empty());
    }

    #[test]
    fn proc_is_not_local() {
        // procfs is neither in the local nor the remote list: unknown means no mmap.
        assert!(!probe(Path::new("/proc")).local);
    }

    #[test]
    fn unescapes_spaces() {
        assert_eq!(unescape_mount("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount("/plain"), "/plain");
    }
}
