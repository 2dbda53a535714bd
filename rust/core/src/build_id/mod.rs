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
//! Each part has its own file: this one the identities and the record as a process uses it
//! ([`BuildIdRecord`]: where it is kept, read once, rewritten once); `identify.rs` one file's
//! identity, from the record or computed; `elf.rs` the build-id note read from the ELF
//! headers; `maps.rs` this process's memory map, to tell a loaded file from one replaced
//! since; `record.rs` the record's file: its format, read and written under the checks of
//! a file of this user's own.

mod elf;
mod identify;
mod maps;
mod record;

use crate::record_place::{Found, Place};
use identify::identify_one;
use record::{check_file, has_record, read, write, Refused, Slot, MAX_SLOTS};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use maps::{mapped_objects, Mapped};

const DIR_NAME: &str = "xla_pcache-builds";
/// The longest identity kept, a slot's room for it (a BLAKE3 takes 32 bytes, a build-id
/// note usually 20).
const ID_MAX: usize = 64;

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

/// The identity of one file, for the tests.
#[cfg(test)]
fn one(rec: &BuildIdRecord, p: &Path) -> FileId {
    let mut out = rec.identify(&[p.to_path_buf()], &[]);
    out.remove(0).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use record::{HEAD, SLOT};
    use std::os::unix::fs::PermissionsExt;

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
}
