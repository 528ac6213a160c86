//! Wrappers for the signal route's syscall guard (zmem_region's `guard` module): the C
//! library's calls whose pointers point at more pointers (writev's iovecs, sendmsg's msghdr),
//! which the seccomp filter sees only at the first level, and the signal calls that could take
//! SIGBUS or SIGSYS away from zmem. With the guard off (the handler route, the default) each
//! goes straight to the C library.
//!
//! - `readv`, `writev`, `preadv`, `pwritev` (and the `64`/`2` variants), `sendmsg`, `recvmsg`,
//!   `sendmmsg`, `recvmmsg`: made by `guard::call_for_program`, which brings back and pins
//!   every buffer the kernel will touch. (Made as plain system calls: they are no pthread
//!   cancellation points under the guard.)
//! - `sigprocmask`, `pthread_sigmask`: never block SIGBUS or SIGSYS (a fault or a trap while
//!   they are blocked ends the process).
//! - `sigaction` (and its alias `__sigaction`), `signal` (`bsd_signal`, `ssignal`),
//!   `__sysv_signal` (`sysv_signal`), `sigset` and `sigignore` for SIGBUS or SIGSYS: the
//!   program's handler is kept behind zmem's and runs for the signals that are not zmem's.
//! - `sigaltstack`: every thread `pthread_create` makes gets zmem's alternate signal stack
//!   (`guard::give_thread_signal_stack`; SIGBUS and SIGSYS are handled on it, so a stack in the
//!   region needs no signal frame); a stack the program sets there is recorded and reported
//!   as the thread's, and installed only if it has 64 KiB or more (`guard::PROGRAM_STACK_MIN`).
//!   An alternate stack in the heap stays in DRAM while it is installed.
//! - The exec wrappers (`ends.rs`), `posix_spawn[p]`, `popen` and `system` bring back the
//!   strings they pass.
//! - `read`, `write`, `pread[64]`, `pwrite[64]`, `recv[from]`, `send[to]`, `epoll_wait`,
//!   `poll`: a call with a buffer in the region is made as the trap would make it, without the
//!   trap; any other goes to the C library.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize};

use zmem_os::errno::KeepErrno;

use zmem_region::guard::{self, KernelSigaction};

use crate::fds::next;

/// The C library's `name` (looked up once into `cache`) called with the arguments; -1 with
/// ENOSYS where it has none.
macro_rules! real {
    ($cache:ident, $name:literal, fn($($a:ident: $t:ty),*) -> $r:ty) => {{
        static $cache: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
        let f = next(&$cache, $name);
        if f.is_null() {
            crate::set_errno(libc::ENOSYS);
            return (-1isize) as $r; // -1, or SIG_ERR for a handler
        }
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> $r>(f)($($a),*)
    }};
}

/// A system call's result as the C library returns it: -1 and errno for `-errno`.
fn from_kernel(r: i64) -> i64 {
    if (-4095..0).contains(&r) {
        crate::set_errno(-r as i32);
        -1
    } else {
        r
    }
}

/// A C library function of the guard's: with the guard active, made through
/// `guard::call_for_program` (buffers brought back and pinned, as the SIGSYS handler does) when
/// `$when` says so; else the C library's own. `always`: the calls whose pointers point at more
/// pointers (readv's iovecs, sendmsg's msghdr), which the filter sees only at the first level.
/// `trapped`: the calls with a buffer the filter checks, made here when the filter would trap
/// them (a trap costs ~2.8 µs: SIGSYS, its frame and sigreturn; redis's `read` into its query
/// buffer and `epoll_wait` into its event array cost it 15% of its GET rate below the budget);
/// any other such call goes to the C library as is (a cancellation point stays one).
macro_rules! guarded {
    ($when:ident, $name:ident, $lit:literal, $nr:expr, ($($a:ident: $t:ty),*) -> $r:ty, [$($arg:expr),*]) => {
        /// # Safety
        /// The C library's function of this name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            if guard::active() {
                let mut args = [0u64; 6];
                for (slot, v) in args.iter_mut().zip([$($arg as u64),*]) {
                    *slot = v;
                }
                if guarded!(@$when $nr, &args) {
                    return from_kernel(guard::call_for_program($nr, args)) as $r;
                }
            }
            real!(F, $lit, fn($($a: $t),*) -> $r)
        }
    };
    (@always $nr:expr, $args:expr) => {
        true
    };
    (@trapped $nr:expr, $args:expr) => {
        guard::would_trap($nr, $args)
    };
}

type Iov = *const libc::iovec;
type Off = libc::off_t;

guarded!(always, readv, c"readv", libc::SYS_readv, (fd: c_int, iov: Iov, n: c_int) -> isize, [fd, iov, n]);
guarded!(always, writev, c"writev", libc::SYS_writev, (fd: c_int, iov: Iov, n: c_int) -> isize, [fd, iov, n]);
guarded!(always, preadv, c"preadv", libc::SYS_preadv, (fd: c_int, iov: Iov, n: c_int, o: Off) -> isize, [fd, iov, n, o, 0]);
guarded!(always, pwritev, c"pwritev", libc::SYS_pwritev, (fd: c_int, iov: Iov, n: c_int, o: Off) -> isize, [fd, iov, n, o, 0]);
guarded!(always, preadv64, c"preadv64", libc::SYS_preadv, (fd: c_int, iov: Iov, n: c_int, o: Off) -> isize, [fd, iov, n, o, 0]);
guarded!(always, pwritev64, c"pwritev64", libc::SYS_pwritev, (fd: c_int, iov: Iov, n: c_int, o: Off) -> isize, [fd, iov, n, o, 0]);
guarded!(always, preadv2, c"preadv2", libc::SYS_preadv2, (fd: c_int, iov: Iov, n: c_int, o: Off, fl: c_int) -> isize, [fd, iov, n, o, 0, fl]);
guarded!(always, pwritev2, c"pwritev2", libc::SYS_pwritev2, (fd: c_int, iov: Iov, n: c_int, o: Off, fl: c_int) -> isize, [fd, iov, n, o, 0, fl]);
guarded!(always, sendmsg, c"sendmsg", libc::SYS_sendmsg, (fd: c_int, m: *const libc::msghdr, fl: c_int) -> isize, [fd, m, fl]);
guarded!(always, recvmsg, c"recvmsg", libc::SYS_recvmsg, (fd: c_int, m: *mut libc::msghdr, fl: c_int) -> isize, [fd, m, fl]);
guarded!(always, sendmmsg, c"sendmmsg", libc::SYS_sendmmsg, (fd: c_int, m: *mut libc::mmsghdr, n: u32, fl: c_int) -> c_int, [fd, m, n, fl]);
guarded!(always, recvmmsg, c"recvmmsg", libc::SYS_recvmmsg, (fd: c_int, m: *mut libc::mmsghdr, n: u32, fl: c_int, t: *mut libc::timespec) -> c_int, [fd, m, n, fl, t]);

// x86_64's glibc makes `recv` and `send` as recvfrom and sendto.
type Buf = *mut c_void;
type CBuf = *const c_void;
type Addr = *mut libc::sockaddr;
type AddrLen = *mut libc::socklen_t;

guarded!(trapped, read, c"read", libc::SYS_read, (fd: c_int, b: Buf, n: usize) -> isize, [fd, b, n]);
guarded!(trapped, write, c"write", libc::SYS_write, (fd: c_int, b: CBuf, n: usize) -> isize, [fd, b, n]);
guarded!(trapped, pread, c"pread", libc::SYS_pread64, (fd: c_int, b: Buf, n: usize, o: Off) -> isize, [fd, b, n, o]);
guarded!(trapped, pread64, c"pread64", libc::SYS_pread64, (fd: c_int, b: Buf, n: usize, o: Off) -> isize, [fd, b, n, o]);
guarded!(trapped, pwrite, c"pwrite", libc::SYS_pwrite64, (fd: c_int, b: CBuf, n: usize, o: Off) -> isize, [fd, b, n, o]);
guarded!(trapped, pwrite64, c"pwrite64", libc::SYS_pwrite64, (fd: c_int, b: CBuf, n: usize, o: Off) -> isize, [fd, b, n, o]);
guarded!(trapped, recv, c"recv", libc::SYS_recvfrom, (fd: c_int, b: Buf, n: usize, fl: c_int) -> isize, [fd, b, n, fl, 0, 0]);
guarded!(trapped, recvfrom, c"recvfrom", libc::SYS_recvfrom, (fd: c_int, b: Buf, n: usize, fl: c_int, a: Addr, l: AddrLen) -> isize, [fd, b, n, fl, a, l]);
guarded!(trapped, send, c"send", libc::SYS_sendto, (fd: c_int, b: CBuf, n: usize, fl: c_int) -> isize, [fd, b, n, fl, 0, 0]);
guarded!(trapped, sendto, c"sendto", libc::SYS_sendto, (fd: c_int, b: CBuf, n: usize, fl: c_int, a: *const libc::sockaddr, l: libc::socklen_t) -> isize, [fd, b, n, fl, a, l]);
guarded!(trapped, epoll_wait, c"epoll_wait", libc::SYS_epoll_wait, (ep: c_int, ev: *mut libc::epoll_event, n: c_int, t: c_int) -> c_int, [ep, ev, n, t]);
guarded!(trapped, poll, c"poll", libc::SYS_poll, (fds: *mut libc::pollfd, n: libc::nfds_t, t: c_int) -> c_int, [fds, n, t]);

/// Looks up the C library's functions behind the wrappers above (and `close`, `dup2`) now, at
/// start-up, by calling each on descriptor -1: zmem's own code calls them too (the SSD tier's `pread` in a fault),
/// and a first call from a SIGBUS handler would run dlsym, which takes the loader's lock that
/// the interrupted thread may hold.
pub(crate) fn resolve_libc() {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: every call names descriptor -1 (EBADF) and no buffer, or none (poll of nothing
    // with a zero timeout).
    unsafe {
        let (b, c) = (null_mut::<c_void>(), std::ptr::null::<c_void>());
        read(-1, b, 0);
        write(-1, c, 0);
        pread(-1, b, 0, 0);
        pread64(-1, b, 0, 0);
        pwrite(-1, c, 0, 0);
        pwrite64(-1, c, 0, 0);
        recv(-1, b, 0, 0);
        recvfrom(-1, b, 0, 0, null_mut(), null_mut());
        send(-1, c, 0, 0);
        sendto(-1, c, 0, 0, std::ptr::null(), 0);
        epoll_wait(-1, null_mut(), 1, 0);
        poll(null_mut(), 0, 0);
        readv(-1, std::ptr::null(), 0);
        writev(-1, std::ptr::null(), 0);
        preadv(-1, std::ptr::null(), 0, 0);
        pwritev(-1, std::ptr::null(), 0, 0);
        preadv64(-1, std::ptr::null(), 0, 0);
        pwritev64(-1, std::ptr::null(), 0, 0);
        preadv2(-1, std::ptr::null(), 0, 0, 0);
        pwritev2(-1, std::ptr::null(), 0, 0, 0);
        sendmsg(-1, std::ptr::null(), 0);
        recvmsg(-1, null_mut(), 0);
        sendmmsg(-1, null_mut(), 0, 0);
        recvmmsg(-1, null_mut(), 0, 0, null_mut());
        // fds.rs's wrappers look theirs up the same way.
        crate::fds::close(-1);
        crate::fds::dup2(-1, -1);
    }
    crate::set_errno(errno);
}

/// A set to block without SIGBUS and SIGSYS, where the guard needs them.
unsafe fn keep_ours(
    how: c_int,
    set: *const libc::sigset_t,
    local: &mut libc::sigset_t,
) -> *const libc::sigset_t {
    if set.is_null() || !guard::active() || how == libc::SIG_UNBLOCK {
        return set;
    }
    *local = *set;
    libc::sigdelset(local, libc::SIGBUS);
    libc::sigdelset(local, libc::SIGSYS);
    local
}

/// # Safety
/// C's sigprocmask.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    let mut local: libc::sigset_t = std::mem::zeroed();
    let set = keep_ours(how, set, &mut local);
    real!(
        F,
        c"sigprocmask",
        fn(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int
    )
}

/// # Safety
/// C's pthread_sigmask.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    let mut local: libc::sigset_t = std::mem::zeroed();
    let set = keep_ours(how, set, &mut local);
    real!(
        F,
        c"pthread_sigmask",
        fn(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int
    )
}

fn to_kernel(a: &libc::sigaction) -> KernelSigaction {
    // SAFETY: sigset_t's first word holds signals 1..=64, the kernel's mask.
    let mask = unsafe { *(&a.sa_mask as *const libc::sigset_t as *const u64) };
    KernelSigaction {
        handler: a.sa_sigaction,
        flags: a.sa_flags as u64,
        restorer: 0,
        mask,
    }
}

fn from_kernel_action(k: &KernelSigaction, out: &mut libc::sigaction) {
    out.sa_sigaction = k.handler;
    out.sa_flags = k.flags as c_int;
    // SAFETY: as in to_kernel.
    unsafe {
        libc::sigemptyset(&mut out.sa_mask);
        *(&mut out.sa_mask as *mut libc::sigset_t as *mut u64) = k.mask;
    }
}

/// # Safety
/// C's sigaction.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let new = (!act.is_null()).then(|| to_kernel(&*act));
    if let Some(previous) = guard::program_handler(sig, new) {
        if !old.is_null() {
            from_kernel_action(&previous, &mut *old);
        }
        return 0;
    }
    real!(
        F,
        c"sigaction",
        fn(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int
    )
}

/// # Safety
/// C's `__sigaction`, the C library's exported alias of `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn __sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    sigaction(sig, act, old)
}

/// With the guard active and `sig` SIGBUS or SIGSYS: records `handler` (with the C library's
/// `flags` for this entry point) as the program's and returns the one it replaces.
fn record_handler(sig: c_int, handler: libc::sighandler_t, flags: c_int) -> Option<usize> {
    let new = KernelSigaction {
        handler,
        flags: flags as u64,
        restorer: 0,
        mask: 0,
    };
    guard::program_handler(sig, Some(new)).map(|previous| previous.handler)
}

/// `sysv_signal`'s flags in the C library: the handler runs once (SA_RESETHAND), with the
/// signal not blocked (SA_NODEFER), and interrupted calls are not restarted.
const SYSV_FLAGS: c_int = libc::SA_RESETHAND | libc::SA_NODEFER;

/// Defines a `signal`-shaped entry point of the C library (`signal`, `bsd_signal`, `ssignal`,
/// `__sysv_signal`, `sysv_signal`): every one of them sets a disposition, so each must keep
/// SIGBUS and SIGSYS with zmem (zstd calls `__sysv_signal(SIGBUS, ...)` at start: unwrapped,
/// its handler replaced zmem's and the first fault on the heap ended the program).
macro_rules! signal_like {
    ($name:ident, $lit:literal, $flags:expr) => {
        /// # Safety
        /// The C library's function of this name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            sig: c_int,
            handler: libc::sighandler_t,
        ) -> libc::sighandler_t {
            if let Some(previous) = record_handler(sig, handler, $flags) {
                return previous;
            }
            real!(
                F,
                $lit,
                fn(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t
            )
        }
    };
}

signal_like!(signal, c"signal", libc::SA_RESTART);
signal_like!(bsd_signal, c"bsd_signal", libc::SA_RESTART);
signal_like!(ssignal, c"ssignal", libc::SA_RESTART);
signal_like!(__sysv_signal, c"__sysv_signal", SYSV_FLAGS);
signal_like!(sysv_signal, c"sysv_signal", SYSV_FLAGS);

/// # Safety
/// C's `sigset` (System V): SIG_HOLD blocks the signal, any other disposition is set and
/// unblocks it. SIGBUS and SIGSYS are never blocked (zmem's wrappers see to it), so for them
/// SIG_HOLD changes nothing and the previous handler is returned.
#[no_mangle]
pub unsafe extern "C" fn sigset(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
    const SIG_HOLD: libc::sighandler_t = 2;
    if disp == SIG_HOLD {
        if let Some(previous) = guard::program_handler(sig, None) {
            return previous.handler;
        }
    } else if let Some(previous) = record_handler(sig, disp, 0) {
        return previous;
    }
    real!(
        F,
        c"sigset",
        fn(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t
    )
}

/// # Safety
/// C's `sigignore` (System V): the signal's disposition becomes SIG_IGN.
#[no_mangle]
pub unsafe extern "C" fn sigignore(sig: c_int) -> c_int {
    if record_handler(sig, libc::SIG_IGN, 0).is_some() {
        return 0;
    }
    real!(F, c"sigignore", fn(sig: c_int) -> c_int)
}

/// # Safety
/// C's sigaltstack.
#[no_mangle]
pub unsafe extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
    // A thread with zmem's alternate stack keeps it; the program's is recorded.
    if let Some(r) = guard::program_sigaltstack(ss.as_ref(), old.as_mut()) {
        if r < 0 {
            crate::set_errno(-r as c_int);
            return -1;
        }
        return 0;
    }
    let r = {
        static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
        let f = next(&F, c"sigaltstack");
        if f.is_null() {
            crate::set_errno(libc::ENOSYS);
            return -1;
        }
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(*const libc::stack_t, *mut libc::stack_t) -> c_int,
        >(f)(ss, old)
    };
    if r == 0 && !ss.is_null() {
        let s = &*ss;
        if s.ss_flags & libc::SS_DISABLE == 0 && crate::runtime::in_region(s.ss_sp as usize) {
            // Signal frames may land in the region from now on (a Rust program's
            // stack-overflow stacks come from its mmap, the map space).
            zmem_os::thread::set_signal_frames_may_fault();
        }
        guard::alternate_stack(
            s.ss_sp as usize,
            s.ss_size,
            s.ss_flags & libc::SS_DISABLE != 0,
        );
    }
    r
}

type Argv = *const *const c_char;

type Spawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    Argv,
    Argv,
) -> c_int;

/// The arguments of a `posix_spawn` or `posix_spawnp`.
struct SpawnCall {
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
}

/// The C library's `posix_spawn` or `posix_spawnp` (`f`, null: ENOSYS), with the path and
/// the strings pinned (`guard::with_exec_strings`; for `posix_spawnp` the process's
/// environment too, where the child looks up PATH), and, under the guard, the file actions
/// and the attributes given as copies outside the heap ([`SpawnCopies`]).
///
/// Why copies: the child runs in the parent's memory with every handler reset to the default
/// (glibc's spawn child does so itself, with raw calls), so neither a fault (SIGBUS) nor a
/// trapped call (SIGSYS) can be served there: it ends the child. ninja's `addopen(0,
/// "/dev/null")` keeps its path in the heap, and the child's `openat` of it was trapped:
/// every build step of ninja (cmake's compiler check first) died with SIGSYS and no message.
unsafe fn spawn_with_strings(f: *mut c_void, call: SpawnCall, search_path: bool) -> c_int {
    let SpawnCall {
        pid,
        path,
        actions,
        attr,
        argv,
        envp,
    } = call;
    if f.is_null() {
        return libc::ENOSYS;
    }
    let spawn = std::mem::transmute::<*mut c_void, Spawn>(f);
    if !guard::active() {
        return spawn(pid, path, actions, attr, argv, envp);
    }
    let copies = zmem_os::thread::as_zmem(|| SpawnCopies::of(actions, attr));
    let (actions, attr) = copies.pointers(actions, attr);
    let run = || {
        guard::with_exec_strings(path as usize, argv as usize, envp as usize, || {
            spawn(pid, path, actions, attr, argv, envp)
        })
    };
    // posix_spawnp's child reads PATH from `environ`: held too, unless it is `envp` itself.
    let environ = crate::ends::environ_now();
    let r = if search_path && environ != envp {
        guard::with_exec_strings(0, 0, environ as usize, run)
    } else {
        run()
    };
    zmem_os::thread::as_zmem(|| drop(copies));
    r
}

/// glibc's `posix_spawn_file_actions_t` (posix/spawn.h): the actions are an array of
/// `struct __spawn_action` (posix/spawn_int.h) the spawn child reads.
#[repr(C)]
#[derive(Clone, Copy)]
struct FileActions {
    allocated: c_int,
    used: c_int,
    actions: *mut SpawnAction,
    pad: [c_int; 16],
}

/// glibc's `struct __spawn_action`: a tag, then a union whose largest member is
/// `open_action { int fd; char *path; int oflag; mode_t mode; }` (at offset 8).
#[repr(C)]
#[derive(Clone, Copy)]
struct SpawnAction {
    tag: c_int,
    words: [usize; 3],
}

const _: () = assert!(std::mem::size_of::<SpawnAction>() == 32);
const _: () = assert!(
    std::mem::size_of::<FileActions>() == std::mem::size_of::<libc::posix_spawn_file_actions_t>()
);

/// `__spawn_action` tags whose union holds a path: `spawn_do_open` (path in the second word)
/// and `spawn_do_chdir` (the first), the same in every glibc that has them.
const SPAWN_DO_OPEN: c_int = 2;
const SPAWN_DO_CHDIR: c_int = 3;

/// Copies of a spawn's file actions (their array and paths) and attributes in zmem's own
/// memory, never evicted: what the spawn child reads.
struct SpawnCopies {
    /// The head (pointing at the list's buffer, which stays where it is), the list, and the
    /// paths the list points at.
    actions: Option<(FileActions, Vec<SpawnAction>, Vec<std::ffi::CString>)>,
    attr: Option<libc::posix_spawnattr_t>,
}

impl SpawnCopies {
    /// # Safety
    /// `actions` and `attr` are null or initialised objects of their types.
    unsafe fn of(
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
    ) -> SpawnCopies {
        let actions = (!actions.is_null()).then(|| {
            let head = *actions.cast::<FileActions>();
            let n = head.used.max(0) as usize;
            let mut list = if n == 0 || head.actions.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(head.actions, n).to_vec()
            };
            let mut paths = Vec::new();
            for a in &mut list {
                let slot = match a.tag {
                    SPAWN_DO_OPEN => 1,
                    SPAWN_DO_CHDIR => 0,
                    _ => continue,
                };
                let p = a.words[slot] as *const c_char;
                if !p.is_null() {
                    let copy = std::ffi::CStr::from_ptr(p).to_owned();
                    a.words[slot] = copy.as_ptr() as usize;
                    paths.push(copy);
                }
            }
            let head = FileActions {
                allocated: list.len() as c_int,
                used: list.len() as c_int,
                actions: list.as_mut_ptr(),
                ..head
            };
            (head, list, paths)
        });
        SpawnCopies {
            actions,
            attr: (!attr.is_null()).then(|| *attr),
        }
    }

    /// The pointers to give the C library: the copies where there are some.
    fn pointers(
        &self,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
    ) -> (
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
    ) {
        let actions = match &self.actions {
            Some((head, _, _)) => {
                head as *const FileActions as *const libc::posix_spawn_file_actions_t
            }
            None => actions,
        };
        let attr = match &self.attr {
            Some(a) => a as *const libc::posix_spawnattr_t,
            None => attr,
        };
        (actions, attr)
    }
}

/// # Safety
/// C's posix_spawn.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> c_int {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let call = SpawnCall {
        pid,
        path,
        actions,
        attr,
        argv,
        envp,
    };
    spawn_with_strings(next(&F, c"posix_spawn"), call, false)
}

/// # Safety
/// C's posix_spawnp.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> c_int {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let call = SpawnCall {
        pid,
        path: file,
        actions,
        attr,
        argv,
        envp,
    };
    spawn_with_strings(next(&F, c"posix_spawnp"), call, true)
}

/// Runs `f`, a C library call that starts `sh -c command` through glibc's internal spawn
/// (`popen`, `system`), with the command and the environment's strings pinned, as
/// `posix_spawn` has them (`guard::with_exec_strings`). That spawn is glibc's own and never
/// reaches the `posix_spawn` wrapper: its child, in the parent's memory with every handler
/// reset, had the kernel read an evicted command for execve, got EFAULT and exited 127
/// (`popen` of a command built in the heap read nothing, every time, at a 4M budget). The
/// allocations `f` makes (popen's stream and its file actions, which the child reads) go to
/// zmem's own heap (`as_zmem`), never evicted; the program's free hands them back there.
unsafe fn shell_with_strings<R>(command: *const c_char, f: impl FnOnce() -> R) -> R {
    if !guard::active() {
        return f();
    }
    let environ = crate::ends::environ_now();
    guard::with_exec_strings(command as usize, 0, environ as usize, || {
        zmem_os::thread::as_zmem(f)
    })
}

/// # Safety
/// C's popen.
#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let f = next(&F, c"popen");
    if f.is_null() {
        crate::set_errno(libc::ENOSYS);
        return null_mut();
    }
    type Popen = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
    let popen = std::mem::transmute::<*mut c_void, Popen>(f);
    shell_with_strings(command, || popen(command, mode))
}

/// # Safety
/// C's system.
#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let f = next(&F, c"system");
    if f.is_null() {
        crate::set_errno(libc::ENOSYS);
        return -1;
    }
    let system =
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char) -> c_int>(f);
    shell_with_strings(command, || system(command))
}

/// # Safety
/// C's pthread_create. A program thread starts in `run_started`, which prepares zmem's
/// per-thread state before the program runs on it (`zmem_os::thread::prepare_this_thread`).
/// glibc allocates the new thread's DTV (the array through which every
/// thread-local is found) with malloc: made in zmem's own heap here, so that it is never
/// evicted. On the signal route zmem's fault handler runs on the program's threads and reaches
/// its thread-locals through that array; were it evicted, the handler would fault on it
/// while serving another fault.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let f = next(&F, c"pthread_create");
    if f.is_null() {
        return libc::ENOSYS;
    }
    type Create = unsafe extern "C" fn(
        *mut libc::pthread_t,
        *const libc::pthread_attr_t,
        extern "C" fn(*mut c_void) -> *mut c_void,
        *mut c_void,
    ) -> c_int;
    let create = std::mem::transmute::<*mut c_void, Create>(f);
    // zmem's own threads (made from zmem code) never fault on the region: no alternate stack.
    let program_thread = !crate::heap::is_internal();
    if program_thread && crate::runtime::lazy() {
        // Every program thread is made after zmem's start (lazy.rs).
        crate::runtime::start();
    }
    zmem_os::thread::as_zmem(|| {
        let guarded = guard::active();
        if !guarded && (!program_thread || !crate::runtime::ready()) {
            return create(thread, attr, start, arg);
        }
        // The new thread reads the global locale's LC_CTYPE data (malloc'd when the program
        // set its locale, so in the region) in glibc's start_thread, before it unblocks the
        // signals glibc blocked for the start: a fault there would end the process. That data
        // stays in DRAM until the thread runs its start routine, where signals are unblocked.
        // Without the guard nothing is kept; the thread is still prepared in `run_started`.
        let (stack_in_heap, held) = if guarded {
            let stack_in_heap = !attr.is_null() && hold_stack_top(attr);
            let ctype = GLOBAL_CTYPE.load(Relaxed);
            let held = guard::keep_in_memory(ctype, ctype + 2 * zmem_region::PAGE);
            (stack_in_heap, held)
        } else {
            (false, guard::Held::nothing())
        };
        let started = Box::into_raw(Box::new(Started {
            start,
            arg,
            held,
            program_thread,
        }));
        if program_thread {
            crate::threads::starting();
        }
        let mut rc = libc::EAGAIN;
        let mut call = || rc = create(thread, attr, run_started, started.cast());
        if !stack_in_heap || !on_heap_stack(&mut call) {
            call();
        }
        if rc != 0 {
            drop(Box::from_raw(started));
            if program_thread {
                crate::threads::not_started();
            }
        }
        rc
    })
}

/// How much of the top of a program-supplied stack is kept in DRAM for its thread's life: glibc
/// puts the thread's block there (`struct pthread`, ~2.3 KiB, with the rseq area the kernel
/// writes on every return to the thread and the tid it clears at the thread's exit, which
/// `pthread_join` waits on), the static thread-locals below it (zmem's fault handler reads its
/// own there), and the thread's first frames (glibc's start, run with every signal blocked).
const STACK_TOP_HELD: usize = 64 * 1024;

/// At most this many stack tops held at once: half of the guard's pin table, whose other half
/// the system calls need.
const STACK_TOPS_MAX: usize = 64;

/// Tops of program-supplied stacks kept in DRAM, by stack range, until the thread is joined (or
/// the stack is used for another thread, which means the old one is gone).
static STACK_TOPS: std::sync::Mutex<Vec<(usize, usize, guard::Held)>> =
    std::sync::Mutex::new(Vec::new());

/// A thread made on a stack of the program's in the region (`pthread_attr_setstack` with
/// malloc'd memory): the top of that stack is kept in DRAM ([`STACK_TOP_HELD`]) until the
/// thread is joined; the rest of it faults like any heap memory (the thread's faults are served
/// on zmem's alternate stack). Said once on stderr if no pin is free.
/// Returns whether the stack is in the region.
unsafe fn hold_stack_top(attr: *const libc::pthread_attr_t) -> bool {
    let (mut addr, mut size) = (null_mut::<c_void>(), 0usize);
    if libc::pthread_attr_getstack(attr, &mut addr, &mut size) != 0
        || addr.is_null()
        || size == 0
        || !guard::guarded(addr as usize)
    {
        return false;
    }
    let (lo, hi) = (addr as usize, addr as usize + size);
    let start = (hi - size.min(STACK_TOP_HELD)) & !(zmem_region::PAGE - 1);
    let mut tops = STACK_TOPS.lock().unwrap_or_else(|e| e.into_inner());
    // The same stack again: its previous thread has ended.
    tops.retain(|&(l, h, _)| h <= lo || l >= hi);
    if tops.len() < STACK_TOPS_MAX {
        let held = guard::keep_in_memory(start, hi);
        if held.is_held() {
            tops.push((lo, hi, held));
            return true;
        }
    }
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let msg = b"zmem: a thread is made on a stack in the program's heap \
(pthread_attr_setstack) and no pin is free to keep its top in memory (64 such threads at \
once at most, joined or not): an evicted page there can end the program; run with \
--fault-route handler\n";
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
    true
}

/// Bytes of the stack in the program's heap that [`on_heap_stack`] runs on.
const SWITCH_STACK: usize = 64 * 1024;

/// That stack (0: not made yet), and the call running on it; one at a time.
static SWITCH: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static SWITCH_CALL: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// Runs `f` on a stack in the program's heap (in the guarded region), for glibc's
/// pthread_create with a stack in the region. glibc blocks every signal around the clone with a
/// raw rt_sigprocmask whose old-mask argument is on the calling stack, and the new thread then
/// sets its mask from its thread block, at the top of its stack, in the region: the filter
/// traps that call, and with SIGSYS still blocked the kernel kills the process. With the
/// caller's frame in the region, glibc's blocking call is trapped too, and zmem's handler never
/// blocks SIGSYS or SIGBUS, so the new thread's trap is served. False if no stack could be made
/// (`f` has not run).
unsafe fn on_heap_stack(f: &mut dyn FnMut()) -> bool {
    extern "C" fn trampoline() {
        let call = SWITCH_CALL.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: set below to a `&mut dyn FnMut()` that lives until swapcontext returns; one
        // caller at a time (the lock).
        unsafe { (*call.cast::<&mut dyn FnMut()>())() };
    }
    let mut stack = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    if *stack == 0 {
        let p = crate::heap::alloc(SWITCH_STACK, 16, false, true);
        if p.is_null() || !guard::guarded(p as usize) {
            return false;
        }
        *stack = p as usize;
    }
    let mut caller: Box<libc::ucontext_t> = Box::new(std::mem::zeroed());
    let mut callee: Box<libc::ucontext_t> = Box::new(std::mem::zeroed());
    if libc::getcontext(&mut *callee) != 0 {
        return false;
    }
    callee.uc_stack.ss_sp = *stack as *mut c_void;
    callee.uc_stack.ss_size = SWITCH_STACK;
    callee.uc_link = &mut *caller;
    libc::makecontext(&mut *callee, trampoline, 0);
    let mut f = f;
    SWITCH_CALL.store(
        (&mut f as *mut &mut dyn FnMut()).cast(),
        std::sync::atomic::Ordering::Release,
    );
    let ok = libc::swapcontext(&mut *caller, &*callee) == 0;
    SWITCH_CALL.store(null_mut(), std::sync::atomic::Ordering::Release);
    ok
}

/// `thread` was joined: the top of its stack, if it was the program's, may leave DRAM.
fn release_stack_top(thread: libc::pthread_t) {
    // glibc's pthread_t is the address of the thread's block, at the top of its stack.
    let at = thread as usize;
    let mut tops = STACK_TOPS.lock().unwrap_or_else(|e| e.into_inner());
    if !tops.is_empty() {
        tops.retain(|&(l, h, _)| !(l..h).contains(&at));
    }
}

/// glibc's join `$name`, after which the top of the thread's stack, if it was the program's, may
/// leave DRAM.
macro_rules! join {
    ($name:ident, $lit:literal, ($($a:ident: $t:ty),*)) => {
        /// # Safety
        /// glibc's function of this name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            thread: libc::pthread_t,
            ret: *mut *mut c_void
            $(, $a: $t)*
        ) -> c_int {
            static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
            let f = next(&F, $lit);
            if f.is_null() {
                return libc::ENOSYS;
            }
            type Join = unsafe extern "C" fn(libc::pthread_t, *mut *mut c_void $(, $t)*) -> c_int;
            let rc = std::mem::transmute::<*mut c_void, Join>(f)(thread, ret $(, $a)*);
            if rc == 0 {
                release_stack_top(thread);
            }
            rc
        }
    };
}

join!(pthread_join, c"pthread_join", ());
join!(pthread_tryjoin_np, c"pthread_tryjoin_np", ());
join!(pthread_timedjoin_np, c"pthread_timedjoin_np", (abstime: *const libc::timespec));
join!(
    pthread_clockjoin_np,
    c"pthread_clockjoin_np",
    (clock: libc::clockid_t, abstime: *const libc::timespec)
);

/// A thread's start routine and argument, and what is kept in DRAM until it starts.
struct Started {
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
    held: guard::Held,
    /// Made by the program (not by zmem): it gets zmem's alternate signal stack.
    program_thread: bool,
}

extern "C" fn run_started(p: *mut c_void) -> *mut c_void {
    // SAFETY: made by Box::into_raw in pthread_create for this thread alone.
    let Started {
        start,
        arg,
        held,
        program_thread,
    } = *unsafe { Box::from_raw(p.cast::<Started>()) };
    if program_thread {
        guard::give_thread_signal_stack();
        zmem_os::thread::as_zmem(zmem_os::thread::prepare_this_thread);
        crate::threads::count_this_thread();
    }
    drop(held);
    start(arg)
}

/// The pid of a vfork child whose `ptrace(PTRACE_TRACEME)` waits for its exec (0: none).
///
/// On the signal route a fault is a SIGBUS in the faulting thread, and a traced process stops
/// at every signal until its tracer lets it go on. A debugger starts its program with vfork,
/// PTRACE_TRACEME in the child, then exec (gdb's `run`); the child shares the debugger's
/// memory, so between the two it faults on the debugger's heap (the environment, the argument
/// strings), stops for its tracer, and the tracer, still inside vfork until the child execs or
/// exits, never lets it go on: gdb hung at `run`. So a vfork child's TRACEME is made at its
/// exec, after the exec wrapper has brought back and pinned the strings the exec reads, with
/// nothing in between that touches the heap (`trace_me_if_owed`). The tracer sees nothing of
/// the child before the exec either way. The pid, not a flag: the child shares this static
/// with its parent, which must not take the child's call as its own.
static TRACE_ME_AT_EXEC: AtomicI32 = AtomicI32::new(0);

/// # Safety
/// C's ptrace, whose last three arguments are variadic in glibc's prototype: on x86-64 they are
/// passed in the same registers as fixed ones, and every request takes at most these three.
#[no_mangle]
pub unsafe extern "C" fn ptrace(
    request: c_int,
    pid: libc::pid_t,
    addr: *mut c_void,
    data: *mut c_void,
) -> libc::c_long {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let f = next(&F, c"ptrace");
    if f.is_null() {
        crate::set_errno(libc::ENOSYS);
        return -1;
    }
    if request == libc::PTRACE_TRACEME as c_int && guard::active() && in_vfork_child() {
        TRACE_ME_AT_EXEC.store(libc::getpid(), Relaxed);
        return 0;
    }
    type Ptrace = unsafe extern "C" fn(c_int, ...) -> libc::c_long;
    std::mem::transmute::<*mut c_void, Ptrace>(f)(request, pid, addr, data)
}

/// Whether this process runs in its parent's memory (a vfork child).
fn in_vfork_child() -> bool {
    // SAFETY: getpid and getppid cannot fail.
    unsafe { zmem_os::remote::same_address_space(libc::getpid(), libc::getppid()) }
}

/// Makes the PTRACE_TRACEME this vfork child was asked for (see `TRACE_ME_AT_EXEC`): called
/// by the exec wrappers right before the C library's exec, with its strings in memory.
pub(crate) fn trace_me_if_owed() {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    if TRACE_ME_AT_EXEC.load(Relaxed) == me && TRACE_ME_AT_EXEC.swap(0, Relaxed) == me {
        static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
        let f = next(&F, c"ptrace");
        if !f.is_null() {
            type Ptrace = unsafe extern "C" fn(c_int, ...) -> libc::c_long;
            // SAFETY: the C library's ptrace; TRACEME reads no pointer. A failure (already
            // traced) is what the program's own call would have met; its exec goes on.
            unsafe {
                std::mem::transmute::<*mut c_void, Ptrace>(f)(
                    libc::PTRACE_TRACEME as c_int,
                    0,
                    null_mut::<c_void>(),
                    null_mut::<c_void>(),
                )
            };
        }
    }
}

/// The global locale's LC_CTYPE data (see `ctype_data`) as the last `setlocale` that could
/// change it left it; 0 before (the C locale's data is static, never in the heap).
///
/// Looked up here and not in `pthread_create`: `duplocale` takes glibc's locale lock, and a
/// thread can reach `pthread_create` while it holds that lock (zmem starting its threads in a
/// malloc made by `newlocale`, as in libp11-kit's constructor in gdb's process). glibc's
/// rwlock then answers EDEADLK, which duplocale ignores: its unlock released the lock under
/// newlocale, whose own unlock left the lock's reader count at -1, and the program's next
/// `setlocale` waited forever (tests/c/locale_ctor.c).
static GLOBAL_CTYPE: AtomicUsize = AtomicUsize::new(0);

/// # Safety
/// C's setlocale.
#[no_mangle]
pub unsafe extern "C" fn setlocale(category: c_int, locale: *const c_char) -> *mut c_char {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let f = next(&F, c"setlocale");
    if f.is_null() {
        return null_mut(); // setlocale's failure, which sets no errno
    }
    type SetLocale = unsafe extern "C" fn(c_int, *const c_char) -> *mut c_char;
    let r = std::mem::transmute::<*mut c_void, SetLocale>(f)(category, locale);
    // A query (NULL) changes nothing; a failed call leaves the locale as it was.
    if !r.is_null() && !locale.is_null() && (category == libc::LC_ALL || category == libc::LC_CTYPE)
    {
        let _errno = KeepErrno::new();
        let ctype = zmem_os::thread::as_zmem(ctype_data);
        GLOBAL_CTYPE.store(ctype, Relaxed);
    }
    r
}

/// The address of the global locale's LC_CTYPE data (`struct __locale_data`, the first of
/// glibc's `locale_t` fields), 0 if unknown. Its pointer is not exported; a copy of the global
/// locale shares it. Takes glibc's locale lock: only from `setlocale`, after the C library's
/// own call has released it.
fn ctype_data() -> usize {
    #[repr(C)]
    struct LocaleStruct {
        locales: [usize; 13],
    }
    // SAFETY: duplocale of the global locale returns a new locale object (or NULL), whose
    // first field is the array of per-category data pointers; freed right after.
    unsafe {
        // LC_GLOBAL_LOCALE is ((locale_t) -1) in <locale.h>.
        let copy = libc::duplocale(usize::MAX as libc::locale_t);
        if copy.is_null() {
            return 0;
        }
        let data = (*copy.cast::<LocaleStruct>()).locales[libc::LC_CTYPE as usize];
        libc::freelocale(copy);
        data
    }
}
