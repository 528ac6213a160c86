//! zmem's locks: std's futex locks with parking_lot's shape (no poisoning, `Condvar::wait` on
//! `&mut guard`, `try_lock_for`).
//!
//! Why not parking_lot: its waiters queue in one hash table for the whole process, guarded by
//! per-bucket locks that any lock's slow path and any condvar's wake-up take. A fork copies
//! that table with whatever bucket lock another thread held at that instant, and in the child
//! nobody releases it: the child's next contended lock or new thread (whose first park grows
//! the table, taking every bucket) waits for good. Found in session 54 (CI, and 3 runs in 300
//! of `main_thread_exits`): a forked child's new thread parked in parking_lot's
//! `grow_hashtable`, the parent's evictor having been in a timed condvar wait at the fork. A
//! std lock is one futex word of its own: a fork copies only the locks zmem's fork hooks
//! already take care of.
//!
//! A poisoned lock (a panic while it was held) is taken as it is: zmem's threads stop the
//! process on a panic (`thread::or_abort`), and a program thread's zmem call that panics is
//! turned into the kernel's answer by its caller; neither reads half-made state afterwards
//! where that would matter more than the process going on.

use std::sync::{PoisonError, TryLockError};
use std::time::{Duration, Instant};

pub use std::sync::{MutexGuard, RwLockReadGuard, RwLockWriteGuard};

/// A mutual-exclusion lock ([`std::sync::Mutex`] without poisoning).
#[derive(Default, Debug)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Tries a few times, spinning then yielding the CPU, before it sleeps in the kernel, as
    /// parking_lot did: on two CPUs the holder often waits for the CPU its waiter spins on.
    /// With std's short spin alone, two threads faulting on a region had an access p99 of
    /// 837-870 µs against parking_lot's 582-727 (`bench region --threads 2`, session 54).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        for i in 0..10u32 {
            if let Some(g) = self.try_lock() {
                return g;
            }
            if i < 3 {
                (0..2u32 << i).for_each(|_| std::hint::spin_loop());
            } else {
                std::thread::yield_now();
            }
        }
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The lock if it comes free within `timeout`: asked again every 100 µs (for reports and
    /// diagnostics, which must not wait for good on a lock a stuck thread holds).
    pub fn try_lock_for(&self, timeout: Duration) -> Option<MutexGuard<'_, T>> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(g) = self.try_lock() {
                return Some(g);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A reader-writer lock ([`std::sync::RwLock`] without poisoning).
#[derive(Default, Debug)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub const fn new(value: T) -> RwLock<T> {
        RwLock(std::sync::RwLock::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A condition variable for [`Mutex`] ([`std::sync::Condvar`]; waits take the guard by
/// `&mut`, as parking_lot's do).
#[derive(Default, Debug)]
pub struct Condvar(std::sync::Condvar);

/// Whether a timed wait ended by its timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar(std::sync::Condvar::new())
    }

    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    pub fn notify_all(&self) {
        self.0.notify_all();
    }

    /// Waits for a notification (or a spurious wake-up), the lock released meanwhile.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        through(guard, |g| {
            (self.0.wait(g).unwrap_or_else(PoisonError::into_inner), ())
        })
    }

    /// [`Condvar::wait`] for at most `timeout`.
    pub fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        through(guard, |g| {
            let (g, r) = self
                .0
                .wait_timeout(g, timeout)
                .unwrap_or_else(PoisonError::into_inner);
            (g, WaitTimeoutResult(r.timed_out()))
        })
    }

    /// [`Condvar::wait`] until `deadline` at the latest.
    pub fn wait_until<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return WaitTimeoutResult(true);
        }
        self.wait_for(guard, left)
    }
}

/// Runs `f` on the guard behind `slot` (std's waits take and give back the guard by value) and
/// puts the guard it returns back in its place.
fn through<'a, T, R>(
    slot: &mut MutexGuard<'a, T>,
    f: impl FnOnce(MutexGuard<'a, T>) -> (MutexGuard<'a, T>, R),
) -> R {
    // An unwind between the read and the write would drop the guard twice: stop instead (std's
    // waits panic only when one condvar is used with two mutexes, a bug).
    struct Abort;
    impl Drop for Abort {
        fn drop(&mut self) {
            std::process::abort();
        }
    }
    let bomb = Abort;
    // SAFETY: the guard is moved out of `slot` and a guard of the same lock, returned by the
    // wait, is written back before `slot` is used again; nothing in between can unwind (above).
    let r = unsafe {
        let (back, r) = f(std::ptr::read(slot));
        std::ptr::write(slot, back);
        r
    };
    std::mem::forget(bomb);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_excludes_and_counts_under_threads() {
        let m = Mutex::new(0u64);
        crate::test_support::add_from_threads(4, 10_000, || *m.lock() += 1);
        assert_eq!(*m.lock(), 40_000);
    }

    #[test]
    fn try_lock_fails_while_held_and_try_lock_for_gives_up() {
        let m = Mutex::new(1);
        let g = m.lock();
        assert!(m.try_lock().is_none());
        let t0 = Instant::now();
        assert!(m.try_lock_for(Duration::from_millis(20)).is_none());
        assert!(t0.elapsed() >= Duration::from_millis(20));
        drop(g);
        assert_eq!(*m.try_lock_for(Duration::from_millis(20)).unwrap(), 1);
    }

    #[test]
    fn a_poisoned_lock_is_taken_as_it_is() {
        let m = Arc::new(Mutex::new(5));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("poison it");
        })
        .join();
        assert_eq!(*m.lock(), 5);
        assert!(m.try_lock().is_some());
        let rw = Arc::new(RwLock::new(7));
        let rw2 = rw.clone();
        let _ = std::thread::spawn(move || {
            let _g = rw2.write();
            panic!("poison it");
        })
        .join();
        assert_eq!(*rw.read(), 7);
        *rw.write() = 8;
        assert_eq!(Arc::try_unwrap(rw).unwrap().into_inner(), 8);
    }

    #[test]
    fn condvar_waits_wake_and_time_out() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p = pair.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            *p.0.lock() = true;
            p.1.notify_all();
        });
        let mut g = pair.0.lock();
        while !*g {
            pair.1.wait(&mut g);
        }
        // The guard still holds the lock after the wait.
        assert!(pair.0.try_lock().is_none());
        drop(g);
        t.join().unwrap();
        let mut g = pair.0.lock();
        assert!(pair
            .1
            .wait_for(&mut g, Duration::from_millis(5))
            .timed_out());
        let past = Instant::now() - Duration::from_millis(1);
        assert!(pair.1.wait_until(&mut g, past).timed_out());
        *g = false;
        assert!(!*g);
    }
}
