//! How a process ends or replaces itself: `_exit`, `_Exit` and the `exec` family. Each first
//! hands the process's forked children the pages of theirs that only its region holds
//! (`runtime::hand_off`; `exit` does so through its on_exit hook), and `_exit` reports the
//! process's end as `exit` does (`runtime::end`): daemon(3) and python's
//! `os._exit` end a parent with `_exit`, and a shell that starts a background subshell and then
//! `exec`s its server replaces the parent, its region and its threads with it. Without the
//! hand-off such a child is stopped (it would read zeros where its data was). The variadic
//! `execl`, `execlp` and `execle` cannot be defined in stable Rust and are not covered.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::AtomicPtr;

use crate::fds::next;
use crate::runtime;

/// # Safety
/// C's _exit.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    if crate::heap::is_internal() {
        // In zmem's own code (a signal handler that interrupted it calls _exit): the report
        // could wait for a lock this thread holds; the pages are still handed off.
        runtime::hand_off();
    } else {
        runtime::end(status);
    }
    libc::syscall(libc::SYS_exit_group, status);
    unreachable!("exit_group returned")
}

/// # Safety
/// C's _Exit (the same call).
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    _exit(status)
}

type Argv = *const *const c_char;

/// On the signal route, the kernel copies the path and the strings from kernel mode: those in
/// the evicted heap are brought back first and stay until the call returns (see zmem_region's
/// `guard`).
fn with_strings<R>(path: *const c_char, argv: Argv, envp: Argv, f: impl FnOnce() -> R) -> R {
    zmem_region::guard::with_exec_strings(path as usize, argv as usize, envp as usize, f)
}

extern "C" {
    static environ: Argv;
}

/// The process's environment array (read on the program's thread, which is allowed).
pub(crate) fn environ_now() -> Argv {
    // SAFETY: reading the C library's `environ` pointer itself, on the program's thread.
    unsafe { environ }
}

/// The C library's own `name` (looked up once into `cache`), or ENOSYS where it has none.
macro_rules! forward {
    ($cache:ident, $name:literal, fn($($a:ident: $t:ty),*)) => {{
        static $cache: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
        let f = next(&$cache, $name);
        if f.is_null() {
            crate::set_errno(libc::ENOSYS);
            return -1;
        }
        runtime::hand_off();
        crate::guarded::trace_me_if_owed();
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> c_int>(f)($($a),*)
    }};
}

/// # Safety
/// C's execve.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
    with_strings(path, argv, envp, || {
        forward!(
            F,
            c"execve",
            fn(path: *const c_char, argv: Argv, envp: Argv)
        )
    })
}

/// # Safety
/// C's execv.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
    with_strings(path, argv, environ_now(), || {
        forward!(F, c"execv", fn(path: *const c_char, argv: Argv))
    })
}

/// # Safety
/// C's execvp.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
    with_strings(file, argv, environ_now(), || {
        forward!(F, c"execvp", fn(file: *const c_char, argv: Argv))
    })
}

/// # Safety
/// glibc's execvpe.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
    with_strings(file, argv, envp, || {
        forward!(
            F,
            c"execvpe",
            fn(file: *const c_char, argv: Argv, envp: Argv)
        )
    })
}

/// # Safety
/// C's fexecve.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    with_strings(std::ptr::null(), argv, envp, || {
        forward!(F, c"fexecve", fn(fd: c_int, argv: Argv, envp: Argv))
    })
}
