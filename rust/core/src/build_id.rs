//! The identity of an installed binary (a framework's shared object: jaxlib's, torch_xla's,
//! a PJRT plugin): its GNU build-id note when it has one, else the BLAKE3 of its content.
//!
//! A build-id is what the linker wrote to name that build: reading it costs a few reads of
//! the ELF headers. A file without one (jaxlib's wheel objects have none) is hashed whole,
//! on every core: `libjax_common.so` is 350 MB. So that this is paid once per installed
//! file, not once per process, each identity is remembered in the user's own record,
//! `$XDG_CACHE_HOME/xla_pcache-builds/record`, under the file's (device, inode, size,
//! mtime, ctime): a later process pays one `stat` per file. Size and mtime alone would not
//! do (a reinstall from another channel may keep both); the ctime changes with every
//! write, rename into place or `utimensat`, and no user can set it back. Where the home
//! cannot be written, the record is kept in a directory of this user's own on this host
//! (`record_place`); where none can be, the caller learns why (`RecordUse::unkept`) and
//! says so, since every process then pays the hash.
//!
//! The record is kept as the verification record is (`verified.rs`, whose checks it
//! shares): a file of this user's, mode 0600, in a directory of this user's that no one
//! else may write, opened with no link followed and no FIFO waited on, bounded, and
//! replaced whole (temp file, rename). A record that fails those checks is never read nor
//! written (its identities are computed as if it were absent: one warning, one count); one
//! of ours that is garbled (truncated, huge, a bad checksum) is not read and is rewritten
//! by this process. What it holds is only ever a shortcut for a digest this user's own
//! processes computed.
//!
//! Layout of `record` (little-endian): 8 bytes of magic, the version (u32), the number of
//! slots (u32), the slots (`SLOT` bytes each: device, inode, size, mtime ns, ctime ns as
//! u64, the kind (u8), the id's length (u8), 6 bytes of padding, the id in 64 bytes), then
//! the xxh3-64 of everything before it. At most `MAX_SLOTS`; the oldest go first.

use crate::dir::{self, Dir, Name};
use crate::owndir;
use crate::record_place::{Found, Place};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const MAGIC: &[u8; 8] = b"xpcbrec\0";
const VERSION: u32 = 1;
const HEAD: usize = 16;
const ID_MAX: usize = 64;
const SLOT: usize = 5 * 8 + 8 + ID_MAX;
/// Files remembered: a few dozen per installed framework, a few frameworks per user.
const MAX_SLOTS: usize = 1024;
const MAX_LEN: u64 = (HEAD + SLOT * MAX_SLOTS + 8) as u64;
const DIR_NAME: &str = "xla_pcache-builds";
const FILE: Name = Name::fixed("record");
/// Hashed in pieces of this size, each on every core.
const PIECE: usize = 16 << 20;
/// ELF headers read to find the build-id note: more program headers or a larger note
/// segment than this is no ordinary shared object, and its content is hashed instead.
const MAX_PHDRS_BYTES: u64 = 64 << 10;
const MAX_NOTES_BYTES: u64 = 64 << 10;
const PT_NOTE: u32 = 4;
const NT_GNU_BUILD_ID: u32 = 3;

/// What an identity is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// The GNU build-id note the linker wrote.
    BuildId,
    /// The BLAKE3 of the whole file.
    Blake3,
}

impl IdKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IdKind::BuildId => "build-id",
            IdKind::Blake3 => "blake3",
        }
    }

    fn code(self) -> u8 {
        match self {
            IdKind::BuildId => 1,
            IdKind::Blake3 => 2,
        }
    }

    fn from_code(c: u8) -> Option<IdKind> {
        match c {
            1 => Some(IdKind::BuildId),
            2 => Some(IdKind::Blake3),
            _ => None,
        }
    }
}

/// Whether the file at a path is the one this process has mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// Not mapped in this process.
    No,
    /// Mapped, and the same inode as the file at the path.
    Same,
    /// Mapped, but the path now names another file (or the mapped one was deleted): this
    /// process runs a binary that is no longer installed, whose identity is unknown.
    Replaced,
}

/// One file's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileId {
    pub kind: IdKind,
    pub id: Vec<u8>,
    /// When the file was last changed or moved into place (its ctime, ns): its install.
    pub changed_ns: u64,
    pub size: u64,
    /// Computed now, not read from the record.
    pub computed: bool,
    pub loaded: Loaded,
}

impl FileId {
    pub fn hex(&self) -> String {
        self.id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// (device, inode, size, mtime ns, ctime ns): what a file must still have for a
/// remembered identity to hold.
type StatKey = [u64; 5];

#[derive(Clone)]
struct Slot {
    key: StatKey,
    kind: IdKind,
    id: Vec<u8>,
}

impl Slot {
    /// The identity this slot remembers, for the file it was found for (`key`, its stat).
    fn remembered(&self, key: &StatKey, loaded: Loaded) -> FileId {
        FileId {
            kind: self.kind,
            id: self.id.clone(),
            changed_ns: key[4],
            size: key[2],
            computed: false,
            loaded,
        }
    }
}

/// Where the record lives unless told otherwise: `$XDG_CACHE_HOME/xla_pcache-builds`, else
/// on this host where that cannot be written (`record_place`).
pub fn default_place() -> Place {
    Place::default_for(DIR_NAME)
}

/// The record of one place; an empty place: no record (every file is read as if new).
pub struct BuildIdRecord {
    place: Place,
    /// What the first use found; None until then.
    state: Mutex<Option<State>>,
    problems: AtomicU64,
}

struct State {
    slots: Vec<Slot>,
    /// The directory the record was read from, when there was one.
    from: Option<Found>,
    /// Candidates refused as someone else's: never read nor written again.
    refused: Vec<PathBuf>,
    /// How this process used the record (`BuildIdRecord::used`).
    used: RecordUse,
}

/// Where the record is, as this process used it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordUse {
    /// The directory it was read from or written to; None: none.
    pub dir: Option<PathBuf>,
    /// The candidates before it that could not be used, each with why.
    pub skipped: Vec<String>,
    /// Why identities this process computes cannot be remembered anywhere (every later
    /// process computes them again); None when they can be.
    pub unkept: Option<String>,
}

impl std::fmt::Debug for BuildIdRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BuildIdRecord({:?})", self.place.candidates())
    }
}

/// Why a record was not read.
enum Refused {
    /// Someone else may control it: never read nor written.
    Hostile(String),
    /// Ours, but not a record: not read; rewritten.
    Garbled(String),
}

impl BuildIdRecord {
    /// The record in `dir` and nowhere else; None: no record.
    pub fn at(dir: Option<PathBuf>) -> BuildIdRecord {
        BuildIdRecord::in_place(dir.map_or_else(Place::nowhere, Place::only))
    }

    /// The record in the first usable directory of `place`.
    pub fn in_place(place: Place) -> BuildIdRecord {
        BuildIdRecord {
            place,
            state: Mutex::new(None),
            problems: AtomicU64::new(0),
        }
    }

    pub fn place(&self) -> &Place {
        &self.place
    }

    /// How many times the record was refused (hostile or garbled) since the last call.
    pub fn take_problems(&self) -> u64 {
        self.problems.swap(0, Ordering::Relaxed)
    }

    /// Where the record was read from or written to, and why identities computed were not
    /// kept, if they were not.
    pub fn used(&self) -> RecordUse {
        let guard = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        guard.as_ref().map(|s| s.used.clone()).unwrap_or_default()
    }

    fn refused(&self, at: &Path, why: &str, what: &str) {
        self.problems.fetch_add(1, Ordering::Relaxed);
        log::warn!(
            "xla_pcache: the record of binaries' identities in {} is not used: {why}; {what}",
            at.display()
        );
    }

    /// What follows a refusal of the candidate `at`: the next tried, or none.
    fn after_refusal(&self, at: &Path) -> String {
        let mut rest = self.place.candidates().iter().skip_while(|c| *c != at);
        match rest.nth(1) {
            Some(next) => format!("the next place is tried ({})", next.display()),
            None => "identities are computed as if it were absent".to_string(),
        }
    }

    /// The identity of each file in `paths` (an error for a file that cannot be read), from
    /// the record where it holds the file's current (device, inode, size, mtime, ctime),
    /// else computed and then remembered (the record is rewritten once, whatever the
    /// number of new files). `mapped` is this process's mapped objects (`mapped_objects`).
    pub fn identify(&self, paths: &[PathBuf], mapped: &[Mapped]) -> Vec<io::Result<FileId>> {
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let state = guard.get_or_insert_with(|| self.load());
        let mut added = false;
        let out = paths
            .iter()
            .map(|p| {
                let (id, new) = identify_one(p, &state.slots, mapped)?;
                if let Some(slot) = new {
                    state.slots.retain(|s| s.key[..2] != slot.key[..2]);
                    state.slots.push(slot);
                    added = true;
                }
                Ok(id)
            })
            .collect();
        if added {
            if state.slots.len() > MAX_SLOTS {
                let extra = state.slots.len() - MAX_SLOTS;
                state.slots.drain(..extra);
            }
            self.save(state);
        }
        out
    }

    /// What the record holds: its slots (empty when there is none, or it is refused:
    /// counted, warned) and its directory: the first of the place this user can write
    /// (`Place::open`; a directory or record someone else may control is refused, and the
    /// next tried). Where that one has no record yet, a read-only one of ours before it (an
    /// image's) is read instead.
    fn load(&self) -> State {
        let mut state = State {
            slots: Vec::new(),
            from: None,
            refused: Vec::new(),
            used: RecordUse::default(),
        };
        loop {
            let seen = self.place.open(&state.refused);
            state.used.skipped = seen.skipped;
            for (at, why) in seen.refused {
                self.refused(&at, &why, &self.after_refusal(&at));
                state.refused.push(at);
            }
            let Some(found) = seen.found else {
                if let Some(image) = seen.read_only {
                    state.slots = self.read_image(&image);
                    state.used.dir = Some(image.path);
                }
                return state;
            };
            match read(&found.dir) {
                Ok(slots) if slots.is_empty() && !has_record(&found.dir) => {
                    if let Some(image) = seen.read_only {
                        state.slots = self.read_image(&image);
                    }
                }
                Ok(slots) => state.slots = slots,
                Err(Refused::Hostile(why)) => {
                    // Another's record in a directory of ours: the directory is left alone.
                    self.refused(&found.path, &why, &self.after_refusal(&found.path));
                    state.refused.push(found.path);
                    continue;
                }
                Err(Refused::Garbled(why)) => self.refused(&found.path, &why, "it is rebuilt"),
            }
            state.used.dir = Some(found.path.clone());
            state.from = Some(found);
            return state;
        }
    }

    /// The slots of a read-only record of ours (an image's); none when it cannot be used.
    fn read_image(&self, image: &Found) -> Vec<Slot> {
        match read(&image.dir) {
            Ok(slots) => slots,
            Err(Refused::Hostile(why) | Refused::Garbled(why)) => {
                self.refused(&image.path, &why, "it is not read");
                Vec::new()
            }
        }
    }

    /// Replaces the record with the state's slots, in its directory. Where there is none,
    /// or writing fails, the state says why (`RecordUse::unkept`).
    fn save(&self, state: &mut State) {
        let Some(found) = &state.from else {
            if state.used.unkept.is_none() {
                state.used.unkept = Some(nowhere(&self.place, &state.used.skipped));
            }
            return;
        };
        // A file planted at the name since it was read is hostile: left alone.
        let written = match check_file(&found.dir) {
            Err(Refused::Hostile(why)) => {
                self.refused(
                    &found.path,
                    &why,
                    "identities are computed as if it were absent",
                );
                Err(why)
            }
            _ => write(&found.dir, &state.slots)
                .map_err(|e| format!("{}: writing the record failed ({e})", found.path.display())),
        };
        if let Err(why) = written {
            log::debug!("xla_pcache: {why}");
            state.used.dir = None;
            state.used.unkept = Some(why);
            state.from = None;
        }
    }
}

/// Whether `dir` holds something at the record's name.
fn has_record(dir: &Dir) -> bool {
    dir.stat(&FILE).is_ok()
}

/// Why a record is kept nowhere: each candidate's reason.
fn nowhere(place: &Place, why: &[String]) -> String {
    if place.candidates().is_empty() {
        return "no directory to keep it in".to_string();
    }
    if why.is_empty() {
        return "every directory it may be kept in was refused".to_string();
    }
    why.join("; ")
}

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

/// One file: its identity, and a slot to remember when it was computed now.
fn identify_one(
    path: &Path,
    slots: &[Slot],
    mapped: &[Mapped],
) -> io::Result<(FileId, Option<Slot>)> {
    // The install's own path, links and all: a framework found through a link is the
    // user's setup. A remembered file costs this one `stat`.
    let known = std::fs::metadata(path).ok().and_then(|m| {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| (s.max(0) as u64) * 1_000_000_000 + n.max(0) as u64;
        let key: StatKey = [
            m.dev(),
            m.ino(),
            m.len(),
            ns(m.mtime(), m.mtime_nsec()),
            ns(m.ctime(), m.ctime_nsec()),
        ];
        let slot = slots.iter().find(|s| s.key == key && m.is_file())?;
        Some((key, slot))
    });
    if let Some((key, s)) = known {
        return Ok((s.remembered(&key, loaded(path, &key, mapped)), None));
    }
    // Not blocking on a FIFO; a non-file is an error.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(path)?;
    let st = dir::fstat(&f)?;
    if !st.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is {}, not a regular file", path.display(), st.kind()),
        ));
    }
    let key: StatKey = [st.dev(), st.ino(), st.len(), st.mtime_ns(), st.ctime_ns()];
    let loaded = loaded(path, &key, mapped);
    if let Some(s) = slots.iter().find(|s| s.key == key) {
        return Ok((s.remembered(&key, loaded), None));
    }
    let (kind, id) = match build_id(&f) {
        Some(id) => (IdKind::BuildId, id),
        None => (IdKind::Blake3, content_digest(&f, key[2])?.to_vec()),
    };
    // Changed while it was read: the identity is this process's, not remembered.
    let after = dir::fstat(&f)?;
    let same = [
        after.dev(),
        after.ino(),
        after.len(),
        after.mtime_ns(),
        after.ctime_ns(),
    ] == key;
    let slot = same.then(|| Slot {
        key,
        kind,
        id: id.clone(),
    });
    let id = FileId {
        kind,
        id,
        changed_ns: key[4],
        size: key[2],
        computed: true,
        loaded,
    };
    Ok((id, slot))
}

/// Whether the file at `path` (of stat `key`) is the one mapped under its real path.
fn loaded(path: &Path, key: &StatKey, mapped: &[Mapped]) -> Loaded {
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

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

/// The BLAKE3 of `len` bytes of `f`, a piece at a time, each piece on every core.
fn content_digest(f: &File, len: u64) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; PIECE.min(len as usize).max(1)];
    let mut at = 0u64;
    loop {
        let n = f.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        h.update_rayon(&buf[..n]);
        at += n as u64;
    }
    Ok(*h.finalize().as_bytes())
}

/// The GNU build-id of an ELF file, from its note segments; None when it has none, or
/// is no ELF file this reads (its content is then hashed).
fn build_id(f: &File) -> Option<Vec<u8>> {
    let mut ident = [0u8; 64];
    f.read_exact_at(&mut ident, 0).ok()?;
    if &ident[..4] != b"\x7fELF" {
        return None;
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return None,
    };
    let rd = Reader { little };
    let (phoff, phentsize, phnum) = if wide {
        (rd.u64(&ident, 32), rd.u16(&ident, 54), rd.u16(&ident, 56))
    } else {
        (
            u64::from(rd.u32(&ident, 28)),
            rd.u16(&ident, 42),
            rd.u16(&ident, 44),
        )
    };
    let entsize = u64::from(phentsize);
    let need = if wide { 56 } else { 32 };
    let total = entsize * u64::from(phnum);
    if entsize < need || total > MAX_PHDRS_BYTES {
        return None;
    }
    let mut phdrs = vec![0u8; total as usize];
    f.read_exact_at(&mut phdrs, phoff).ok()?;
    for ph in phdrs.chunks_exact(entsize as usize) {
        if rd.u32(ph, 0) != PT_NOTE {
            continue;
        }
        let (offset, size, align) = if wide {
            (rd.u64(ph, 8), rd.u64(ph, 32), rd.u64(ph, 48))
        } else {
            (
                u64::from(rd.u32(ph, 4)),
                u64::from(rd.u32(ph, 16)),
                u64::from(rd.u32(ph, 28)),
            )
        };
        if size > MAX_NOTES_BYTES {
            continue;
        }
        let mut notes = vec![0u8; size as usize];
        if f.read_exact_at(&mut notes, offset).is_err() {
            continue;
        }
        if let Some(id) = find_build_id(&notes, rd, if align == 8 { 8 } else { 4 }) {
            return Some(id);
        }
    }
    None
}

fn find_build_id(notes: &[u8], rd: Reader, align: usize) -> Option<Vec<u8>> {
    let pad = |n: usize| n.checked_add(align - 1).map(|v| v / align * align);
    let mut at = 0usize;
    while at.checked_add(12)? <= notes.len() {
        let namesz = rd.u32(notes, at) as usize;
        let descsz = rd.u32(notes, at + 4) as usize;
        let kind = rd.u32(notes, at + 8);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(pad(namesz)?)?;
        let end = desc_at.checked_add(pad(descsz)?)?;
        if desc_at.checked_add(descsz)? > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID
            && notes.get(name_at..name_at + namesz) == Some(b"GNU\0")
            && (1..=ID_MAX).contains(&descsz)
        {
            return Some(notes[desc_at..desc_at + descsz].to_vec());
        }
        at = end;
    }
    None
}

#[derive(Clone, Copy)]
struct Reader {
    little: bool,
}

impl Reader {
    fn bytes<const N: usize>(self, b: &[u8], at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(s) = b.get(at..at + N) {
            out.copy_from_slice(s);
        }
        if !self.little {
            out.reverse();
        }
        out
    }
    fn u16(self, b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(self.bytes(b, at))
    }
    fn u32(self, b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(self.bytes(b, at))
    }
    fn u64(self, b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(self.bytes(b, at))
    }
}

/// Whether the record at the name may be read or replaced: Ok when absent or ours.
fn check_file(dir: &Dir) -> Result<(), Refused> {
    match open_record(dir) {
        Ok(_) => Ok(()),
        Err(Refused::Garbled(_)) => Ok(()),
        Err(h) => Err(h),
    }
}

/// The record's file, checked to be a regular file of ours that only we may write; None
/// when there is none.
fn open_record(dir: &Dir) -> Result<Option<(File, u64)>, Refused> {
    let opened = dir.open_file(&FILE, libc::O_RDONLY, 0);
    Ok(owndir::record_file(dir, &FILE, opened)
        .map_err(Refused::Hostile)?
        .map(|(f, st)| (f, st.len())))
}

/// The slots of the record in `dir`: empty when there is none.
fn read(dir: &Dir) -> Result<Vec<Slot>, Refused> {
    let Some((f, len)) = open_record(dir)? else {
        return Ok(Vec::new());
    };
    let garbled = |why: &str| Refused::Garbled(format!("{} {why}", dir.display(FILE.as_str())));
    if len > MAX_LEN {
        return Err(garbled(&format!(
            "is {len} bytes, more than a record holds"
        )));
    }
    let bytes = dir::read_capped(&f, MAX_LEN).map_err(|e| garbled(&e.to_string()))?;
    decode(&bytes).map_err(garbled)
}

fn decode(b: &[u8]) -> Result<Vec<Slot>, &'static str> {
    if b.len() < HEAD + 8 {
        return Err("is truncated");
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if crate::hash::checksum(body).to_le_bytes() != sum {
        return Err("does not match its checksum");
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if &b[..8] != MAGIC || u32_at(8) != VERSION {
        return Err("is not a record of this version");
    }
    let n = u32_at(12) as usize;
    if n > MAX_SLOTS || body.len() != HEAD + n * SLOT {
        return Err("is truncated");
    }
    let mut out = Vec::with_capacity(n);
    for s in body[HEAD..].chunks_exact(SLOT) {
        let mut key = [0u64; 5];
        for (i, k) in key.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&s[8 * i..8 * i + 8]);
            *k = u64::from_le_bytes(w);
        }
        let kind = IdKind::from_code(s[40]).ok_or("holds an unknown kind of identity")?;
        let len = s[41] as usize;
        if len == 0 || len > ID_MAX || (kind == IdKind::Blake3 && len != 32) {
            return Err("holds an identity of a bad length");
        }
        out.push(Slot {
            key,
            kind,
            id: s[48..48 + len].to_vec(),
        });
    }
    Ok(out)
}

fn encode(slots: &[Slot]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + SLOT * slots.len() + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
    for s in slots {
        for k in s.key {
            out.extend_from_slice(&k.to_le_bytes());
        }
        out.push(s.kind.code());
        out.push(s.id.len() as u8);
        out.extend_from_slice(&[0u8; 6]);
        let mut id = [0u8; ID_MAX];
        id[..s.id.len()].copy_from_slice(&s.id);
        out.extend_from_slice(&id);
    }
    let sum = crate::hash::checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Writes the record beside the old one and renames it over: readers see one or the
/// other, whole.
fn write(dir: &Dir, slots: &[Slot]) -> io::Result<()> {
    owndir::replace_record(dir, &FILE, &encode(slots))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owndir::spoiled;
    use std::os::unix::fs::PermissionsExt;

    /// A little-endian ELF64 file with a PT_NOTE segment holding `notes`, then `tail`.
    fn elf(notes: &[u8], tail: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let ph = 64;
        b[ph..ph + 4].copy_from_slice(&PT_NOTE.to_le_bytes());
        b[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes()); // p_offset
        b[ph + 32..ph + 40].copy_from_slice(&(notes.len() as u64).to_le_bytes()); // p_filesz
        b[ph + 48..ph + 56].copy_from_slice(&4u64.to_le_bytes()); // p_align
        b.extend_from_slice(notes);
        b.extend_from_slice(tail);
        b
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend_from_slice(&(name.len() as u32).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(name);
        n.resize(n.len().div_ceil(4) * 4, 0);
        n.extend_from_slice(desc);
        n.resize(n.len().div_ceil(4) * 4, 0);
        n
    }

    fn one(rec: &BuildIdRecord, p: &Path) -> FileId {
        let mut out = rec.identify(&[p.to_path_buf()], &[]);
        out.remove(0).unwrap()
    }

    #[test]
    fn a_build_id_note_is_the_identity_and_other_bytes_are_not() {
        let t = tempfile::tempdir().unwrap();
        let id = [7u8; 20];
        let notes = [note(b"GNU\0", 5, &[1, 2, 3, 4]), note(b"GNU\0", 3, &id)].concat();
        let p = t.path().join("a.so");
        std::fs::write(&p, elf(&notes, b"code")).unwrap();
        let rec = BuildIdRecord::at(None);
        let a = one(&rec, &p);
        assert_eq!((a.kind, a.id.as_slice()), (IdKind::BuildId, &id[..]));
        // Other bytes, same note: the same build, as the linker named it.
        std::fs::write(&p, elf(&notes, b"other code, appended bytes")).unwrap();
        assert_eq!(one(&rec, &p).id, id.to_vec());
        // No note, a truncated one, a note of another owner, no ELF: the content's BLAKE3.
        let cases: Vec<Vec<u8>> = vec![
            elf(&note(b"GNU\0", 1, &[0; 16]), b"x"),
            elf(&note(b"Go\0\0", 3, &id), b"x"),
            elf(&notes[..notes.len() - 4], b""),
            b"\x7fELF short".to_vec(),
            b"not an ELF file at all".to_vec(),
            Vec::new(),
        ];
        for bytes in cases {
            std::fs::write(&p, &bytes).unwrap();
            let got = one(&rec, &p);
            assert_eq!(got.kind, IdKind::Blake3, "{bytes:?}");
            assert_eq!(got.id, blake3::hash(&bytes).as_bytes().to_vec());
        }
    }

    #[test]
    fn a_real_shared_object_is_read() {
        // The test binary's own libc: whatever it holds, a result and no panic.
        let libc_path = mapped_objects()
            .into_iter()
            .find(|m| {
                m.path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
            })
            .map(|m| m.path);
        if let Some(p) = libc_path {
            let got = BuildIdRecord::at(None)
                .identify(&[p], &mapped_objects())
                .remove(0)
                .unwrap();
            assert!(!got.id.is_empty());
            assert_eq!(got.loaded, Loaded::Same);
        }
    }

    #[test]
    fn a_home_that_cannot_be_written_keeps_the_record_in_the_next_place() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("home-file");
        std::fs::write(&file, b"").unwrap();
        let fallback = t.path().join("tmp/xla_pcache-builds-1");
        let place = || Place::of(vec![file.join(".cache/builds"), fallback.clone()]);
        let p = t.path().join("lib.so");
        std::fs::write(&p, vec![7u8; 5000]).unwrap();
        let rec = BuildIdRecord::in_place(place());
        assert!(one(&rec, &p).computed);
        let used = rec.used();
        assert_eq!(used.dir.as_deref(), Some(fallback.as_path()));
        assert!(used.unkept.is_none(), "{used:?}");
        assert!(used.skipped[0].contains("cannot be made"), "{used:?}");
        // A later process reads it there: nothing computed.
        let later = BuildIdRecord::in_place(place());
        assert!(!one(&later, &p).computed);
        assert_eq!(later.used().dir.as_deref(), Some(fallback.as_path()));
        assert_eq!(later.take_problems(), 0);
    }

    #[test]
    fn nowhere_to_keep_it_is_said_and_every_process_computes() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let place = || Place::of(vec![file.join("a"), file.join("b")]);
        let p = t.path().join("lib.so");
        std::fs::write(&p, vec![7u8; 5000]).unwrap();
        for _ in 0..2 {
            let rec = BuildIdRecord::in_place(place());
            assert!(one(&rec, &p).computed);
            let used = rec.used();
            assert!(used.dir.is_none(), "{used:?}");
            let why = used.unkept.unwrap();
            assert!(why.contains("file/a") && why.contains("file/b"), "{why}");
        }
        // Nothing needed keeping (no file): nothing to say.
        let rec = BuildIdRecord::in_place(place());
        assert!(rec.identify(&[], &[]).is_empty());
        assert!(rec.used().unkept.is_none());
    }

    #[test]
    fn a_hostile_record_in_the_first_place_is_left_and_the_next_used() {
        let t = tempfile::tempdir().unwrap();
        let first = t.path().join("first");
        let second = t.path().join("second");
        let p = t.path().join("lib.so");
        std::fs::write(&p, vec![9u8; 5000]).unwrap();
        let truth = one(&BuildIdRecord::at(Some(first.clone())), &p).id;
        // The first place's record, then made writable by others: refused, left as it is.
        std::fs::set_permissions(first.join("record"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let planted = std::fs::read(first.join("record")).unwrap();
        let place = || Place::of(vec![first.clone(), second.clone()]);
        let rec = BuildIdRecord::in_place(place());
        let got = one(&rec, &p);
        assert_eq!((got.computed, &got.id), (true, &truth));
        assert_eq!(rec.take_problems(), 1);
        assert_eq!(rec.used().dir.as_deref(), Some(second.as_path()));
        assert_eq!(std::fs::read(first.join("record")).unwrap(), planted);
        // The next process refuses it again, and reads the second: nothing computed.
        let later = BuildIdRecord::in_place(place());
        let got = one(&later, &p);
        assert_eq!((got.computed, &got.id), (false, &truth));
        assert_eq!(later.take_problems(), 1);
    }

    #[test]
    fn appended_bytes_make_another_digest_and_the_record_spares_the_second_hash() {
        let t = tempfile::tempdir().unwrap();
        let rec_dir = t.path().join("rec");
        let p = t.path().join("lib.so");
        let big: Vec<u8> = (0..(PIECE + 12345)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &big).unwrap();
        let rec = BuildIdRecord::at(Some(rec_dir.clone()));
        let first = one(&rec, &p);
        assert!(first.computed);
        assert_eq!(first.id, blake3::hash(&big).as_bytes().to_vec());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&rec_dir), 0o700);
        assert_eq!(mode(&rec_dir.join("record")), 0o600);
        // A later process: from the record.
        let later = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
        assert_eq!((later.computed, &later.id), (false, &first.id));
        // The same size and mtime, other bytes (a reinstall that kept both): the ctime
        // moved, so the file is hashed again.
        let st = std::fs::metadata(&p).unwrap();
        let mut other = big.clone();
        other[10] ^= 1;
        std::fs::write(&p, &other).unwrap();
        let f = File::options().write(true).open(&p).unwrap();
        f.set_times(std::fs::FileTimes::new().set_modified(st.modified().unwrap()))
            .unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().modified().unwrap(),
            st.modified().unwrap()
        );
        let again = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
        assert!(again.computed);
        assert_eq!(again.id, blake3::hash(&other).as_bytes().to_vec());
        // Bytes appended after the image: another digest.
        let mut longer = other.clone();
        longer.extend_from_slice(b"appended");
        std::fs::write(&p, &longer).unwrap();
        assert_ne!(one(&rec, &p).id, again.id);
    }

    #[test]
    fn many_files_are_remembered_within_the_bound() {
        let t = tempfile::tempdir().unwrap();
        let rec_dir = t.path().join("rec");
        let paths: Vec<PathBuf> = (0..MAX_SLOTS + 10)
            .map(|i| {
                let p = t.path().join(format!("f{i}"));
                std::fs::write(&p, i.to_le_bytes()).unwrap();
                p
            })
            .collect();
        let rec = BuildIdRecord::at(Some(rec_dir.clone()));
        assert!(rec.identify(&paths, &[]).iter().all(|r| r.is_ok()));
        let len = std::fs::metadata(rec_dir.join("record")).unwrap().len();
        assert_eq!(len, (HEAD + SLOT * MAX_SLOTS + 8) as u64);
        let later = BuildIdRecord::at(Some(rec_dir));
        let got = later.identify(&paths, &[]);
        // The oldest were dropped; the newest are remembered.
        assert!(got[0].as_ref().unwrap().computed);
        assert!(!got[paths.len() - 1].as_ref().unwrap().computed);
        assert_eq!(later.take_problems(), 0);
    }

    /// Every hostile or garbled record: never trusted (the file is hashed, whatever the
    /// record claims), counted once; a garbled one of ours is rebuilt, a hostile one left.
    #[test]
    fn hostile_or_garbled_records_are_refused_counted_and_never_trusted() {
        let mut cases = spoiled::records();
        cases.extend([
            (
                "truncated",
                (|d| spoiled::set_len(d, 40)) as spoiled::Spoil,
                true,
            ),
            (
                "a slot changed under its checksum",
                |d| spoiled::patch(d, |b| b[HEAD + 48] ^= 0xff),
                true,
            ),
        ]);
        for (what, spoil, rebuilt) in cases {
            let t = tempfile::tempdir().unwrap();
            let rec_dir = t.path().join("rec");
            let p = t.path().join("lib.so");
            std::fs::write(&p, b"the real bytes").unwrap();
            let truth = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p).id;
            // Plant a lie for the file's stat in the record, then spoil the record.
            let st = dir::fstat(&File::open(&p).unwrap()).unwrap();
            let lie = Slot {
                key: [st.dev(), st.ino(), st.len(), st.mtime_ns(), st.ctime_ns()],
                kind: IdKind::Blake3,
                id: vec![0u8; 32],
            };
            let rd = Dir::open_path(&rec_dir, true).unwrap();
            write(&rd, &[lie]).unwrap();
            drop(rd);
            let lied = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
            assert_eq!(
                lied.id,
                vec![0u8; 32],
                "{what}: the user's own record is used"
            );
            spoil(&rec_dir);
            let rec = BuildIdRecord::at(Some(rec_dir.clone()));
            let got = one(&rec, &p);
            assert_eq!(
                (got.id.clone(), got.computed),
                (truth.clone(), true),
                "{what}"
            );
            assert_eq!(rec.take_problems(), 1, "{what}");
            // The next process: a rebuilt record serves it, a hostile one is still refused.
            let next = BuildIdRecord::at(Some(rec_dir.clone()));
            let got = one(&next, &p);
            assert_eq!(got.id, truth, "{what}");
            assert_eq!(
                (got.computed, next.take_problems()),
                (!rebuilt, u64::from(!rebuilt)),
                "{what}"
            );
        }
    }

    #[test]
    fn another_owner_is_refused() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // only root can hand a file to someone else
        }
        let t = tempfile::tempdir().unwrap();
        let rec_dir = t.path().join("rec");
        let p = t.path().join("lib.so");
        std::fs::write(&p, b"bytes").unwrap();
        one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
        for target in [rec_dir.join("record"), rec_dir.clone()] {
            std::os::unix::fs::chown(&target, Some(4242), None).unwrap();
            let rec = BuildIdRecord::at(Some(rec_dir.clone()));
            assert!(one(&rec, &p).computed);
            assert_eq!(rec.take_problems(), 1);
            std::os::unix::fs::chown(&target, Some(0), None).unwrap();
        }
    }

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
