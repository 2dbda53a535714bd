//! Checked names: one component of a path inside the cache ([`Name`]) and a path beneath the
//! root made of them ([`Rel`]).

use std::io;

/// Longest name accepted from a directory, a snapshot or a caller (the usual `NAME_MAX`).
pub const MAX_NAME: usize = 255;

/// What a name must look like, besides being one path component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An entry file: 32 lower-case hex digits.
    Entry,
    /// A shard directory under `entries/`: 2 lower-case hex digits.
    Shard,
    /// A journal: `<host>-<pid>-<start time hex>.log`, the host of `[A-Za-z0-9._-]`.
    Journal,
    /// A name this crate makes (temp files, trash, leases, claims, snapshots): of
    /// `[A-Za-z0-9._-]` only.
    Made,
    /// A name read from a listing, used only in the directory it was listed from (to
    /// stat, sweep or remove what someone left there): any one component.
    Listed,
}

/// One component of a path inside the cache, checked. Every directory-handle operation
/// takes a `Name` (or a [`Rel`] made of them), and a `Name` is only made by [`Name::new`],
/// which checks what every name read from disk, a snapshot or a caller must be: one
/// component (no `/`, no NUL, not `.` or `..`), at most [`MAX_NAME`] bytes, and the shape
/// of its [`Kind`]. The constants (`Name::fixed`) are checked when the crate compiles.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(std::borrow::Cow<'static, str>);

const fn is_made_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'
}

const fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b >= b'a' && b <= b'f')
}

/// Whether `s` is one path component of at most `MAX_NAME` bytes.
const fn is_component(s: &[u8]) -> bool {
    if s.is_empty() || s.len() > MAX_NAME {
        return false;
    }
    if (s.len() == 1 && s[0] == b'.') || (s.len() == 2 && s[0] == b'.' && s[1] == b'.') {
        return false;
    }
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'/' || s[i] == 0 {
            return false;
        }
        i += 1;
    }
    true
}

fn is_journal(s: &str) -> bool {
    let Some(stem) = s.strip_suffix(".log") else {
        return false;
    };
    let mut parts = stem.rsplitn(3, '-');
    let (Some(start), Some(pid), Some(host)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    !start.is_empty()
        && start.len() <= 16
        && start.bytes().all(is_lower_hex)
        && !pid.is_empty()
        && pid.len() <= 10
        && pid.bytes().all(|b| b.is_ascii_digit())
        && !host.is_empty()
        && host.bytes().all(is_made_byte)
}

impl Name {
    /// `s` as a name of `kind`, or `None` when it is not one.
    pub fn new(kind: Kind, s: &str) -> Option<Name> {
        let b = s.as_bytes();
        if !is_component(b) {
            return None;
        }
        let ok = match kind {
            Kind::Entry => b.len() == 32 && b.iter().all(|&c| is_lower_hex(c)),
            Kind::Shard => b.len() == 2 && b.iter().all(|&c| is_lower_hex(c)),
            Kind::Journal => is_journal(s),
            Kind::Made => b.iter().all(|&c| is_made_byte(c)),
            Kind::Listed => true,
        };
        ok.then(|| Name(std::borrow::Cow::Owned(s.to_string())))
    }

    /// `new`, with an `InvalidInput` error naming what is wrong (for names this crate
    /// makes, and names a caller passes).
    pub fn checked(kind: Kind, s: &str) -> io::Result<Name> {
        Name::new(kind, s).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{s:?} is not a valid {kind:?} file name"),
            )
        })
    }

    /// A constant name; used in a `const` it fails the build if it is not a plain name.
    pub const fn fixed(s: &'static str) -> Name {
        let b = s.as_bytes();
        assert!(is_component(b));
        let mut i = 0;
        while i < b.len() {
            assert!(is_made_byte(b[i]));
            i += 1;
        }
        Name(std::borrow::Cow::Borrowed(s))
    }

    /// Any string as a name, unchecked: only the tests have it, to forge what a hostile
    /// writer would leave on disk (a snapshot listing `../x.log`) with the real encoders.
    #[cfg(test)]
    pub fn forged(s: &str) -> Name {
        Name(std::borrow::Cow::Owned(s.to_string()))
    }

    /// The file name of entry `name` (32 hex digits: valid by construction).
    pub fn entry(name: u128) -> Name {
        Name(std::borrow::Cow::Owned(crate::hash::name_hex(name)))
    }

    /// The name of shard directory `shard` (2 hex digits).
    pub fn shard(shard: u8) -> Name {
        Name(std::borrow::Cow::Owned(format!("{shard:02x}")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A path beneath the cache root made of [`Name`]s (`entries/0a/<32 hex>`): what
/// [`Root`] opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rel(std::borrow::Cow<'static, str>);

impl Rel {
    /// A constant path of plain components separated by `/`; checked at build time in a
    /// `const`.
    pub const fn fixed(s: &'static str) -> Rel {
        let b = s.as_bytes();
        assert!(!b.is_empty() && b[0] != b'/' && b[b.len() - 1] != b'/');
        let mut i = 0;
        let start = 0;
        while i <= b.len() {
            if i == b.len() || b[i] == b'/' {
                assert!(i > start);
                assert!(!(i - start == 1 && b[start] == b'.'));
                assert!(!(i - start == 2 && b[start] == b'.' && b[start + 1] == b'.'));
            } else {
                assert!(is_made_byte(b[i]));
            }
            i += 1;
        }
        Rel(std::borrow::Cow::Borrowed(s))
    }

    /// Any string as a path, unchecked: only the tests have it, to ask the handles what
    /// they refuse by themselves.
    #[cfg(test)]
    pub fn forged(s: &'static str) -> Rel {
        Rel(std::borrow::Cow::Borrowed(s))
    }

    /// `entries/xx`, the shard directory of entry `name` (valid by construction).
    pub fn shard_of(name: u128) -> Rel {
        Rel(std::borrow::Cow::Owned(format!(
            "entries/{:02x}",
            (name >> 120) as u8
        )))
    }

    /// `entries/xx/<32 hex>`, the file of entry `name` (valid by construction).
    pub fn entry(name: u128) -> Rel {
        Rel(std::borrow::Cow::Owned(format!(
            "entries/{:02x}/{name:032x}",
            (name >> 120) as u8
        )))
    }

    /// One name, as a path.
    pub fn of(name: &Name) -> Rel {
        Rel(std::borrow::Cow::Owned(name.0.to_string()))
    }

    /// This path with `name` under it.
    pub fn join(&self, name: &Name) -> Rel {
        Rel(std::borrow::Cow::Owned(format!("{}/{}", self.0, name.0)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path above the last component (None at the top) and that component.
    pub fn split_last(&self) -> (Option<Rel>, Name) {
        match self.0.rsplit_once('/') {
            Some((parent, last)) => (
                Some(Rel(std::borrow::Cow::Owned(parent.to_string()))),
                Name(std::borrow::Cow::Owned(last.to_string())),
            ),
            None => (None, Name(std::borrow::Cow::Owned(self.0.to_string()))),
        }
    }
}

impl std::fmt::Display for Rel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_component_of_their_kind() {
        let hex = "0123456789abcdef0123456789abcdef";
        assert!(Name::new(Kind::Entry, hex).is_some());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a\0b",
            &hex.to_uppercase(),
            &hex[1..],
        ] {
            assert!(Name::new(Kind::Entry, bad).is_none(), "{bad:?}");
            assert!(Name::new(Kind::Shard, bad).is_none(), "{bad:?}");
            assert!(Name::new(Kind::Journal, bad).is_none(), "{bad:?}");
        }
        for bad in ["", ".", "..", "a/b", "../x", "a\0b"] {
            assert!(Name::new(Kind::Listed, bad).is_none(), "{bad:?}");
            assert!(Name::new(Kind::Made, bad).is_none(), "{bad:?}");
        }
        assert!(Name::new(Kind::Listed, &"x".repeat(MAX_NAME + 1)).is_none());
        assert!(Name::new(Kind::Listed, "\x1b]0;title\x07").is_some());
        assert!(Name::new(Kind::Made, "\x1b]0;title\x07").is_none());
        assert!(Name::new(Kind::Shard, "0a").is_some());
        assert!(Name::new(Kind::Shard, "0g").is_none());
        // As `journal::file_name` makes them.
        assert!(Name::new(Kind::Journal, "host-a.example-1234-abc.log").is_some());
        for bad in [
            "h-1-x/../../../victim/precious.log",
            "../../x/f.log",
            "h-1-.log",
            "h-x-1.log",
            "-1-1.log",
            "h-1-1.txt",
            "h h-1-1.log",
        ] {
            assert!(Name::new(Kind::Journal, bad).is_none(), "{bad:?}");
        }
    }
}
