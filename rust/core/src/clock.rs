//! Wall-clock time as the journals record it, and this host's name as file names and
//! leases carry it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A suffix unique across processes and hosts: host, pid, a per-process counter, time.
pub fn unique_suffix() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{}.{}.{}.{:x}",
        hostname(),
        std::process::id(),
        n,
        unix_ns()
    )
}

/// Longest host name written into a file name or a lease.
const MAX_HOST_LEN: usize = 64;

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// This host's name, for journal, temp, trash and lease file names (looked up once per
/// process), sanitized as `sanitize_host` does; `"unknown"` if it cannot be read.
pub fn hostname() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(lookup_hostname)
}

/// This machine's host name, or `"unknown"`.
fn lookup_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname NUL-terminates
    // when the name fits, and we stop at the first NUL or the end of the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    sanitize_host(&name)
}

/// A host name safe to write as one word of a lease line and inside a file name.
pub fn sanitize_host(host: &str) -> String {
    let cleaned: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_HOST_LEN)
        .collect();
    if cleaned.is_empty() {
        "unknown".to_string()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_sanitized() {
        assert_eq!(sanitize_host("a b\tc/d"), "a_b_c_d");
        assert_eq!(sanitize_host(""), "unknown");
        assert_eq!(sanitize_host(&"h".repeat(100)).len(), MAX_HOST_LEN);
        assert!(!hostname().is_empty());
        assert!(!hostname().contains(char::is_whitespace));
        assert_eq!(hostname(), sanitize_host(hostname()));
    }
}
