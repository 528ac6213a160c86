//! A lock that fork can take before and reset after: a plain flag, no queue of waiters.
//!
//! A parking lock (std, parking_lot) keeps sleeping waiters in a queue, which a forked child
//! inherits without their threads: measured, a bash under zmem hung in its atfork handler when
//! the lock had been handed to a waiter that existed only in the parent. With a flag, the
//! forking thread takes the lock in its `pthread_atfork` prepare hook, keeps it across fork
//! ([`SpinLock::hold`]), and both processes call [`SpinLock::reset`] afterwards. Meant for short
//! critical sections (waiters spin, then yield).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering::*};

pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, which holds `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
unsafe impl<T: Send> Send for SpinLock<T> {}

pub struct SpinGuard<'a, T>(&'a SpinLock<T>);

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        SpinGuard(self)
    }

    /// Takes the lock and keeps it past this call (a fork's prepare hook); [`SpinLock::reset`]
    /// gives it back.
    pub fn hold(&self) {
        std::mem::forget(self.lock());
    }

    /// Releases the lock whoever holds it: after fork, in the parent and in the child.
    pub fn reset(&self) {
        self.locked.store(false, Release);
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.0.locked.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_add_under_the_lock_without_losing_an_update() {
        let l = SpinLock::new(0u64);
        crate::test_support::add_from_threads(4, 10_000, || *l.lock() += 1);
        assert_eq!(*l.lock(), 40_000);
    }

    #[test]
    fn a_held_lock_is_released_by_reset() {
        let l = Arc::new(SpinLock::new(()));
        l.hold();
        let l2 = l.clone();
        let waiter = std::thread::spawn(move || drop(l2.lock()));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished(), "the lock was free while held");
        l.reset();
        waiter.join().unwrap();
    }
}
