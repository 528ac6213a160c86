//! What each x86_64 system call reads or writes in user memory, for the syscall guard
//! (`guard.rs`): which arguments the seccomp filter checks against the region's range, and
//! which bytes the SIGSYS handler brings back before the call runs.
//!
//! The rule of thumb: an argument that is a pointer the kernel follows is listed with the size
//! it reads or writes; a call whose pointers point at more pointers (iovecs, msghdrs, execve's
//! arrays) is trapped whatever its arguments, because the filter sees only the first level. A
//! call this table does not know has all six arguments checked, and a page brought back behind
//! each one that falls in the region. Calls that must never be re-issued from the handler
//! (clone, fork: the child would return into the handler's frame) are always allowed.

use crate::config::PAGE;

/// One piece of user memory a call's arguments name (argument indices 0..6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arg {
    /// Argument `.0` points at as many bytes as argument `.1` says.
    Bytes(u8, u8),
    /// Argument `.0` points at argument `.1` elements of `.2` bytes.
    Array(u8, u8, u16),
    /// Argument `.0` points at `.1` bytes (a page where the size is not known).
    Fixed(u8, u16),
    /// futex(2): argument `.0` points at `.1` bytes for the commands (argument 1, less its
    /// flags) whose bits are set in `.2`, and is ignored by the others, whose callers may leave
    /// anything in that register (parking_lot's FUTEX_WAIT through libc's syscall() left a
    /// stale pointer into the region in r8, brought back for nothing).
    ForFutex(u8, u16, u16),
    /// Argument `.0` points at as many bytes as the `u32` at argument `.1` says (socklen_t).
    LenAt(u8, u8),
    /// Argument `.0` is a NUL-terminated string.
    Str(u8),
    /// Argument `.0` is a NULL-terminated array of strings (execve's argv and envp).
    StrArray(u8),
    /// Argument `.0` is an array of argument `.1` iovecs, each naming a buffer.
    Iovec(u8, u8),
    /// Argument `.0` is a msghdr (name, iovecs, control).
    Msghdr(u8),
    /// Argument `.0` is an array of argument `.1` mmsghdrs.
    Mmsghdr(u8, u8),
}

impl Arg {
    /// The argument that is the pointer.
    pub(crate) fn ptr(self) -> u8 {
        match self {
            Arg::Bytes(p, _)
            | Arg::Array(p, _, _)
            | Arg::Fixed(p, _)
            | Arg::ForFutex(p, _, _)
            | Arg::LenAt(p, _)
            | Arg::Str(p)
            | Arg::StrArray(p)
            | Arg::Iovec(p, _)
            | Arg::Msghdr(p)
            | Arg::Mmsghdr(p, _) => p,
        }
    }
}

/// What the filter does with a call. Every trap depends on an argument's value: a filter
/// outlives execve, and a program exec'd without zmem (or before its own handler is in place)
/// must never be trapped, since an unhandled SIGSYS ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Let it through: no user memory, memory management by address only (mmap, madvise,
    /// munmap: the kernel never reads those pages), or calls the handler must not re-issue.
    Allow,
    /// Trap it when one of the listed pointers falls in the region. For pointers behind
    /// pointers (iovecs, msghdrs, execve's arrays) only the first level is seen here: the
    /// preload library's wrappers of those calls bring the rest back.
    Check(&'static [Arg]),
    /// rt_sigprocmask: checked like `Check` on its sets; trapped, SIGBUS and SIGSYS are taken
    /// out of a set to block (the preload's sigprocmask wrappers do the same for the rest).
    SigMask,
    /// rt_sigaction: checked on its structs; trapped for SIGBUS or SIGSYS, the program's
    /// handler is chained behind zmem's.
    SigAction,
    /// sigaltstack: checked on its structs; an alternate stack in the region stays pinned.
    SigAltStack,
    /// Answered ENOSYS by the filter itself: the kernel would read or write user memory later,
    /// outside any call (io_uring, Linux AIO, futex_waitv's list); programs fall back to plain
    /// calls.
    Refuse,
}

use Arg::*;
use Rule::*;

/// Call numbers newer than the libc crate's list (x86_64).
mod nr {
    pub const FUTEX_WAKE: i64 = 454;
    pub const FUTEX_WAIT: i64 = 455;
    pub const MAP_SHADOW_STACK: i64 = 453;
    pub const IO_PGETEVENTS: i64 = 333;
    pub const MSEAL: i64 = 462;
    pub const SET_MEMPOLICY_HOME_NODE: i64 = 450;
    pub const FCHMODAT2: i64 = 452;
    pub const FUTEX_WAITV: i64 = 449;
    pub const MEMFD_SECRET: i64 = 447;
    pub const PROCESS_MRELEASE: i64 = 448;
    pub const EPOLL_PWAIT2: i64 = 441;
    pub const MOUNT_SETATTR: i64 = 442;
    pub const FACCESSAT2: i64 = 439;
    pub const OPENAT2: i64 = 437;
    pub const CLOSE_RANGE: i64 = 436;
    pub const PIDFD_GETFD: i64 = 438;
    pub const CLONE3: i64 = 435;
    pub const PIDFD_OPEN: i64 = 434;
    pub const FSPICK: i64 = 433;
    pub const FSMOUNT: i64 = 432;
    pub const FSOPEN: i64 = 430;
    pub const MOVE_MOUNT: i64 = 429;
    pub const OPEN_TREE: i64 = 428;
    pub const PIDFD_SEND_SIGNAL: i64 = 424;
    pub const IO_URING_SETUP: i64 = 425;
    pub const IO_URING_ENTER: i64 = 426;
    pub const IO_URING_REGISTER: i64 = 427;
    pub const RSEQ: i64 = 334;
    pub const PROCESS_MADVISE: i64 = 440;
}

/// A page behind argument `i` (a struct of unknown size).
const fn page(i: u8) -> Arg {
    Fixed(i, PAGE as u16)
}

const UNKNOWN: &[Arg] = &[page(0), page(1), page(2), page(3), page(4), page(5)];
const STAT: u16 = 144;
const TIMESPEC: u16 = 16;
const SIGSET: u16 = 8;
const FDSET: u16 = 128;
const SIGINFO: u16 = 128;
const ITIMER: u16 = 32;
const RUSAGE: u16 = 144;
/// futex(2) commands (linux/futex.h) whose argument 3 is a timeout: WAIT, LOCK_PI,
/// WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2 (for the others it is a count or unused).
const FUTEX_TIMEOUT: u16 = 1 << 0 | 1 << 6 | 1 << 9 | 1 << 11 | 1 << 13;
/// futex(2) commands that use argument 4 (uaddr2): REQUEUE, CMP_REQUEUE, WAKE_OP,
/// WAIT_REQUEUE_PI, CMP_REQUEUE_PI.
const FUTEX_UADDR2: u16 = 1 << 3 | 1 << 4 | 1 << 5 | 1 << 11 | 1 << 12;

/// Whether futex(2) with operation `op` (argument 1) follows an argument listed for
/// `commands` (`Arg::ForFutex`); the command is `op` less FUTEX_PRIVATE_FLAG and
/// FUTEX_CLOCK_REALTIME.
pub(crate) fn futex_uses(commands: u16, op: u64) -> bool {
    let command = op & 0x7f;
    command < 16 && commands & (1 << command) != 0
}

/// The rule for system call `nr` (x86_64 numbers).
#[allow(non_upper_case_globals)] // libc names the call numbers SYS_read, ...
pub(crate) fn rule(nr: i64) -> Rule {
    use libc::*;
    match nr {
        SYS_read | SYS_write | SYS_pread64 | SYS_pwrite64 => Check(&[Bytes(1, 2)]),
        SYS_open
        | SYS_access
        | SYS_truncate
        | SYS_chdir
        | SYS_mkdir
        | SYS_rmdir
        | SYS_creat
        | SYS_unlink
        | SYS_chmod
        | SYS_chown
        | SYS_lchown
        | SYS_mknod
        | SYS_chroot
        | SYS_acct
        | SYS_umount2
        | SYS_swapon
        | SYS_swapoff
        | SYS_memfd_create
        | nr::FSOPEN => Check(&[Str(0)]),
        SYS_stat | SYS_lstat => Check(&[Str(0), Fixed(1, STAT)]),
        SYS_fstat => Check(&[Fixed(1, STAT)]),
        SYS_newfstatat => Check(&[Str(1), Fixed(2, STAT)]),
        SYS_statx => Check(&[Str(1), Fixed(4, 256)]),
        SYS_statfs => Check(&[Str(0), Fixed(1, 120)]),
        SYS_fstatfs => Check(&[Fixed(1, 120)]),
        SYS_poll => Check(&[Array(0, 1, 8)]),
        SYS_ppoll => Check(&[Array(0, 1, 8), Fixed(2, TIMESPEC), Fixed(3, SIGSET)]),
        SYS_select => Check(&[
            Fixed(1, FDSET),
            Fixed(2, FDSET),
            Fixed(3, FDSET),
            Fixed(4, TIMESPEC),
        ]),
        SYS_pselect6 => Check(&[
            Fixed(1, FDSET),
            Fixed(2, FDSET),
            Fixed(3, FDSET),
            Fixed(4, TIMESPEC),
            Fixed(5, TIMESPEC),
        ]),
        SYS_epoll_wait => Check(&[Array(1, 2, 12)]),
        SYS_epoll_pwait => Check(&[Array(1, 2, 12), Fixed(4, SIGSET)]),
        nr::EPOLL_PWAIT2 => Check(&[Array(1, 2, 12), Fixed(3, TIMESPEC), Fixed(4, SIGSET)]),
        SYS_epoll_ctl => Check(&[Fixed(3, 12)]),
        SYS_futex => Check(&[
            Fixed(0, 4),
            ForFutex(3, TIMESPEC, FUTEX_TIMEOUT),
            ForFutex(4, 4, FUTEX_UADDR2),
        ]),
        nr::FUTEX_WAKE => Check(&[Fixed(0, 4)]),
        nr::FUTEX_WAIT => Check(&[Fixed(0, 4), Fixed(4, TIMESPEC)]),
        SYS_nanosleep => Check(&[Fixed(0, TIMESPEC), Fixed(1, TIMESPEC)]),
        SYS_clock_nanosleep => Check(&[Fixed(2, TIMESPEC), Fixed(3, TIMESPEC)]),
        SYS_clock_gettime | SYS_clock_getres | SYS_clock_settime => Check(&[Fixed(1, TIMESPEC)]),
        SYS_gettimeofday | SYS_settimeofday => Check(&[Fixed(0, 16), Fixed(1, 8)]),
        SYS_time => Check(&[Fixed(0, 8)]),
        SYS_getitimer => Check(&[Fixed(1, ITIMER)]),
        SYS_setitimer => Check(&[Fixed(1, ITIMER), Fixed(2, ITIMER)]),
        SYS_timer_create => Check(&[Fixed(1, 64), Fixed(2, 4)]),
        SYS_timer_settime | SYS_timerfd_settime => Check(&[Fixed(2, ITIMER), Fixed(3, ITIMER)]),
        SYS_timer_gettime | SYS_timerfd_gettime => Check(&[Fixed(1, ITIMER)]),
        SYS_connect | SYS_bind => Check(&[Bytes(1, 2)]),
        SYS_accept | SYS_accept4 | SYS_getsockname | SYS_getpeername => {
            Check(&[LenAt(1, 2), Fixed(2, 4)])
        }
        SYS_sendto => Check(&[Bytes(1, 2), Bytes(4, 5)]),
        SYS_recvfrom => Check(&[Bytes(1, 2), LenAt(4, 5), Fixed(5, 4)]),
        SYS_setsockopt => Check(&[Bytes(3, 4)]),
        SYS_getsockopt => Check(&[LenAt(3, 4), Fixed(4, 4)]),
        SYS_socketpair => Check(&[Fixed(3, 8)]),
        SYS_pipe | SYS_pipe2 => Check(&[Fixed(0, 8)]),
        SYS_sendfile => Check(&[Fixed(2, 8)]),
        SYS_splice => Check(&[Fixed(1, 8), Fixed(3, 8)]),
        SYS_copy_file_range => Check(&[Fixed(1, 8), Fixed(3, 8)]),
        SYS_wait4 => Check(&[Fixed(1, 4), Fixed(3, RUSAGE)]),
        SYS_waitid => Check(&[Fixed(2, SIGINFO), Fixed(4, RUSAGE)]),
        SYS_getrusage => Check(&[Fixed(1, RUSAGE)]),
        SYS_uname => Check(&[Fixed(0, 390)]),
        SYS_sysinfo => Check(&[Fixed(0, 112)]),
        SYS_times => Check(&[Fixed(0, 32)]),
        SYS_getrlimit | SYS_setrlimit => Check(&[Fixed(1, 16)]),
        SYS_prlimit64 => Check(&[Fixed(2, 16), Fixed(3, 16)]),
        SYS_getdents | SYS_getdents64 => Check(&[Bytes(1, 2)]),
        SYS_getcwd | SYS_getrandom | SYS_sethostname | SYS_setdomainname => Check(&[Bytes(0, 1)]),
        SYS_readlink => Check(&[Str(0), Bytes(1, 2)]),
        SYS_readlinkat => Check(&[Str(1), Bytes(2, 3)]),
        SYS_rename | SYS_link | SYS_symlink | SYS_pivot_root => Check(&[Str(0), Str(1)]),
        SYS_openat
        | SYS_mkdirat
        | SYS_mknodat
        | SYS_fchownat
        | SYS_unlinkat
        | SYS_fchmodat
        | SYS_faccessat
        | nr::FACCESSAT2
        | nr::FCHMODAT2
        | nr::OPEN_TREE
        | nr::FSPICK => Check(&[Str(1)]),
        nr::OPENAT2 => Check(&[Str(1), Bytes(2, 3)]),
        SYS_renameat | SYS_renameat2 | SYS_linkat => Check(&[Str(1), Str(3)]),
        SYS_symlinkat => Check(&[Str(0), Str(2)]),
        SYS_utimensat | SYS_futimesat => Check(&[Str(1), Fixed(2, 32)]),
        SYS_utime | SYS_utimes => Check(&[Str(0), Fixed(1, 32)]),
        SYS_inotify_add_watch => Check(&[Str(1)]),
        SYS_setxattr | SYS_lsetxattr | SYS_getxattr | SYS_lgetxattr => {
            Check(&[Str(0), Str(1), Bytes(2, 3)])
        }
        SYS_fsetxattr | SYS_fgetxattr => Check(&[Str(1), Bytes(2, 3)]),
        SYS_listxattr | SYS_llistxattr => Check(&[Str(0), Bytes(1, 2)]),
        SYS_flistxattr => Check(&[Bytes(1, 2)]),
        SYS_removexattr | SYS_lremovexattr => Check(&[Str(0), Str(1)]),
        SYS_fremovexattr => Check(&[Str(1)]),
        SYS_sched_setaffinity | SYS_sched_getaffinity => Check(&[Bytes(2, 1)]),
        SYS_sched_setparam | SYS_sched_getparam => Check(&[Fixed(1, 4)]),
        SYS_sched_setscheduler => Check(&[Fixed(2, 4)]),
        SYS_sched_rr_get_interval => Check(&[Fixed(1, TIMESPEC)]),
        SYS_sched_setattr => Check(&[Fixed(1, 56)]),
        SYS_sched_getattr => Check(&[Bytes(1, 2)]),
        SYS_getcpu => Check(&[Fixed(0, 4), Fixed(1, 4)]),
        SYS_getresuid | SYS_getresgid => Check(&[Fixed(0, 4), Fixed(1, 4), Fixed(2, 4)]),
        SYS_getgroups | SYS_setgroups => Check(&[Array(1, 0, 4)]),
        SYS_arch_prctl => Check(&[Fixed(1, 8)]),
        SYS_prctl => Check(&[Fixed(1, 64), Fixed(2, 64), Fixed(3, 64), Fixed(4, 64)]),
        SYS_rt_sigpending | SYS_rt_sigsuspend => Check(&[Fixed(0, SIGSET)]),
        SYS_rt_sigtimedwait => Check(&[Fixed(0, SIGSET), Fixed(1, SIGINFO), Fixed(2, TIMESPEC)]),
        SYS_rt_sigqueueinfo => Check(&[Fixed(2, SIGINFO)]),
        SYS_rt_tgsigqueueinfo => Check(&[Fixed(3, SIGINFO)]),
        nr::PIDFD_SEND_SIGNAL => Check(&[Fixed(2, SIGINFO)]),
        SYS_signalfd | SYS_signalfd4 => Check(&[Fixed(1, SIGSET)]),
        SYS_get_robust_list => Check(&[Fixed(1, 8), Fixed(2, 8)]),
        SYS_syslog | SYS_bpf => Check(&[Bytes(1, 2)]),
        SYS_msgrcv | SYS_msgsnd => Check(&[Fixed(1, 8), Bytes(1, 2)]),
        SYS_semop => Check(&[Array(1, 2, 6)]),
        SYS_mq_open => Check(&[Str(0), Fixed(3, 64)]),
        SYS_mq_unlink => Check(&[Str(0)]),
        SYS_mq_timedsend => Check(&[Bytes(1, 2), Fixed(4, TIMESPEC)]),
        SYS_mq_timedreceive => Check(&[Bytes(1, 2), Fixed(3, 4), Fixed(4, TIMESPEC)]),
        SYS_mount => Check(&[Str(0), Str(1), Str(2), Fixed(4, PAGE as u16)]),
        nr::MOVE_MOUNT => Check(&[Str(1), Str(3)]),
        SYS_fanotify_mark => Check(&[Str(4)]),
        SYS_finit_module => Check(&[Str(1)]),
        nr::MOUNT_SETATTR => Check(&[Str(1), Bytes(3, 4)]),
        nr::PROCESS_MADVISE => Check(&[Array(1, 2, 16)]),
        SYS_fcntl => Check(&[Fixed(2, 32)]),
        SYS_ioctl => Check(&[Fixed(2, PAGE as u16)]),
        SYS_readv | SYS_writev | SYS_preadv | SYS_pwritev | SYS_preadv2 | SYS_pwritev2
        | SYS_vmsplice => Check(&[Iovec(1, 2)]),
        SYS_process_vm_readv | SYS_process_vm_writev => Check(&[Iovec(1, 2), Iovec(3, 4)]),
        SYS_sendmsg | SYS_recvmsg => Check(&[Msghdr(1)]),
        SYS_sendmmsg => Check(&[Mmsghdr(1, 2)]),
        SYS_recvmmsg => Check(&[Mmsghdr(1, 2), Fixed(4, TIMESPEC)]),
        SYS_rt_sigprocmask => SigMask,
        SYS_rt_sigaction => SigAction,
        SYS_sigaltstack => SigAltStack,
        SYS_io_setup | nr::IO_URING_SETUP | nr::FUTEX_WAITV => Refuse,
        // Memory by address only, no user memory, or never to be re-issued from a handler.
        // execve too: a child of posix_spawn or vfork runs glibc's code with zmem's SIGSYS
        // handler reset to the default, where a trap would end it; the preload's exec and
        // posix_spawn wrappers bring back and pin the strings instead.
        SYS_execve
        | SYS_execveat
        | SYS_close
        | SYS_lseek
        | SYS_mmap
        | SYS_mprotect
        | SYS_munmap
        | SYS_brk
        | SYS_rt_sigreturn
        | SYS_sched_yield
        | SYS_mremap
        | SYS_msync
        | SYS_madvise
        | SYS_shmget
        | SYS_shmat
        | SYS_shmdt
        | SYS_dup
        | SYS_dup2
        | SYS_dup3
        | SYS_pause
        | SYS_alarm
        | SYS_getpid
        | SYS_socket
        | SYS_shutdown
        | SYS_listen
        | SYS_clone
        | nr::CLONE3
        | SYS_fork
        | SYS_vfork
        | SYS_exit
        | SYS_exit_group
        | SYS_kill
        | SYS_tkill
        | SYS_tgkill
        | SYS_flock
        | SYS_fsync
        | SYS_fdatasync
        | SYS_ftruncate
        | SYS_fchdir
        | SYS_fchmod
        | SYS_fchown
        | SYS_umask
        | SYS_getuid
        | SYS_getgid
        | SYS_setuid
        | SYS_setgid
        | SYS_geteuid
        | SYS_getegid
        | SYS_setpgid
        | SYS_getppid
        | SYS_getpgrp
        | SYS_setsid
        | SYS_setreuid
        | SYS_setregid
        | SYS_setresuid
        | SYS_setresgid
        | SYS_getpgid
        | SYS_setfsuid
        | SYS_setfsgid
        | SYS_getsid
        | SYS_gettid
        | SYS_readahead
        | SYS_mlock
        | SYS_munlock
        | SYS_mlockall
        | SYS_munlockall
        | SYS_mlock2
        | SYS_set_tid_address
        | SYS_set_robust_list
        | nr::RSEQ
        | SYS_eventfd
        | SYS_eventfd2
        | SYS_epoll_create
        | SYS_epoll_create1
        | SYS_timerfd_create
        | SYS_inotify_init
        | SYS_inotify_init1
        | SYS_inotify_rm_watch
        | SYS_fallocate
        | SYS_fadvise64
        | SYS_sync
        | SYS_syncfs
        | SYS_sync_file_range
        | SYS_tee
        | SYS_userfaultfd
        | SYS_membarrier
        | nr::PIDFD_OPEN
        | nr::PIDFD_GETFD
        | nr::CLOSE_RANGE
        | SYS_kcmp
        | SYS_setns
        | SYS_unshare
        | SYS_getpriority
        | SYS_setpriority
        | SYS_sched_get_priority_max
        | SYS_sched_get_priority_min
        | SYS_sched_getscheduler
        | SYS_ioprio_get
        | SYS_ioprio_set
        | SYS_personality
        | SYS_io_destroy
        | SYS_io_getevents
        | SYS_io_submit
        | SYS_io_cancel
        | nr::IO_PGETEVENTS
        | nr::IO_URING_ENTER
        | nr::IO_URING_REGISTER
        | SYS_pkey_alloc
        | SYS_pkey_free
        | SYS_pkey_mprotect
        | nr::MEMFD_SECRET
        | nr::PROCESS_MRELEASE
        | SYS_timer_delete
        | SYS_timer_getoverrun
        | SYS_fanotify_init
        | nr::FSMOUNT
        | nr::MAP_SHADOW_STACK
        | nr::MSEAL
        | nr::SET_MEMPOLICY_HOME_NODE => Allow,
        _ => Check(UNKNOWN),
    }
}

/// Argument bit mask the filter checks for `rule` (bit i: argument i).
pub(crate) fn checked_args(rule: Rule) -> u8 {
    match rule {
        Check(args) => args.iter().fold(0, |m, a| {
            let extra = match *a {
                LenAt(_, l) => 1 << l,
                _ => 0,
            };
            m | (1 << a.ptr()) | extra
        }),
        SigMask | SigAction => 0b110,
        SigAltStack => 0b11,
        Allow | Refuse => 0,
    }
}

/// The pieces of memory a call's arguments name, for the rules with special handling too.
pub(crate) fn args_of(rule: Rule) -> &'static [Arg] {
    match rule {
        Check(args) => args,
        SigMask => &[Fixed(1, 8), Fixed(2, 8)],
        SigAction => &[Fixed(1, 32), Fixed(2, 32)],
        SigAltStack => &[Fixed(0, 24), Fixed(1, 24)],
        Allow | Refuse => &[],
    }
}

/// Highest system call number the filter's table covers one by one; above it every call is
/// checked on all six arguments.
pub(crate) const MAX_NR: i64 = 470;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_that_must_not_be_reissued_are_allowed() {
        for nr in [
            libc::SYS_clone,
            nr::CLONE3,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_rt_sigreturn,
            libc::SYS_execve,
            libc::SYS_exit,
            libc::SYS_exit_group,
        ] {
            assert_eq!(rule(nr), Allow, "syscall {nr}");
        }
    }

    #[test]
    fn pointer_masks_follow_the_table() {
        assert_eq!(checked_args(rule(libc::SYS_read)), 0b10);
        assert_eq!(checked_args(rule(libc::SYS_recvfrom)), 0b110010);
        assert_eq!(checked_args(rule(libc::SYS_getsockopt)), 0b11000);
        assert_eq!(checked_args(rule(9999)), 0b111111);
        assert_eq!(checked_args(rule(libc::SYS_mmap)), 0);
        // Pointers behind pointers: the filter sees the first level.
        assert_eq!(checked_args(rule(libc::SYS_writev)), 0b10);
        assert_eq!(checked_args(rule(libc::SYS_execve)), 0);
    }

    #[test]
    fn every_listed_pointer_is_a_real_argument() {
        for nr in 0..=MAX_NR {
            let args = args_of(rule(nr));
            for a in args {
                assert!(a.ptr() < 6, "syscall {nr}: {a:?}");
            }
        }
    }

    #[test]
    fn futex_pointers_count_only_for_the_commands_that_use_them() {
        let (wait, wake, requeue, wake_op) = (0u64, 1u64, 3u64, 5u64);
        let (wait_bitset, wait_requeue_pi, lock_pi2) = (9u64, 11u64, 13u64);
        let (private, realtime) = (128u64, 256u64);
        for op in [
            wait,
            wait | private,
            wait_bitset | private | realtime,
            lock_pi2,
        ] {
            assert!(futex_uses(FUTEX_TIMEOUT, op), "{op}");
            assert!(!futex_uses(FUTEX_UADDR2, op), "{op}: uaddr2 is not read");
        }
        for op in [wake | private, requeue, wake_op | private] {
            assert!(
                !futex_uses(FUTEX_TIMEOUT, op),
                "{op}: argument 3 is a count"
            );
        }
        for op in [requeue, wake_op | private, wait_requeue_pi] {
            assert!(futex_uses(FUTEX_UADDR2, op), "{op}");
        }
        assert!(futex_uses(FUTEX_TIMEOUT, wait_requeue_pi));
        assert!(!futex_uses(FUTEX_UADDR2, wake));
        // Unknown commands name nothing (the call's own EINVAL follows).
        assert!(!futex_uses(u16::MAX, 100));
        // The filter still checks both (it cannot tell the command): a trap, then nothing.
        assert_eq!(checked_args(rule(libc::SYS_futex)), 0b11001);
    }
}
