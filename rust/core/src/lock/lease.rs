//! Lease files: `<dir>/<name>.lease` holding one line `host pid nonce counter`, created
//! atomically with `link()` from a temp file. A lease is judged stale only when *this
//! process* has watched its content stay unchanged for longer than `lease_time` on its own
//! monotonic clock; wall clocks of different hosts are never compared. The holder rewrites
//! it with the counter incremented ([`LockGuard::heartbeat`]) more often than `lease_time`
//! (every `lease_time / 3` is a good pace); a holder done with it may leave it "retired",
//! which any process takes over at once. A stale lease is taken over by one rename of a new
//! lease over it, by the one taker that holds the ticket for the content judged stale and
//! still finds that content there (see `take_over`).

use super::{
    link_exclusive, made, new_nonce, remove_foreign, sleep_until_next_poll, validate_name,
    GuardInner, LockDir, LockError, LockGuard,
};
use crate::dir::{open_regular, read_capped};
use crate::dir::{Dir, Name};
use std::io;
use std::io::Write;
use std::os::unix::io::IntoRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Last word of the content of a retired lease (see [`LockGuard::retire`]).
const RETIRED: &str = "retired";
/// A lease file is one short line; never read more than this.
const MAX_LEASE_LEN: u64 = 4096;

/// A lease content seen by this process, and when it was first seen with that content.
pub(super) struct Observation {
    content: String,
    since: Instant,
}

impl LockDir {
    pub(super) fn try_lease(
        &self,
        name: &str,
        deadline: Instant,
    ) -> Result<Option<LockGuard>, LockError> {
        let lease = self.dir.join(format!("{name}.lease"));
        let lease_name =
            made(&format!("{name}.lease")).map_err(|e| LockError::io("open", &lease, e))?;
        let dir = self
            .open_dir(true)
            .map_err(|e| LockError::io("open", &self.dir, e))?;
        let id = LeaseId {
            host: self.opts.host.clone(),
            pid: std::process::id(),
            nonce: new_nonce(),
        };
        let content = id.content(0);
        let tmp = self.dir.join(id.temp_name(name, 0));
        let tmp_name = made(&id.temp_name(name, 0)).map_err(|e| LockError::io("write", &tmp, e))?;
        write_new_file(&dir, &tmp_name, content.as_bytes())
            .map_err(|e| LockError::io("write", &tmp, e))?;
        let _tmp_guard = RemoveOnDrop(&dir, &tmp_name);

        loop {
            if link_exclusive(&dir, &tmp_name, &lease_name)
                .map_err(|e| LockError::io("link", &lease, e))?
            {
                self.forget(name);
                return Ok(Some(LockGuard::lease(
                    &dir,
                    lease,
                    &lease_name,
                    name,
                    id,
                    content,
                    false,
                )));
            }
            // Held by someone else (or it vanished between link and read).
            match read_small(&dir, &lease_name) {
                Ok(current) => {
                    if let Some(held_for) = self.observe_stale(name, &current) {
                        match self.take_over(name, &dir, &current, held_for, &tmp_name)? {
                            TakeOver::Won => {
                                return Ok(Some(LockGuard::lease(
                                    &dir,
                                    lease,
                                    &lease_name,
                                    name,
                                    id,
                                    content,
                                    true,
                                )));
                            }
                            TakeOver::GaveUp => return Ok(None),
                            TakeOver::Retry => {}
                        }
                    }
                }
                Err(e) if is_gone(&e) => {}
                // Not a regular file: nobody's lease; removed, then the name is tried again.
                Err(e) if is_foreign(&e) => remove_foreign(&dir, name, &lease_name),
                Err(e) => return Err(LockError::io("read", &lease, e)),
            }
            if !sleep_until_next_poll(deadline) {
                return Ok(None);
            }
        }
    }

    /// Records that the lease `name` holds `content` now. Returns how long this process
    /// has seen that content unchanged if that is longer than `lease_time` (stale).
    /// The first observation of a content is never stale.
    fn observe_stale(&self, name: &str, content: &str) -> Option<Duration> {
        if is_retired(content) {
            // Its holder is done with it: nothing to wait for.
            return Some(Duration::ZERO);
        }
        self.observe_unchanged(name, content)
    }

    /// Records that `key` holds `content` now. Returns how long this process has seen that
    /// content unchanged if that is longer than `lease_time`; the first sighting never is.
    fn observe_unchanged(&self, key: &str, content: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        match observed.get_mut(key) {
            Some(seen) if seen.content == content => {
                let held_for = now.saturating_duration_since(seen.since);
                (held_for > self.opts.lease_time).then_some(held_for)
            }
            Some(seen) => {
                seen.content = content.to_string();
                seen.since = now;
                None
            }
            None => {
                observed.insert(
                    key.to_string(),
                    Observation {
                        content: content.to_string(),
                        since: now,
                    },
                );
                None
            }
        }
    }

    /// Forgets what was seen of the lease `name` and of the takeover tickets beside it.
    pub(super) fn forget(&self, name: &str) {
        let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        observed.remove(name);
        for level in 0..TICKET_LEVELS {
            observed.remove(&ticket_key(name, level));
        }
    }

    /// Looks at the lease `name` without trying to take it: one read of the lease file.
    /// Records the content like an attempt does, so staleness is judged across peeks the
    /// same way (by how long this process has seen the content unchanged). A peek at a
    /// missing lease forgets what was seen of it.
    pub fn peek(&self, name: &str) -> Result<LeaseView, LockError> {
        validate_name(name)?;
        let lease = self.dir.join(format!("{name}.lease"));
        let lease_name =
            made(&format!("{name}.lease")).map_err(|e| LockError::io("read", &lease, e))?;
        let read = self
            .open_dir(false)
            .and_then(|dir| read_small(&dir, &lease_name));
        match read {
            Ok(content) => {
                let stale = self.observe_stale(name, &content);
                Ok(LeaseView::Held {
                    retired: is_retired(&content),
                    stale: stale.is_some(),
                    content,
                })
            }
            Err(e) if is_gone(&e) => {
                self.forget(name);
                Ok(LeaseView::Free)
            }
            // Not a lease (a FIFO, a directory, a link): nobody holds it; taking the lock
            // removes it.
            Err(e) if is_foreign(&e) => Ok(LeaseView::Held {
                content: String::new(),
                stale: true,
                retired: true,
            }),
            Err(e) => Err(LockError::io("read", &lease, e)),
        }
    }

    /// Drops what this process remembers of the lease `name` (its last content and since
    /// when), e.g. once a waiter stops watching it.
    pub fn forget_lease(&self, name: &str) {
        self.forget(name);
    }

    /// Takes over the lease `name` judged stale with content `judged`, replacing it with
    /// our `tmp` in one rename: the name is never empty, so no other process can link into
    /// a gap. Two takers of the same content would both replace it; a ticket, linked
    /// exclusively under a name derived from that content, lets one through. The ticket's
    /// holder checks that the lease still reads `judged` before replacing it, so a taker
    /// that comes late (the ticket removed by a taker that won) finds another content and
    /// leaves. A ticket watched unchanged for a whole lease time belongs to a taker that died
    /// in its few steps: the next level's ticket is tried, a few levels deep (the sweeper
    /// removes what a crash left).
    fn take_over(
        &self,
        name: &str,
        dir: &Dir,
        judged: &str,
        held_for: Duration,
        tmp: &Name,
    ) -> Result<TakeOver, LockError> {
        let lease = self.dir.join(format!("{name}.lease"));
        let lease_name =
            made(&format!("{name}.lease")).map_err(|e| LockError::io("rename", &lease, e))?;
        let Some(ticket) = self.take_ticket(name, dir, judged, tmp)? else {
            return Ok(TakeOver::Retry);
        };
        let _ticket_guard = RemoveOnDrop(dir, &ticket);
        match read_small(dir, &lease_name) {
            Ok(current) if current == judged => {}
            // Refreshed, replaced or removed since we judged it: not ours to take.
            Ok(_) => return Ok(TakeOver::GaveUp),
            Err(e) if is_gone(&e) => return Ok(TakeOver::Retry),
            Err(e) => return Err(LockError::io("read", &lease, e)),
        }
        dir.rename(tmp, dir, &lease_name)
            .map_err(|e| LockError::io("rename", &lease, e))?;
        self.forget(name);
        // A retired lease is routine to take; a stale one is worth a line.
        let level = if is_retired(judged) {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        log::log!(
            level,
            "xla_pcache: took over lock lease {} from `{}` (unchanged for {:.1?})",
            lease.display(),
            judged.trim_end(),
            held_for
        );
        Ok(TakeOver::Won)
    }

    /// Links `tmp` as the ticket for taking over the content `judged` of lease `name`.
    /// `None` while another taker holds it (a live one: its ticket has not been watched
    /// unchanged for a lease time, or every level is taken).
    fn take_ticket(
        &self,
        name: &str,
        dir: &Dir,
        judged: &str,
        tmp: &Name,
    ) -> Result<Option<Name>, LockError> {
        for level in 0..TICKET_LEVELS {
            let ticket_str = ticket_name(name, judged, level);
            let ticket_path = self.dir.join(&ticket_str);
            let ticket = made(&ticket_str).map_err(|e| LockError::io("link", &ticket_path, e))?;
            if link_exclusive(dir, tmp, &ticket)
                .map_err(|e| LockError::io("link", &ticket_path, e))?
            {
                let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
                observed.remove(&ticket_key(name, level));
                return Ok(Some(ticket));
            }
            // Remembered under one key per lease and level, whatever content the ticket
            // names: planted tickets for ever new contents replace one entry, never add one.
            let seen = |holder: &str| format!("{ticket_str}\n{holder}");
            match read_small(dir, &ticket) {
                Ok(holder)
                    if self
                        .observe_unchanged(&ticket_key(name, level), &seen(&holder))
                        .is_some() => {}
                Ok(_) => return Ok(None),
                // Gone: its taker finished (the lease is no longer `judged`) or left.
                Err(e) if is_gone(&e) => return Ok(None),
                Err(e) => return Err(LockError::io("read", &ticket_path, e)),
            }
        }
        Ok(None)
    }
}

/// The file name of the ticket for taking over the content `judged` of lease `name` at
/// `level`: a dot file beside the lease, named after a hash of that content.
pub(crate) fn ticket_name(name: &str, judged: &str, level: u32) -> String {
    let hash = crate::hash::checksum(judged.as_bytes());
    format!(".{name}.lease.{hash:016x}.{level}.take")
}

/// The key under which a taker remembers the ticket it watches at `level` for lease `name`
/// (a `/` is in no lock name, so no lease's key).
fn ticket_key(name: &str, level: u32) -> String {
    format!("{name}/{level}")
}

/// Levels of takeover tickets for one lease content: each is tried only when the one below
/// was watched unchanged for a lease time (its taker died between two syscalls).
const TICKET_LEVELS: u32 = 3;

enum TakeOver {
    Won,
    GaveUp,
    Retry,
}

/// What [`LockDir::peek`] saw of a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseView {
    /// No lease file.
    Free,
    /// A lease file. `stale`: this process has seen this content unchanged for longer than
    /// `lease_time`, or it is `retired` (its holder is done with it and left it behind);
    /// either may be taken over at once.
    Held {
        content: String,
        stale: bool,
        retired: bool,
    },
}

/// Who holds a lease: written into the lease file as `host pid nonce counter`.
#[derive(Clone, Debug)]
pub(super) struct LeaseId {
    host: String,
    pid: u32,
    nonce: u64,
}

impl LeaseId {
    fn content(&self, counter: u64) -> String {
        format!(
            "{} {} {:016x} {}\n",
            self.host, self.pid, self.nonce, counter
        )
    }

    /// The last content of a lease its holder is done with (see [`LockGuard::retire`]).
    fn retired_content(&self, counter: u64) -> String {
        format!(
            "{} {} {:016x} {} {RETIRED}\n",
            self.host, self.pid, self.nonce, counter
        )
    }

    fn temp_name(&self, name: &str, counter: u64) -> String {
        format!(
            ".{name}.lease.{}.{}.{:016x}.{counter}.tmp",
            self.host, self.pid, self.nonce
        )
    }
}

impl LockGuard {
    pub(super) fn lease(
        dir: &Arc<Dir>,
        path: PathBuf,
        file_name: &Name,
        name: &str,
        id: LeaseId,
        content: String,
        took_over: bool,
    ) -> Self {
        LockGuard {
            inner: GuardInner::Lease {
                dir: Arc::clone(dir),
                file: file_name.clone(),
                path,
                name: name.to_string(),
                id,
                counter: 0,
                content,
                released: false,
                took_over,
            },
        }
    }

    pub(super) fn rewrite(&mut self, retire: bool) -> Result<(), LockError> {
        let GuardInner::Lease {
            dir,
            file,
            path,
            name,
            id,
            counter,
            content,
            ..
        } = &mut self.inner
        else {
            return Ok(());
        };
        let next = *counter + 1;
        let new_content = if retire {
            id.retired_content(next)
        } else {
            id.content(next)
        };
        let tmp = path.with_file_name(id.temp_name(name, next));
        let tmp_name =
            made(&id.temp_name(name, next)).map_err(|e| LockError::io("write", &tmp, e))?;
        write_new_file(dir, &tmp_name, new_content.as_bytes())
            .map_err(|e| LockError::io("write", &tmp, e))?;
        let _tmp_guard = RemoveOnDrop(dir, &tmp_name);
        match read_small(dir, file) {
            Ok(current) if current == *content => {}
            Ok(_) => return Err(LockError::LeaseLost { path: path.clone() }),
            Err(e) if is_gone(&e) => return Err(LockError::LeaseLost { path: path.clone() }),
            Err(e) => return Err(LockError::io("read", path, e)),
        }
        dir.rename(&tmp_name, dir, file)
            .map_err(|e| LockError::io("rename", path, e))?;
        *counter = next;
        *content = new_content;
        Ok(())
    }

    pub(super) fn release_inner(&mut self) -> Result<(), LockError> {
        let GuardInner::Lease {
            dir,
            file,
            path,
            content,
            released,
            ..
        } = &mut self.inner
        else {
            return Ok(()); // the fcntl lock goes with the file descriptor
        };
        if *released {
            return Ok(());
        }
        *released = true;
        match read_small(dir, file) {
            Ok(current) if current == *content => match dir.unlink(file) {
                Ok(()) => Ok(()),
                Err(e) if is_gone(&e) => Ok(()),
                Err(e) => Err(LockError::io("unlink", path, e)),
            },
            Ok(_) => {
                log::debug!(
                    "xla_pcache: lease {} was taken over before release; leaving it",
                    path.display()
                );
                Ok(())
            }
            Err(e) if is_gone(&e) => Ok(()),
            Err(e) => Err(LockError::io("read", path, e)),
        }
    }
}

/// A lease content written by [`LockGuard::retire`].
fn is_retired(content: &str) -> bool {
    content
        .trim_end()
        .rsplit(' ')
        .next()
        .is_some_and(|w| w == RETIRED)
}

/// The file disappeared under us (removed locally, or by another NFS client).
fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESTALE)
}

/// Creates `dir/name` exclusively with `data` and closes it, checking the close (on NFS
/// the data reaches the server at close). Removes the file on failure.
fn write_new_file(dir: &Dir, name: &Name, data: &[u8]) -> io::Result<()> {
    let mut file = dir.open_file(name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o666)?;
    let result = file.write_all(data).and_then(|()| {
        let fd = file.into_raw_fd();
        // SAFETY: we own `fd` (taken from the File) and close it exactly once.
        if unsafe { libc::close(fd) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    });
    if result.is_err() {
        let _ = dir.unlink(name);
    }
    result
}

/// Reads a small text file: never following a link, never waiting on a FIFO, a regular
/// file only, at most `MAX_LEASE_LEN` bytes.
fn read_small(dir: &Dir, name: &Name) -> io::Result<String> {
    let (file, _) = open_regular(dir, name)?;
    let buf = read_capped(&file, MAX_LEASE_LEN)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The name holds something that is not a lease file (a FIFO, a directory, a symbolic link).
fn is_foreign(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData
        || matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EISDIR))
}

/// Removes a file when dropped, ignoring errors (temp and aside files).
struct RemoveOnDrop<'a>(&'a Dir, &'a Name);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.unlink(self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::tests::{assert_no_leftovers, lease_content, lock_dir};
    use crate::lock::LockMode;
    use std::fs;
    use std::thread;

    /// A lock directory and two holders of its leases (`lease_ms` each), the second
    /// waiting 50 ms for one.
    fn two_holders(lease_ms: u64) -> (tempfile::TempDir, LockDir, LockDir) {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, lease_ms);
        let b = lock_dir(tmp.path(), LockMode::Lease, 50, lease_ms);
        (tmp, a, b)
    }

    #[test]
    fn peek_sees_a_lease_without_taking_it_and_judges_staleness() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let b = lock_dir(tmp.path(), LockMode::Lease, 0, 80);
        assert_eq!(b.peek("claim").unwrap(), LeaseView::Free);
        let mut g = a.try_lock("claim").unwrap().unwrap();
        assert!(!g.took_over());
        let LeaseView::Held { stale, retired, .. } = b.peek("claim").unwrap() else {
            panic!("held")
        };
        assert!(!stale && !retired, "a first sighting is never stale");
        thread::sleep(Duration::from_millis(120));
        let LeaseView::Held { stale, .. } = b.peek("claim").unwrap() else {
            panic!("held")
        };
        assert!(stale, "unchanged for longer than the lease time");
        g.heartbeat().unwrap();
        let LeaseView::Held { stale, .. } = b.peek("claim").unwrap() else {
            panic!("held")
        };
        assert!(!stale, "a heartbeat is a new content");
        // Peeking never creates files (it is what read-only waiters do).
        assert_no_leftovers(tmp.path());
        drop(g);
        assert_eq!(b.peek("claim").unwrap(), LeaseView::Free);
        assert!(b.peek("../x").is_err(), "names are validated");
    }

    #[test]
    fn a_retired_lease_stays_visible_and_is_taken_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let b = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let mut g = a.try_lock("claim").unwrap().unwrap();
        g.retire().unwrap();
        let content = lease_content(tmp.path(), "claim").unwrap();
        assert!(content.trim_end().ends_with(" retired"), "{content:?}");
        assert_eq!(
            b.peek("claim").unwrap(),
            LeaseView::Held {
                content,
                stale: true,
                retired: true
            }
        );
        g.leave();
        assert!(
            lease_content(tmp.path(), "claim").is_some(),
            "leave() keeps the file"
        );
        // Taken over on the first attempt, no lease time to wait out.
        let g2 = b.try_lock("claim").unwrap().expect("retired lease taken");
        assert!(g2.took_over());
        assert!(!lease_content(tmp.path(), "claim")
            .unwrap()
            .contains("retired"));
        drop(g2);
        assert!(lease_content(tmp.path(), "claim").is_none());
        // retire() then drop removes the file.
        let mut g3 = a.try_lock("claim").unwrap().unwrap();
        g3.retire().unwrap();
        drop(g3);
        assert!(lease_content(tmp.path(), "claim").is_none());
        assert_no_leftovers(tmp.path());
    }

    #[test]
    fn lease_excludes_and_releases_on_drop() {
        let (tmp, a, b) = two_holders(60_000);
        let g = a.try_lock("evict").unwrap().expect("first lease");
        assert_eq!(g.kind(), "lease");
        let content = lease_content(tmp.path(), "evict").unwrap();
        let fields: Vec<&str> = content.split_whitespace().collect();
        assert_eq!(fields.len(), 4, "{content:?}");
        assert_eq!(fields[0], "test_host");
        assert_eq!(fields[1], std::process::id().to_string());
        assert_eq!(fields[3], "0");
        assert!(content.ends_with('\n'));
        assert!(b.try_lock("evict").unwrap().is_none());
        assert!(a.try_lock("evict").unwrap().is_none(), "same LockDir again");
        assert_no_leftovers(tmp.path());
        drop(g);
        assert!(
            lease_content(tmp.path(), "evict").is_none(),
            "removed on drop"
        );
        let g = b.try_lock("evict").unwrap().expect("free after drop");
        g.release().unwrap();
        assert!(lease_content(tmp.path(), "evict").is_none());
        assert_no_leftovers(tmp.path());
    }

    #[test]
    fn stale_lease_taken_over_after_lease_time() {
        let (tmp, a, b) = two_holders(200);
        let ga = a.try_lock("evict").unwrap().unwrap();
        let theirs = lease_content(tmp.path(), "evict").unwrap();
        // First observation is never stale, even of an old file.
        assert!(b.try_lock("evict").unwrap().is_none());
        thread::sleep(Duration::from_millis(250));
        // Watched unchanged for > 200 ms across two calls: stale.
        let gb = b.try_lock("evict").unwrap().expect("takeover");
        let ours = lease_content(tmp.path(), "evict").unwrap();
        assert_ne!(ours, theirs);
        assert_no_leftovers(tmp.path());
        // The old holder learns it lost the lease, and its release leaves ours alone.
        let mut ga = ga;
        assert!(matches!(ga.heartbeat(), Err(LockError::LeaseLost { .. })));
        drop(ga);
        assert_eq!(lease_content(tmp.path(), "evict").unwrap(), ours);
        drop(gb);
        assert!(lease_content(tmp.path(), "evict").is_none());

        // Within a single call whose timeout exceeds lease_time.
        let c = lock_dir(tmp.path(), LockMode::Lease, 600, 200);
        let _ga = a.try_lock("evict").unwrap().unwrap();
        let t = Instant::now();
        let _gc = c.try_lock("evict").unwrap().expect("takeover in one call");
        assert!(t.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn heartbeat_prevents_takeover() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 200);
        let b = lock_dir(tmp.path(), LockMode::Lease, 700, 200);
        let mut g = a.try_lock("evict").unwrap().unwrap();
        let beating = thread::spawn(move || {
            for _ in 0..18 {
                thread::sleep(Duration::from_millis(50));
                g.heartbeat().unwrap();
            }
            g
        });
        thread::sleep(Duration::from_millis(20));
        assert!(
            b.try_lock("evict").unwrap().is_none(),
            "taken despite heartbeat"
        );
        let g = beating.join().unwrap();
        let content = lease_content(tmp.path(), "evict").unwrap();
        assert!(content.ends_with(" 18\n"), "{content:?}");
        assert_no_leftovers(tmp.path());
        drop(g);
        assert!(lease_content(tmp.path(), "evict").is_none());
    }

    #[test]
    fn release_after_takeover_keeps_the_new_lease() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let g = a.try_lock("evict").unwrap().unwrap();
        // Someone else replaced the lease (as a takeover would).
        let lease = tmp.path().join("locks/evict.lease");
        fs::write(&lease, "otherhost 1 00000000000000ff 0\n").unwrap();
        g.release().unwrap();
        assert_eq!(
            lease_content(tmp.path(), "evict").unwrap(),
            "otherhost 1 00000000000000ff 0\n"
        );
        // A guard whose lease vanished releases quietly.
        let g = {
            fs::remove_file(&lease).unwrap();
            a.try_lock("evict").unwrap().unwrap()
        };
        fs::remove_file(&lease).unwrap();
        g.release().unwrap();
    }

    /// A lock directory holding the lease `evict` with `content`, and our temp file.
    fn taker(lease_ms: u64, content: &str) -> (tempfile::TempDir, LockDir, Dir, LeaseId, Name) {
        let tmp = tempfile::tempdir().unwrap();
        let d = lock_dir(tmp.path(), LockMode::Lease, 0, lease_ms);
        fs::create_dir_all(d.dir()).unwrap();
        fs::write(d.dir().join("evict.lease"), content).unwrap();
        let id = LeaseId {
            host: "me".into(),
            pid: 1,
            nonce: 2,
        };
        let tmpname = made(&id.temp_name("evict", 0)).unwrap();
        let dir = Dir::open_path(d.dir(), true).unwrap();
        write_new_file(&dir, &tmpname, id.content(0).as_bytes()).unwrap();
        (tmp, d, dir, id, tmpname)
    }

    #[test]
    fn takeover_leaves_a_refreshed_lease_alone() {
        let fresh = "h 7 0000000000000001 5\n";
        let (tmp, d, dir, id, tmpname) = taker(200, fresh);
        let lease = d.dir().join("evict.lease");
        // We judged an older content stale; the holder refreshed it meanwhile.
        let r = d
            .take_over(
                "evict",
                &dir,
                "h 7 0000000000000001 4\n",
                Duration::from_secs(1),
                &tmpname,
            )
            .unwrap();
        assert!(matches!(r, TakeOver::GaveUp));
        assert_eq!(fs::read_to_string(&lease).unwrap(), fresh);
        // The judged content is what is there: we win, by one rename (the temp file is gone).
        let r = d
            .take_over("evict", &dir, fresh, Duration::from_secs(1), &tmpname)
            .unwrap();
        assert!(matches!(r, TakeOver::Won));
        assert_eq!(fs::read_to_string(&lease).unwrap(), id.content(0));
        assert_no_leftovers(tmp.path());
    }

    #[test]
    fn one_taker_per_stale_content_and_a_dead_takers_ticket_is_passed() {
        let stale = "h 7 0000000000000001 4\n";
        let (tmp, d, dir, id, tmpname) = taker(150, stale);
        let lease = d.dir().join("evict.lease");
        // Another taker holds the ticket for this content: we leave the lease to it.
        let ticket = d.dir().join(ticket_name("evict", stale, 0));
        fs::write(&ticket, "other 9 0000000000000009 0\n").unwrap();
        let take = || d.take_over("evict", &dir, stale, Duration::from_secs(1), &tmpname);
        assert!(matches!(take().unwrap(), TakeOver::Retry));
        assert_eq!(fs::read_to_string(&lease).unwrap(), stale);
        // Its ticket unchanged for a lease time: that taker died; the next level is ours.
        thread::sleep(Duration::from_millis(200));
        assert!(matches!(take().unwrap(), TakeOver::Won));
        assert_eq!(fs::read_to_string(&lease).unwrap(), id.content(0));
        fs::remove_file(&ticket).unwrap();
        assert_no_leftovers(tmp.path());
        // A late taker of the same content (its ticket free again) finds ours and leaves.
        let id2 = LeaseId {
            host: "late".into(),
            pid: 3,
            nonce: 4,
        };
        let tmp2 = made(&id2.temp_name("evict", 0)).unwrap();
        write_new_file(&dir, &tmp2, id2.content(0).as_bytes()).unwrap();
        let r = d
            .take_over("evict", &dir, stale, Duration::from_secs(1), &tmp2)
            .unwrap();
        assert!(matches!(r, TakeOver::GaveUp));
        assert_eq!(fs::read_to_string(&lease).unwrap(), id.content(0));
        dir.unlink(&tmp2).unwrap();
        assert_no_leftovers(tmp.path());
    }

    #[test]
    fn a_stampede_on_a_stale_lease_has_one_winner() {
        // Eight processes' worth of lock directories watch one dead holder's lease until it
        // is stale, then all try to take it at the same instant, many times over. Moving a
        // lease aside to check it let a third taker link into the gap and two win.
        for round in 0..40 {
            let tmp = tempfile::tempdir().unwrap();
            let dead = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
            dead.try_lock("claim").unwrap().unwrap().leave();
            let takers: Vec<LockDir> = (0..8)
                .map(|_| lock_dir(tmp.path(), LockMode::Lease, 0, 30))
                .collect();
            for t in &takers {
                assert!(matches!(t.peek("claim").unwrap(), LeaseView::Held { .. }));
            }
            thread::sleep(Duration::from_millis(40));
            let barrier = std::sync::Barrier::new(takers.len());
            let winners: Vec<LockGuard> = thread::scope(|s| {
                let handles: Vec<_> = takers
                    .iter()
                    .map(|t| {
                        let barrier = &barrier;
                        s.spawn(move || {
                            barrier.wait();
                            t.try_lock("claim").unwrap()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .filter_map(|h| h.join().unwrap())
                    .collect()
            });
            assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
            assert!(winners[0].took_over());
            drop(winners);
            assert!(lease_content(tmp.path(), "claim").is_none());
            assert_no_leftovers(tmp.path());
        }
    }

    #[test]
    fn planted_tickets_never_hang_follow_or_break_a_taker() {
        // Whoever can write the directory can plant tickets for a dead holder's lease. Regular
        // files at every level leave the lease to its (absent) taker: no takeover, no error.
        let stale = "h 7 0000000000000001 4\n";
        let (tmp, d, dir, _, tmpname) = taker(60_000, stale);
        let ticket = |level: u32| d.dir().join(ticket_name("evict", stale, level));
        for level in 0..TICKET_LEVELS {
            fs::write(ticket(level), "mallory 1 0000000000000bad 0\n").unwrap();
        }
        let take = || d.take_over("evict", &dir, stale, Duration::from_secs(1), &tmpname);
        assert!(matches!(take().unwrap(), TakeOver::Retry));
        assert_eq!(lease_content(tmp.path(), "evict").unwrap(), stale);
        for level in 0..TICKET_LEVELS {
            fs::remove_file(ticket(level)).unwrap();
        }
        // A link to a file outside, a FIFO, a directory: an error at once (the caller counts
        // it and goes on without the lock), nothing followed, nothing outside touched.
        let outside = tmp.path().join("outside");
        fs::write(&outside, "precious").unwrap();
        std::os::unix::fs::symlink(&outside, ticket(0)).unwrap();
        assert!(take().is_err());
        fs::remove_file(ticket(0)).unwrap();
        let fifo = std::ffi::CString::new(ticket(0).to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo has no other preconditions.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        assert!(take().is_err(), "a FIFO is never waited on");
        fs::remove_file(ticket(0)).unwrap();
        fs::create_dir(ticket(0)).unwrap();
        assert!(take().is_err());
        fs::remove_dir(ticket(0)).unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
        assert_eq!(lease_content(tmp.path(), "evict").unwrap(), stale);
        // With the plants gone, the takeover goes through.
        assert!(matches!(take().unwrap(), TakeOver::Won));
        assert_no_leftovers(tmp.path());
    }
    #[test]
    fn tickets_linked_to_other_files_are_only_read_a_little() {
        // A hard link to a file outside the lock directory, to the lease itself, or a huge
        // sparse file, planted as the ticket: read at most a lease line's worth, never
        // written or removed through, and the takeover waits the ticket out as any other.
        let stale = "h 7 0000000000000001 4\n";
        let (tmp, d, dir, id, tmpname) = taker(100, stale);
        let ticket = |level: u32| d.dir().join(ticket_name("evict", stale, level));
        let outside = tmp.path().join("outside");
        fs::write(&outside, "precious").unwrap();
        fs::hard_link(&outside, ticket(0)).unwrap();
        fs::hard_link(d.dir().join("evict.lease"), ticket(1)).unwrap();
        fs::File::create(ticket(2))
            .unwrap()
            .set_len(1 << 34)
            .unwrap();
        let take = || d.take_over("evict", &dir, stale, Duration::from_secs(1), &tmpname);
        assert!(matches!(take().unwrap(), TakeOver::Retry));
        thread::sleep(Duration::from_millis(150));
        for _ in 0..3 {
            assert!(matches!(take().unwrap(), TakeOver::Retry));
        }
        assert_eq!(lease_content(tmp.path(), "evict").unwrap(), stale);
        // With one level freed, the takeover goes through, and only our own ticket goes.
        fs::remove_file(ticket(2)).unwrap();
        thread::sleep(Duration::from_millis(150));
        assert!(matches!(take().unwrap(), TakeOver::Won));
        assert_eq!(lease_content(tmp.path(), "evict").unwrap(), id.content(0));
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
        assert_eq!(fs::read_to_string(ticket(0)).unwrap(), "precious");
        assert_eq!(fs::read_to_string(ticket(1)).unwrap(), stale);
        assert!(!ticket(2).exists());
        fs::remove_file(ticket(0)).unwrap();
        fs::remove_file(ticket(1)).unwrap();
        assert_no_leftovers(tmp.path());
    }

    #[test]
    fn a_ticket_saying_retired_is_still_waited_out() {
        // "retired" frees a lease, never a ticket: a ticket is a live taker's temp file, and
        // words in it (planted or written into it) must not let the next taker pass at once.
        let stale = "h 7 0000000000000001 4\n";
        let (tmp, d, dir, _, tmpname) = taker(60_000, stale);
        let ticket = d.dir().join(ticket_name("evict", stale, 0));
        fs::write(&ticket, "mallory 1 0000000000000bad 0 retired\n").unwrap();
        let take = || d.take_over("evict", &dir, stale, Duration::from_secs(1), &tmpname);
        assert!(matches!(take().unwrap(), TakeOver::Retry));
        assert!(matches!(take().unwrap(), TakeOver::Retry));
        assert_eq!(lease_content(tmp.path(), "evict").unwrap(), stale);
        fs::remove_file(&ticket).unwrap();
        assert!(matches!(take().unwrap(), TakeOver::Won));
        assert_no_leftovers(tmp.path());
    }

    #[test]
    fn planted_tickets_never_grow_what_a_waiter_remembers() {
        // A keyless writer flips the lease through ever new retired contents (each taken at
        // once, no lease time to wait) and plants the ticket each one names: the waiter's
        // memory of tickets it watched stays a few entries per lease, whatever it is shown.
        let tmp = tempfile::tempdir().unwrap();
        let d = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        fs::create_dir_all(d.dir()).unwrap();
        let lease = d.dir().join("claim.lease");
        for i in 0..200u32 {
            let content = format!("mallory 1 0000000000000bad {i} retired\n");
            fs::write(&lease, &content).unwrap();
            let ticket = d.dir().join(ticket_name("claim", &content, 0));
            fs::write(&ticket, "x".repeat(4000)).unwrap();
            assert!(d.try_lock("claim").unwrap().is_none(), "round {i}");
            fs::remove_file(&ticket).unwrap();
        }
        let remembered = d.observed.lock().unwrap_or_else(|p| p.into_inner()).len();
        assert!(
            remembered <= 1 + TICKET_LEVELS as usize,
            "{remembered} observations remembered"
        );
        d.forget_lease("claim");
        let remembered = d.observed.lock().unwrap_or_else(|p| p.into_inner()).len();
        assert_eq!(remembered, 0, "forgetting a lease forgets its tickets");
    }
}
