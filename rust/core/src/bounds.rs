//! The bounds of the numbers a caller gives the cache, each written once: a size is at
//! least one byte, a duration at most `MAX_DURATION`, a max age from `MIN_MAX_AGE` to
//! `MAX_DURATION`. The store's options (`Store::open`) and its stored settings (CONFIG,
//! written and read by `settings.rs`) keep them; the binding hands Python's numbers to them
//! as they are, so that a value refused here is refused the same way from every caller.

use crate::error::StoreError;
use std::time::Duration;

/// The longest duration an option may hold (about 31 years): longer is a mistake, and
/// deadlines computed from it would overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(1_000_000_000);

/// The shortest max age: CONFIG holds whole seconds, so a shorter age would be stored as
/// none, and a file holding none is not used at all (every process would ignore the
/// cache's settings, the budget with them).
pub const MIN_MAX_AGE: Duration = Duration::from_secs(1);

/// A byte size given as `n` (a budget): at least one byte, since a budget of none would
/// evict every entry as soon as it is written (no limit is `None`, not 0). Signed, so
/// that a caller's negative number is refused here too; `Invalid` names `name`.
pub fn positive_size(name: &str, n: i128) -> Result<u64, StoreError> {
    u64::try_from(n)
        .ok()
        .filter(|&size| size > 0)
        .ok_or_else(|| StoreError::Invalid(format!("{name} must be positive (or None), got {n}")))
}

/// A duration option: at most `MAX_DURATION`.
pub fn check_duration(name: &str, d: Duration) -> Result<(), StoreError> {
    if d > MAX_DURATION {
        return Err(StoreError::Invalid(format!(
            "{name} must be at most {} seconds, got {d:?}",
            MAX_DURATION.as_secs()
        )));
    }
    Ok(())
}

/// A duration given as a number of seconds (Python's float): finite, not negative, and at
/// most `MAX_DURATION`.
pub fn duration_secs(name: &str, secs: f64) -> Result<Duration, StoreError> {
    let max = MAX_DURATION.as_secs_f64();
    if !secs.is_finite() || secs < 0.0 || secs > max {
        return Err(StoreError::Invalid(format!(
            "{name} must be a number of seconds from 0 to {} (about 31 years), got {secs}",
            MAX_DURATION.as_secs()
        )));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|e| StoreError::Invalid(format!("{name}: {e} (got {secs})")))
}

fn too_short(name: &str, secs: f64) -> StoreError {
    StoreError::Invalid(format!(
        "{name} must be at least {} second (or None), got {secs}",
        MIN_MAX_AGE.as_secs()
    ))
}

/// A max age: from `MIN_MAX_AGE` to `MAX_DURATION`.
pub fn check_max_age(name: &str, age: Duration) -> Result<(), StoreError> {
    if age < MIN_MAX_AGE {
        return Err(too_short(name, age.as_secs_f64()));
    }
    check_duration(name, age)
}

/// A max age given as a number of seconds (Python's float): `check_max_age` of it. A
/// finite number below the shortest age, negative ones included, is refused as too short;
/// anything else that is not a duration as `duration_secs` refuses it.
pub fn max_age_secs(name: &str, secs: f64) -> Result<Duration, StoreError> {
    if secs.is_finite() && secs < MIN_MAX_AGE.as_secs_f64() {
        return Err(too_short(name, secs));
    }
    let age = duration_secs(name, secs)?;
    check_max_age(name, age)?;
    Ok(age)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid<T: std::fmt::Debug>(r: Result<T, StoreError>) -> String {
        match r {
            Err(StoreError::Invalid(msg)) => msg,
            other => panic!("not refused as invalid: {other:?}"),
        }
    }

    #[test]
    fn a_size_is_at_least_one_byte_and_fits_in_64_bits() {
        assert_eq!(positive_size("max_size", 1).unwrap(), 1);
        assert_eq!(positive_size("m", u64::MAX.into()).unwrap(), u64::MAX);
        for bad in [0, -1, i128::from(u64::MAX) + 1] {
            let msg = invalid(positive_size("max_size", bad));
            assert!(msg.starts_with("max_size must be positive"), "{msg}");
            assert!(msg.ends_with(&format!("got {bad}")), "{msg}");
        }
    }

    #[test]
    fn a_duration_is_finite_not_negative_and_at_most_the_maximum() {
        assert_eq!(duration_secs("t", 0.0).unwrap(), Duration::ZERO);
        assert_eq!(
            duration_secs("t", 1.5).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            duration_secs("t", MAX_DURATION.as_secs_f64()).unwrap(),
            MAX_DURATION
        );
        for bad in [-0.5, f64::NAN, f64::INFINITY, 1e10, 1e20] {
            let msg = invalid(duration_secs("lock_timeout", bad));
            assert!(
                msg.starts_with("lock_timeout must be a number of seconds"),
                "{msg}"
            );
        }
        assert!(check_duration("t", MAX_DURATION).is_ok());
        let msg = invalid(check_duration(
            "lease_time",
            MAX_DURATION + Duration::from_secs(1),
        ));
        assert!(msg.starts_with("lease_time must be at most"), "{msg}");
    }

    #[test]
    fn a_max_age_is_one_second_at_least() {
        assert!(check_max_age("max_age", MIN_MAX_AGE).is_ok());
        assert!(check_max_age("max_age", MAX_DURATION).is_ok());
        for short in [
            Duration::ZERO,
            Duration::from_millis(500),
            Duration::from_millis(999),
        ] {
            let msg = invalid(check_max_age("max_age", short));
            assert!(
                msg.starts_with("max_age must be at least 1 second"),
                "{msg}"
            );
        }
        assert!(check_max_age("max_age", MAX_DURATION + Duration::from_secs(1)).is_err());
        assert_eq!(max_age_secs("a", 1.5).unwrap(), Duration::from_millis(1500));
        for short in [0.5, 0.0, -1.0] {
            let msg = invalid(max_age_secs("max_age", short));
            assert_eq!(
                msg,
                format!("max_age must be at least 1 second (or None), got {short}")
            );
        }
        for bad in [f64::NAN, f64::INFINITY, 1e12] {
            let msg = invalid(max_age_secs("max_age", bad));
            assert!(
                msg.starts_with("max_age must be a number of seconds"),
                "{msg}"
            );
        }
    }
}
