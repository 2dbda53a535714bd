//! What a directory entry is ([`Stat`]), and the name of the user who owns it.

use super::open::check;
use std::ffi::CStr;
use std::io;
use std::os::fd::AsRawFd;

/// What a directory entry is (from `fstatat(AT_SYMLINK_NOFOLLOW)`).
#[derive(Clone, Copy)]
pub struct Stat(pub(super) libc::stat);

impl std::fmt::Debug for Stat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stat({}, {} bytes)", self.kind(), self.len())
    }
}

impl Stat {
    pub fn is_file(&self) -> bool {
        self.0.st_mode & libc::S_IFMT == libc::S_IFREG
    }
    pub fn is_dir(&self) -> bool {
        self.0.st_mode & libc::S_IFMT == libc::S_IFDIR
    }
    /// The file's type bits (`S_IFMT` of its mode: `S_IFDIR`, `S_IFIFO`, `S_IFLNK`, ...).
    pub fn file_type(&self) -> libc::mode_t {
        self.0.st_mode & libc::S_IFMT
    }
    pub fn len(&self) -> u64 {
        self.0.st_size.max(0) as u64
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn blocks(&self) -> u64 {
        self.0.st_blocks.max(0) as u64
    }
    // The stat field types differ between architectures (st_nlink is u32 on aarch64).
    #[allow(clippy::unnecessary_cast)]
    pub fn ino(&self) -> u64 {
        self.0.st_ino as u64
    }
    #[allow(clippy::unnecessary_cast)]
    pub fn nlink(&self) -> u64 {
        self.0.st_nlink as u64
    }
    pub fn uid(&self) -> u32 {
        self.0.st_uid
    }
    // st_dev's type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    pub fn dev(&self) -> u64 {
        self.0.st_dev as u64
    }
    /// The permission bits and file type (`st_mode`).
    pub fn mode(&self) -> u32 {
        self.0.st_mode
    }
    /// Whether only this process's own user (and root) can change the file's bytes: owned
    /// by the effective user, with no write bit for group or others.
    pub fn writable_only_by_us(&self) -> bool {
        // SAFETY: geteuid cannot fail and touches no memory.
        self.0.st_uid == unsafe { libc::geteuid() }
            && self.0.st_mode & (libc::S_IWGRP | libc::S_IWOTH) == 0
    }
    pub fn mtime_ns(&self) -> u64 {
        (self.0.st_mtime.max(0) as u64) * 1_000_000_000 + self.0.st_mtime_nsec.max(0) as u64
    }
    pub fn ctime_ns(&self) -> u64 {
        (self.0.st_ctime.max(0) as u64) * 1_000_000_000 + self.0.st_ctime_nsec.max(0) as u64
    }
    /// Identity of a file version, to notice a replacement.
    pub fn id(&self) -> (u64, u64, u64, u64) {
        (self.0.st_dev, self.ino(), self.mtime_ns(), self.len())
    }
    /// "a regular file", "a directory", "a FIFO", ... for messages.
    pub fn kind(&self) -> &'static str {
        kind_of(self.0.st_mode)
    }
}

fn kind_of(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "not a regular file",
    }
}

/// `fstat` of an open file.
pub fn fstat(f: &impl AsRawFd) -> io::Result<Stat> {
    // SAFETY: stat is plain data; zeroed is valid, and the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a live stat.
    check(unsafe { libc::fstat(f.as_raw_fd(), &mut st) })?;
    Ok(Stat(st))
}

/// The login name of `uid` ("uid 1234" when it has none), for messages.
pub fn user_name(uid: u32) -> String {
    // SAFETY: passwd is plain data; zeroed is valid.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to live memory of the size passed.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc == 0 && !out.is_null() && !pw.pw_name.is_null() {
        // SAFETY: getpwuid_r filled pw_name with a NUL-terminated string inside buf.
        let name = unsafe { CStr::from_ptr(pw.pw_name) };
        return format!("{} (uid {uid})", name.to_string_lossy());
    }
    format!("uid {uid}")
}
