//! Directory handles: every file of the cache is reached relative to a handle on the cache
//! root, never by a path the kernel resolves through whatever the directory holds now.
//!
//! The cache directory is shared: anyone who can write it can replace `entries/xx`, `tmp/`
//! or `locks/claims` by a symbolic link to somewhere else, or put a FIFO, a directory or a
//! huge sparse file where a file is expected. So:
//!
//! * the root is opened once (following a link there is the user's choice of path), and
//!   every sub-directory is opened beneath it at the time of use, refusing symbolic links in
//!   every component (`openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` on Linux 5.6+, else
//!   one `openat(O_NOFOLLOW | O_DIRECTORY)` per component);
//! * files are opened `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` relative to those handles (a FIFO
//!   opens at once and is then refused by `fstat`), and removed, renamed and linked with the
//!   `*at` calls on the same handles, so a swap after the open cannot redirect them.
//!
//! A component that is not a real directory reads as [`is_unsafe`]: callers skip the
//! operation, count it and warn.
//!
//! Each part has its own file: `name.rs` the checked names and paths ([`Name`], [`Rel`]),
//! `open.rs` the opens that follow no link (`openat2`, else one `openat` per component),
//! `stat.rs` what a directory entry is ([`Stat`]), `handle.rs` an open directory ([`Dir`]) and
//! the reads of a cache file through it, `root.rs` the cache root ([`Root`]).

mod handle;
mod name;
mod open;
mod root;
mod stat;

pub use handle::{open_regular, read_capped, Dir};
pub use name::{Kind, Name, Rel};
pub use open::{is_unsafe, SAFE_OPEN};
pub use root::Root;
pub use stat::{fstat, user_name, Stat};
