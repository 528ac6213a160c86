//! The program's threads, counted, so that the process ends when the last of them does.
//!
//! A main thread may end with `pthread_exit` and leave its other threads running; glibc ends the
//! process (`exit(0)`) when the last thread ends. It counts every thread it made, zmem's too,
//! so under zmem that moment never came: the process lived on with only zmem's threads, which
//! block every asynchronous signal, so SIGTERM stayed pending and only SIGKILL ended it. A
//! forked child whose forking thread was not its main thread (CPython's
//! `test_3_join_in_forked_from_thread`) lived on beside its `zmem-child` thread the same way.
//!
//! So zmem counts the program's own threads (those its `pthread_create` starts, and the
//! process's first, which ends the process by returning from main unless it calls
//! `pthread_exit`), sees each one end through a thread-specific key's destructor, and when
//! the count reaches zero and only zmem's threads remain (checked in /proc, so a thread zmem
//! did not count, made before zmem started or by a raw clone, keeps the process alive, as it
//! would without zmem), calls `exit(0)` on that last thread, as glibc does. The count belongs
//! to one process: a forked child (glibc's fork or a raw one) starts again from one.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::OnceLock;

/// This process's pid (high 32 bits) and its number of live program threads (low 32 bits),
/// changed together; a pid other than the caller's means the count is the parent's.
static COUNT: AtomicU64 = AtomicU64::new(0);

/// The key's values: a program thread that will be counted out when it ends, and one that found
/// itself the last and ends the process after its other destructors have run.
const COUNTED: usize = 1;
const LAST: usize = 2;

/// How long the last thread waits for the others that were counted out, but have not yet left
/// the kernel, to be gone before it ends the process.
const OTHERS_GONE_WAIT_MS: u32 = 200;

fn key() -> Option<libc::pthread_key_t> {
    static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `ended` is a destructor of the signature pthread_key_create takes.
        let r = unsafe { libc::pthread_key_create(&mut key, Some(ended)) };
        (r == 0).then_some(key)
    })
}

/// Makes the key at start-up, among the first of the process (glibc keeps the first 32 in
/// the thread itself; later ones in blocks it allocates).
pub fn prepare() {
    key();
}

/// Adds `delta` to this process's count and returns the new count. A count of another
/// process is the parent's: a fork copies only the thread that called it, so a new process
/// starts with one program thread. (Not counted from /proc: a zmem thread that has just
/// started has no name yet and looks like the program's.)
fn add(delta: i32) -> i32 {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32 as u64;
    let mut cur = COUNT.load(Acquire);
    loop {
        let count = if cur >> 32 == pid {
            cur as u32 as i32
        } else {
            1
        };
        let new = count + delta;
        match COUNT.compare_exchange_weak(cur, pid << 32 | new as u32 as u64, AcqRel, Acquire) {
            Ok(_) => return new,
            Err(now) => cur = now,
        }
    }
}

/// A program thread is about to start one (before the C library's `pthread_create`).
pub fn starting() {
    add(1);
}

/// The C library refused the thread [`starting`] counted.
pub fn not_started() {
    add(-1);
}

/// The calling program thread is counted out when it ends (run on each thread zmem's
/// `pthread_create` starts, and by `pthread_exit` for the others, the process's first).
pub fn count_this_thread() {
    if let Some(key) = key() {
        // SAFETY: a key made above; the value is a tag, never dereferenced.
        unsafe {
            if libc::pthread_getspecific(key).is_null() {
                libc::pthread_setspecific(key, COUNTED as *const c_void);
            }
        }
    }
}

/// The key's destructor, on a program thread that is ending (glibc has set the value to NULL).
extern "C" fn ended(value: *mut c_void) {
    let Some(key) = key() else { return };
    let value = value as usize;
    if value == COUNTED {
        if add(-1) <= 0 && crate::runtime::ready() {
            // The last: the process ends after this thread's other destructors have run
            // (glibc calls them again while any was set anew).
            // SAFETY: the key made above; a tag value.
            unsafe { libc::pthread_setspecific(key, LAST as *const c_void) };
        }
    } else if value == LAST {
        if others_gone() {
            // What glibc does when its last thread ends.
            // SAFETY: exit runs the program's atexit handlers and zmem's report, on a program
            // thread, as glibc's own call would.
            unsafe { libc::exit(0) };
        }
        // A live thread zmem did not count keeps the process alive; it is counted now.
        let others = zmem_os::thread::other_program_threads() as i32;
        add(others - add(0));
    }
}

/// Whether no other program thread runs, waiting a little for those counted out that are still
/// leaving the kernel.
fn others_gone() -> bool {
    for _ in 0..OTHERS_GONE_WAIT_MS {
        if zmem_os::thread::other_program_threads() == 0 {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

/// # Safety
/// C's pthread_exit. The thread is counted out as it ends (the process's first thread is
/// counted only here: it ends the process by returning from main otherwise).
#[no_mangle]
pub unsafe extern "C" fn pthread_exit(value: *mut c_void) -> ! {
    static F: std::sync::atomic::AtomicPtr<c_void> =
        std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    if crate::runtime::ready() && !crate::heap::is_internal() {
        count_this_thread();
    }
    let f = crate::fds::next(&F, c"pthread_exit");
    if !f.is_null() {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> !>(f)(value);
    }
    // No C library pthread_exit to forward to: the thread ends without its cleanup.
    loop {
        libc::syscall(libc::SYS_exit, 0);
    }
}
