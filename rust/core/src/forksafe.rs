//! State that a forked child must not inherit as it was.
//!
//! `fork()` copies only the calling thread. A mutex that another thread of the parent held
//! at that moment stays locked in the child for ever, and whatever that thread was doing
//! under it is left half done. The store therefore keeps its mutable state in mutexes that
//! a child replaces, without locking them, right after the fork (`Store::after_fork_child`,
//! run by an `os.register_at_fork` hook in Python), when it is the only thread there is.

use std::cell::UnsafeCell;
use std::sync::Mutex;

/// A `Mutex` that a forked child can replace without locking it.
pub struct ForkMutex<T>(UnsafeCell<Mutex<T>>);

// SAFETY: shared use goes through the inner Mutex (Sync for T: Send); the only other access,
// `reset`, is restricted by its contract to a single-threaded forked child.
unsafe impl<T: Send> Sync for ForkMutex<T> {}
// SAFETY: as Mutex<T>.
unsafe impl<T: Send> Send for ForkMutex<T> {}

impl<T> ForkMutex<T> {
    pub fn new(value: T) -> Self {
        ForkMutex(UnsafeCell::new(Mutex::new(value)))
    }

    /// Replaces the mutex by a new, unlocked one holding `value`, without locking it and
    /// without dropping what it held (that may be half-updated, and dropping a guard of the
    /// parent's, such as a lease, would remove the parent's file): the old value is leaked.
    ///
    /// # Safety
    /// Only in a forked child before it starts any other thread, with no guard or
    /// reference into this mutex alive in the calling thread: the child is then the only
    /// user of the memory.
    pub unsafe fn reset(&self, value: T) {
        // SAFETY: per the contract nothing else reads or writes the cell now.
        unsafe { std::ptr::write(self.0.get(), Mutex::new(value)) };
    }
}

impl<T> std::ops::Deref for ForkMutex<T> {
    type Target = Mutex<T>;
    fn deref(&self) -> &Mutex<T> {
        // SAFETY: the cell is only written by `reset`, whose contract excludes any
        // concurrent or outstanding use of this reference.
        unsafe { &*self.0.get() }
    }
}

impl<T> std::fmt::Debug for ForkMutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForkMutex")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_left_locked_is_replaced() {
        let m = ForkMutex::new(1);
        std::mem::forget(m.lock().unwrap()); // as a thread that vanished in a fork leaves it
        assert!(m.try_lock().is_err());
        // SAFETY: single-threaded here, no guard alive.
        unsafe { m.reset(2) };
        assert_eq!(*m.try_lock().unwrap(), 2);
    }
}
