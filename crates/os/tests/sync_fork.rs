//! zmem's locks across fork (crates/os/src/sync.rs): a test binary of its own, since its
//! threads and children would disturb the unit tests that count the process's threads.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zmem_os::sync::{Condvar, Mutex};

/// The reason for the module: a lock held by another thread at a fork is that thread's alone;
/// the child's own locks (other words) keep working, a new thread's included. (With
/// parking_lot, whose waiters share one table, a child's new thread could wait for good on a
/// bucket lock a parent thread held at the fork.)
#[test]
fn a_forked_child_locks_while_the_parent_churns_locks() {
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new((Mutex::new(0u64), Condvar::new()));
    let churn: Vec<_> = (0..3)
        .map(|_| {
            let (stop, shared) = (stop.clone(), shared.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    let mut g = shared.0.lock();
                    *g += 1;
                    shared.1.notify_all();
                    let _ = shared.1.wait_for(&mut g, Duration::from_micros(50));
                }
            })
        })
        .collect();
    for _ in 0..50 {
        // SAFETY: the child uses only locks of its own and ends with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let own = Arc::new((Mutex::new(0u32), Condvar::new()));
            let o = own.clone();
            let t = std::thread::spawn(move || {
                *o.0.lock() = 1;
                o.1.notify_all();
            });
            let mut g = own.0.lock();
            while *g == 0 {
                own.1.wait_for(&mut g, Duration::from_millis(10));
            }
            drop(g);
            let ok = t.join().is_ok();
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        let t0 = Instant::now();
        loop {
            // SAFETY: waits for the child forked above, without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                // SAFETY: the child forked above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("a forked child hung on its own locks");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
    stop.store(true, Relaxed);
    churn.into_iter().for_each(|t| t.join().unwrap());
    assert!(*shared.0.lock() > 0);
}
