//! The syscall guard: what makes the signal route (`FaultRoute::Signal`) safe for a whole
//! program. On that route a user-mode access to an evicted page raises SIGBUS in the faulting
//! thread, which serves it (`signal.rs`); a *kernel-mode* access (read(2) into an evicted
//! buffer, a futex word, epoll_wait's array, a path string) would fail with EFAULT instead. So
//! every system call whose arguments point into the region is stopped before it runs: a
//! seccomp filter answers SECCOMP_RET_TRAP for it, the kernel raises SIGSYS in the calling
//! thread, and this module's handler
//!
//! 1. pins the bytes the call will read or write (`syscalls.rs` knows which: the evictor leaves
//!    pinned pages alone),
//! 2. touches each of their pages from user mode (an evicted one comes back through SIGBUS),
//! 3. makes the call itself from a trampoline page at a fixed address, which the filter lets
//!    through, retrying a few times if it still met EFAULT (a page evicted between the pin's
//!    publication and the evictor's check of it), and
//! 4. puts the result where the program's syscall instruction expects it.
//!
//! Calls whose arguments do not point into the region pass the filter untouched (a few dozen
//! BPF instructions). The region must lie at a fixed address ([`GUARDED_BASE`]) and the
//! trampoline at [`TRAMPOLINE`]: a filter outlives execve, and in a program exec'd from this
//! one (zmem or not) it must trap nothing that program owns, and let through the trampoline of
//! a zmem program that installs its own guard.
//!
//! SIGBUS and SIGSYS are kept usable: rt_sigprocmask is trapped and never blocks them, and a
//! program's own SIGBUS/SIGSYS handlers are recorded and called for signals that are not
//! zmem's. What stays unsupported is listed in docs/DESIGN-NOTES.md ("The syscall guard").

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Once;

use crate::config::PAGE;
use crate::error::RegionError;
use crate::syscalls::{self, Arg, Rule};

/// Where a region guarded by the filter starts (16 TiB): far below where the kernel places
/// mappings (top-down from 128 TiB) and above any program's brk heap, so that in a program
/// exec'd without zmem no pointer falls in the range the inherited filter checks.
pub const GUARDED_BASE: usize = 0x1000_0000_0000;
/// The trampoline page: the only place whose system calls the filter never traps.
pub const TRAMPOLINE: usize = 0x0fff_ffff_0000;
/// Marks the filter's traps (`si_errno` of the SIGSYS) apart from a program's own filters.
const TRAP_DATA: u32 = 0x7a6d;
/// `AUDIT_ARCH_X86_64` (linux/audit.h): EM_X86_64 | 64-bit | little-endian.
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// The guarded range, `[START, END)`.
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// Bytes of one call pinned and brought back at most (a quarter of the budget, at least 1
/// MiB): a larger buffer is read or written in part, as the kernel would when a page of it
/// faults (a short read or write), so a call can never pin more DRAM than the budget allows.
static PIN_CAP: AtomicUsize = AtomicUsize::new(1 << 20);
static INSTALL: Once = Once::new();

/// The program's own handlers for SIGBUS and SIGSYS in the kernel's layout (handler, flags,
/// restorer, mask), chained behind zmem's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct KernelSigaction {
    pub handler: usize,
    pub flags: u64,
    pub restorer: usize,
    pub mask: u64,
}

/// No handler: SIG_DFL.
const NO_ACTION: KernelSigaction = KernelSigaction {
    handler: 0,
    flags: 0,
    restorer: 0,
    mask: 0,
};
static PROGRAM_BUS: zmem_os::spin::SpinLock<KernelSigaction> =
    zmem_os::spin::SpinLock::new(NO_ACTION);
static PROGRAM_SYS: zmem_os::spin::SpinLock<KernelSigaction> =
    zmem_os::spin::SpinLock::new(NO_ACTION);

/// Calls the filter trapped (zmem's traps only), and calls the preload library's wrappers made
/// through the guard without a trap.
static TRAPS: AtomicU64 = AtomicU64::new(0);
static WRAPPED: AtomicU64 = AtomicU64::new(0);

/// What the guard did in this process so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GuardStats {
    /// System calls the filter trapped (SIGSYS) and zmem's handler made.
    pub traps: u64,
    /// Calls the preload library's wrappers of the C library made through the guard, without
    /// a trap: readv/writev/sendmsg/... always, read/write/poll/... when a buffer is in the
    /// region.
    pub wrapped: u64,
    /// The filter came from the parent (a program exec'd by a guarded one with the same
    /// filter), not installed again.
    #[serde(default)]
    pub inherited: bool,
}

pub fn stats() -> GuardStats {
    GuardStats {
        traps: TRAPS.load(Relaxed),
        wrapped: WRAPPED.load(Relaxed),
        inherited: INHERITED.load(Relaxed),
    }
}

/// Whether the guard is on in this process.
pub fn active() -> bool {
    START.load(Acquire) != 0
}

/// Whether `addr` is in the guarded range.
pub fn guarded(addr: usize) -> bool {
    addr >= START.load(Relaxed) && addr < END.load(Relaxed)
}

// ---------------------------------------------------------------- pins

/// Ranges the kernel is about to read or write on behalf of a trapped call (or an alternate
/// signal stack, for as long as it is installed): the evictor does not take their pages.
struct Pin {
    start: AtomicUsize,
    end: AtomicUsize,
    /// The thread an alternate stack belongs to (0: a call's pin).
    owner: AtomicI32,
    /// The process that made the pin (0 while it is being made). A vfork child shares this
    /// table with its parent, and the pins its `execve` made for its strings stay when the
    /// exec succeeds: nobody is left to release them ([`reclaim`]).
    pid: AtomicI32,
}
const PINS: usize = 128;
#[allow(clippy::declare_interior_mutable_const)] // only to build the array below
const FREE_PIN: Pin = Pin {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    owner: AtomicI32::new(0),
    pid: AtomicI32::new(0),
};
static PIN_TABLE: [Pin; PINS] = [FREE_PIN; PINS];
/// Pins in use: the evictor looks at the table only when this is not zero.
static PINNED: AtomicUsize = AtomicUsize::new(0);

/// Pins `[start, end)`; `None` when the table is full even after the pins of processes gone
/// from this memory are taken back (the call then relies on its retry).
fn pin(start: usize, end: usize, owner: i32) -> Option<usize> {
    take_a_pin(start, end, owner).or_else(|| {
        reclaim();
        take_a_pin(start, end, owner)
    })
}

fn take_a_pin(start: usize, end: usize, owner: i32) -> Option<usize> {
    let pid = raw(libc::SYS_getpid, [0; 6]) as i32;
    for (i, p) in PIN_TABLE.iter().enumerate() {
        if p.start.compare_exchange(0, start, AcqRel, Relaxed).is_ok() {
            p.owner.store(owner, Relaxed);
            p.pid.store(pid, Release);
            p.end.store(end, SeqCst);
            PINNED.fetch_add(1, SeqCst);
            return Some(i);
        }
    }
    None
}

fn unpin(i: usize) {
    let p = &PIN_TABLE[i];
    p.end.store(0, SeqCst);
    p.owner.store(0, Relaxed);
    p.pid.store(0, Relaxed);
    p.start.store(0, Release);
    PINNED.fetch_sub(1, SeqCst);
}

/// Takes back the pins of processes that no longer run in this memory: a vfork child (or
/// posix_spawn's) pins the strings its `execve` reads, in the table it shares with its parent,
/// and a successful exec leaves them there. CPython's subprocess spawns with vfork: after ~40
/// commands the table was full, the pin that keeps the locale's data in memory while a new
/// thread starts with every signal blocked was refused, and the new thread's fault on it ended
/// the process (SIGBUS in `__ctype_init`, CPython's `test_os` at `--resident 4M`). A pin is taken
/// back only when kcmp says its process is gone or has memory of its own (exec'd); while it
/// still shares this memory (mid-exec, seen from another thread of the parent), or when the
/// kernel will not say, it stays.
fn reclaim() {
    let me = raw(libc::SYS_getpid, [0; 6]) as i32;
    for (i, p) in PIN_TABLE.iter().enumerate() {
        let pid = p.pid.load(Acquire);
        if pid == 0 || pid == me || p.start.load(Acquire) == 0 || !left_this_memory(me, pid) {
            continue;
        }
        // Claimed by the pid swap, so that a pin released and made again meanwhile (by
        // another process: its pid differs) is never taken.
        if p.pid.compare_exchange(pid, 0, AcqRel, Relaxed).is_ok() {
            unpin(i);
        }
    }
}

/// Whether process `pid` no longer shares `me`'s memory: gone (ESRCH) or with an address space
/// of its own (kcmp KCMP_VM says different). False when kcmp is refused.
fn left_this_memory(me: i32, pid: i32) -> bool {
    /// kcmp(2)'s type for "same address space" (linux/kcmp.h).
    const KCMP_VM: u64 = 1;
    let r = raw(libc::SYS_kcmp, [me as u64, pid as u64, KCMP_VM, 0, 0, 0]);
    r > 0 || r == -(libc::ESRCH as i64)
}

/// Whether any pin is in use (the evictor's cheap first question).
pub(crate) fn any_pinned() -> bool {
    PINNED.load(SeqCst) != 0
}

/// Whether the page at `addr` is pinned (asked by the evictor for each victim).
pub(crate) fn is_pinned(addr: usize) -> bool {
    PIN_TABLE.iter().any(|p| {
        let end = p.end.load(SeqCst);
        end != 0 && addr + PAGE > p.start.load(Relaxed) && addr < end
    })
}

// ---------------------------------------------------------------- installation

/// Installs the guard for the region `[start, start + len)`, which must begin at
/// [`GUARDED_BASE`] and use the signal route. Once per process; the filter stays for the
/// process's life and is inherited by its children.
pub(crate) fn install(
    start: usize,
    len: usize,
    budget: usize,
    inherited: Option<u64>,
) -> Result<(), RegionError> {
    if start != GUARDED_BASE {
        return Err(RegionError::Config(format!(
            "the syscall guard needs the region at {GUARDED_BASE:#x}, not {start:#x}"
        )));
    }
    PIN_CAP.store((budget / 4).max(1 << 20), Relaxed);
    let mut result = Ok(());
    INSTALL.call_once(|| result = install_once(start, len, inherited));
    result?;
    if START.load(Acquire) != start {
        return Err(RegionError::Config(
            "the syscall guard is already installed for another region".into(),
        ));
    }
    Ok(())
}

/// The id of the filter that guards `[start, start + len)`: a hash of its instructions, the
/// same in every process of the same zmem build with a region of that place and size.
pub fn filter_id(start: usize, len: usize) -> u64 {
    hash_filter(&build_filter(start, start + len))
}

/// FNV-1a over a filter's instructions.
fn hash_filter(filter: &[libc::sock_filter]) -> u64 {
    filter.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, i| {
        let word = (i.code as u64) | (i.jt as u64) << 16 | (i.jf as u64) << 24 | (i.k as u64) << 32;
        word.to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    })
}

/// The id of the guard filter in force in this process (installed here or inherited), if any.
pub fn active_filter_id() -> Option<u64> {
    match FILTER_ID.load(Acquire) {
        0 => None,
        id => Some(id),
    }
}
static FILTER_ID: AtomicU64 = AtomicU64::new(0);
/// Whether this process took its filter from its parent instead of installing a copy.
static INHERITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a guard filter already traps calls into the region starting at `start`: a
/// `read(-1, start, 0)` made past the trampoline reaches the handler (installed by now) as a
/// trap, which makes it from the trampoline (it fails with EBADF, touching nothing).
fn filter_in_force(start: usize) -> bool {
    let before = TRAPS.load(Acquire);
    // SAFETY: a read of nothing from no descriptor.
    unsafe { libc::syscall(libc::SYS_read, -1, start, 0) };
    TRAPS.load(Acquire) > before
}

fn install_once(start: usize, len: usize, inherited: Option<u64>) -> Result<(), RegionError> {
    make_trampoline()?;
    // SAFETY: zeroed sigactions are "default, empty mask"; the kernel fills `old`.
    unsafe {
        let mut new: libc::sigaction = std::mem::zeroed();
        let mut old: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_sigsys as *const () as usize;
        // SA_NODEFER: a program handler that runs inside ours may make a trapped call too.
        // SA_ONSTACK: on zmem's alternate stack (`give_thread_signal_stack`), so that a call
        // made on a stack in the region does not need a frame there.
        new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
        libc::sigemptyset(&mut new.sa_mask);
        if libc::sigaction(libc::SIGSYS, &new, &mut old) != 0 {
            return Err(crate::error::os("sigaction(SIGSYS)"));
        }
        *PROGRAM_SYS.lock() = KernelSigaction {
            handler: old.sa_sigaction,
            flags: old.sa_flags as u64,
            restorer: 0,
            mask: 0,
        };
        if let Some(bus) = crate::signal::previous_bus() {
            *PROGRAM_BUS.lock() = KernelSigaction {
                handler: bus.sa_sigaction,
                flags: bus.sa_flags as u64,
                restorer: 0,
                mask: 0,
            };
        }
    }
    crate::signal::handle_on_alternate_stacks()?;
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is written by pthread_key_create; the destructor is a plain C function.
    if unsafe { libc::pthread_key_create(&mut key, Some(signal_stack_ends)) } == 0 {
        SIGNAL_STACK_KEY.store(key as usize + 1, Release);
    }
    START.store(start, Release);
    END.store(start + len, Release);
    give_thread_signal_stack();
    let filter = build_filter(start, start + len);
    let id = hash_filter(&filter);
    if inherited == Some(id) && filter_in_force(start) {
        // A program exec'd by a guarded one, with the same filter: a second copy would only
        // cost its installation (~0.4 ms) and a filter run more on every system call.
        INHERITED.store(true, Relaxed);
        FILTER_ID.store(id, Release);
        return Ok(());
    }
    // Without CAP_SYS_ADMIN the kernel takes a filter only from a process that gave up gaining
    // privileges (no set-user-ID execs from now on, in this process and its children).
    // SAFETY: prctl and seccomp with valid arguments; `prog` points at `filter`, alive here.
    unsafe {
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr() as *mut libc::sock_filter,
        };
        let tsync = libc::SECCOMP_FILTER_FLAG_TSYNC;
        let mut r = libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            tsync,
            &prog as *const libc::sock_fprog,
        );
        if r != 0 && zmem_os::Errno::last().code() == libc::EACCES {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(crate::error::os("prctl(PR_SET_NO_NEW_PRIVS)"));
            }
            r = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                tsync,
                &prog as *const libc::sock_fprog,
            );
        }
        if r != 0 {
            START.store(0, Release);
            END.store(0, Release);
            return Err(crate::error::os("seccomp(SECCOMP_SET_MODE_FILTER)"));
        }
    }
    FILTER_ID.store(id, Release);
    Ok(())
}

/// The trampoline: `long call(nr, a0, a1, a2, a3, a4, a5)` in the C calling convention,
/// i.e. rax = rdi, rdi = rsi, rsi = rdx, rdx = rcx, r10 = r8, r8 = r9, r9 = [rsp + 8];
/// syscall; ret. Written into a page of its own at [`TRAMPOLINE`] (a page already there
/// with the same code, from an earlier install in this process, is taken as it is).
const TRAMPOLINE_CODE: [u8; 26] = [
    0x48, 0x89, 0xf8, // mov rax, rdi
    0x48, 0x89, 0xf7, // mov rdi, rsi
    0x48, 0x89, 0xd6, // mov rsi, rdx
    0x48, 0x89, 0xca, // mov rdx, rcx
    0x4d, 0x89, 0xc2, // mov r10, r8
    0x4d, 0x89, 0xc8, // mov r8, r9
    0x4c, 0x8b, 0x4c, 0x24, 0x08, // mov r9, [rsp + 8]
    0x0f, 0x05, // syscall
    0xc3, // ret
];

fn make_trampoline() -> Result<(), RegionError> {
    // SAFETY: a fresh private mapping at a fixed address that must be free
    // (MAP_FIXED_NOREPLACE); written, then made read-only and executable.
    unsafe {
        let p = libc::mmap(
            TRAMPOLINE as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED || p as usize != TRAMPOLINE {
            if p != libc::MAP_FAILED {
                libc::munmap(p, PAGE);
            }
            return Err(RegionError::Config(format!(
                "the syscall guard's trampoline page at {TRAMPOLINE:#x} is taken: {}",
                std::io::Error::last_os_error()
            )));
        }
        std::ptr::copy_nonoverlapping(
            TRAMPOLINE_CODE.as_ptr(),
            p.cast::<u8>(),
            TRAMPOLINE_CODE.len(),
        );
        if libc::mprotect(p, PAGE, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            let e = crate::error::os("mprotect(trampoline, PROT_EXEC)");
            libc::munmap(p, PAGE);
            return Err(e);
        }
    }
    Ok(())
}

/// Makes system call `nr` from the trampoline (not trapped).
fn raw(nr: i64, a: [u64; 6]) -> i64 {
    type Call = unsafe extern "C" fn(i64, u64, u64, u64, u64, u64, u64) -> i64;
    // SAFETY: the page at TRAMPOLINE holds TRAMPOLINE_CODE (installed before any trap can
    // reach this), a function of this signature.
    unsafe {
        let f: Call = std::mem::transmute::<usize, Call>(TRAMPOLINE);
        f(nr, a[0], a[1], a[2], a[3], a[4], a[5])
    }
}

/// Whether the page at `addr` is mapped now (mincore), asked past the filter when the guard is
/// on: mincore names a region address, so the filter would trap it and the guard bring the
/// page back first, a fault that needs the space lock its callers hold (the crash report of
/// `trace` hung a program that way). None if the kernel refuses.
pub(crate) fn page_mapped(addr: usize) -> Option<bool> {
    if !active() {
        return zmem_os::mapping::page_mapped(addr);
    }
    let mut v = 0u8;
    let a = [
        (addr & !(PAGE - 1)) as u64,
        PAGE as u64,
        &mut v as *mut u8 as u64,
        0,
        0,
        0,
    ];
    (raw(libc::SYS_mincore, a) == 0).then_some(v & 1 != 0)
}

// ---------------------------------------------------------------- the filter

/// A BPF program under construction, with forward jumps resolved at the end.
struct Bpf {
    code: Vec<libc::sock_filter>,
    /// (instruction, label) for BPF_JA instructions waiting for a label's position.
    fixups: Vec<(usize, usize)>,
    labels: Vec<Option<usize>>,
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JGT_K: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_TRAP: u32 = libc::SECCOMP_RET_TRAP | TRAP_DATA;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

// struct seccomp_data: nr (0), arch (4), instruction_pointer (8), args[6] (16).
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_IP: u32 = 8;
const fn off_arg_hi(i: u8) -> u32 {
    16 + 8 * i as u32 + 4
}

impl Bpf {
    fn op(&mut self, code: u16, jt: u8, jf: u8, k: u32) {
        self.code.push(libc::sock_filter { code, jt, jf, k });
    }
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn place(&mut self, l: usize) {
        self.labels[l] = Some(self.code.len());
    }
    fn jump(&mut self, l: usize) {
        self.fixups.push((self.code.len(), l));
        self.op(JA, 0, 0, 0);
    }
    fn finish(mut self) -> Vec<libc::sock_filter> {
        for (at, l) in self.fixups.drain(..) {
            let target = self.labels[l].expect("every label placed");
            self.code[at].k = (target - at - 1) as u32;
        }
        self.code
    }
}

/// How the filter treats one call number.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Allow,
    /// ENOSYS without a trap.
    Refuse,
    /// Trap when one of these arguments (bit mask) is in the range.
    Args(u8),
}

fn class(nr: i64) -> Class {
    match syscalls::rule(nr) {
        Rule::Allow => Class::Allow,
        Rule::Refuse => Class::Refuse,
        r => Class::Args(syscalls::checked_args(r)),
    }
}

fn build_filter(start: usize, end: usize) -> Vec<libc::sock_filter> {
    let lo = (start >> 32) as u32;
    let hi = ((end - 1) >> 32) as u32;
    let mut b = Bpf {
        code: Vec::new(),
        fixups: Vec::new(),
        labels: Vec::new(),
    };
    let allow = b.label();
    let trap = b.label();
    // Another architecture's calls (a 32-bit int 0x80 entry): not ours to judge.
    b.op(LD_W_ABS, 0, 0, OFF_ARCH);
    b.op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64);
    b.jump(allow);
    // The trampoline's page.
    b.op(LD_W_ABS, 0, 0, OFF_IP + 4);
    b.op(JEQ_K, 0, 4, (TRAMPOLINE >> 32) as u32);
    b.op(LD_W_ABS, 0, 0, OFF_IP);
    b.op(AND_K, 0, 0, !(PAGE as u32 - 1));
    b.op(JEQ_K, 0, 1, TRAMPOLINE as u32);
    b.jump(allow);
    b.op(LD_W_ABS, 0, 0, OFF_NR);
    // Runs of call numbers with the same class, found by a binary search over the runs.
    let mut runs: Vec<(i64, i64, Class)> = Vec::new();
    for nr in 0..=syscalls::MAX_NR {
        let c = class(nr);
        match runs.last_mut() {
            Some((_, last, lc)) if *lc == c && *last == nr - 1 => *last = nr,
            _ => runs.push((nr, nr, c)),
        }
    }
    runs.push((
        syscalls::MAX_NR + 1,
        u32::MAX as i64,
        Class::Args(0b11_1111),
    ));
    let mut masks: Vec<(u8, usize)> = Vec::new();
    let refuse = b.label();
    let mut targets: Vec<usize> = Vec::new();
    for &(_, _, c) in &runs {
        let l = match c {
            Class::Allow | Class::Args(0) => allow,
            Class::Refuse => refuse,
            Class::Args(m) => match masks.iter().find(|(mm, _)| *mm == m) {
                Some(&(_, l)) => l,
                None => {
                    let l = b.label();
                    masks.push((m, l));
                    l
                }
            },
        };
        targets.push(l);
    }
    search(&mut b, &runs, &targets, 0, runs.len());
    // Argument checks: the high half of each listed argument against the range's.
    for &(m, l) in &masks {
        b.place(l);
        check_args(&mut b, m, lo, hi, trap);
        b.jump(allow);
    }
    b.place(refuse);
    b.op(RET_K, 0, 0, RET_ENOSYS);
    b.place(allow);
    b.op(RET_K, 0, 0, RET_ALLOW);
    b.place(trap);
    b.op(RET_K, 0, 0, RET_TRAP);
    b.finish()
}

/// Emits: for each argument in `mask`, jump to `trap` if its high half is in `[lo, hi]`.
fn check_args(b: &mut Bpf, mask: u8, lo: u32, hi: u32, trap: usize) {
    for i in 0..6u8 {
        if mask & (1 << i) == 0 {
            continue;
        }
        b.op(LD_W_ABS, 0, 0, off_arg_hi(i));
        b.op(JGE_K, 0, 2, lo); // below: next argument
        b.op(JGT_K, 1, 0, hi); // above: next argument
        b.jump(trap);
    }
}

/// Emits a binary search over `runs[from..to]` on the call number (in the accumulator),
/// jumping to each run's target.
fn search(b: &mut Bpf, runs: &[(i64, i64, Class)], targets: &[usize], from: usize, to: usize) {
    if to - from == 1 {
        b.jump(targets[from]);
        return;
    }
    let mid = (from + to) / 2;
    let right = b.label();
    b.op(JGE_K, 0, 1, runs[mid].0 as u32);
    b.jump(right);
    search(b, runs, targets, from, mid);
    b.place(right);
    search(b, runs, targets, mid, to);
}

// ---------------------------------------------------------------- the SIGSYS handler

thread_local! {
    /// 1: one of zmem's threads, 2: the program's, 0: not asked yet. No destructor, so it
    /// can be read while the thread's other thread-locals are being destroyed.
    static THREAD_KIND: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Whether the calling thread is one of zmem's (as `zmem_os::thread::is_zmem_thread` tells,
/// with its system calls made from the trampoline: from the handler, a call through the C
/// library whose unused argument registers happen to hold a region address would be trapped
/// again, forever).
fn on_zmem_thread() -> bool {
    THREAD_KIND.with(|k| {
        if k.get() == 0 {
            let main = raw(libc::SYS_gettid, [0; 6]) == raw(libc::SYS_getpid, [0; 6]);
            let mut name = [0u8; 16];
            let a = [
                libc::PR_GET_NAME as u64,
                name.as_mut_ptr() as u64,
                0,
                0,
                0,
                0,
            ];
            let named = raw(libc::SYS_prctl, a) == 0
                && name.starts_with(zmem_os::thread::NAME_PREFIX.as_bytes());
            k.set(if !main && named { 1 } else { 2 });
        }
        k.get() == 1
    })
}

// siginfo_t for SIGSYS: si_signo (0), si_errno (4), si_code (8), then _call_addr (16),
// _syscall (24), _arch (28).
const SYS_SECCOMP: i32 = 1;

extern "C" fn on_sigsys(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The call's result goes back in a register (the C library's wrapper sets errno from it):
    // errno itself stays as the program left it, whatever zmem's own calls below fail with.
    let kept = zmem_os::errno::KeepErrno::new();
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    unsafe {
        let words = info as *const i32;
        let (errno, code, nr) = (*words.add(1), *words.add(2), *words.add(6));
        if code != SYS_SECCOMP || errno as u32 != TRAP_DATA {
            kept.restore_now();
            forward(&PROGRAM_SYS, sig, info, ctx);
            return;
        }
        let uc = ctx as *mut libc::ucontext_t;
        let g = &mut (*uc).uc_mcontext.gregs;
        let args = [
            g[libc::REG_RDI as usize] as u64,
            g[libc::REG_RSI as usize] as u64,
            g[libc::REG_RDX as usize] as u64,
            g[libc::REG_R10 as usize] as u64,
            g[libc::REG_R8 as usize] as u64,
            g[libc::REG_R9 as usize] as u64,
        ];
        TRAPS.fetch_add(1, Relaxed);
        // As for a fault: zmem code on the program's thread allocates from zmem's heap.
        let call = || zmem_os::thread::as_zmem(|| dispatch(nr as i64, args));
        let r = match std::panic::catch_unwind(call) {
            Ok(r) => r,
            Err(_) => std::process::abort(),
        };
        g[libc::REG_RAX as usize] = r as libc::greg_t;
    }
}

/// Whether the filter would trap call `nr` with these arguments: a pointer it checks lies in
/// the guarded range. For the preload library's wrappers of the C library's calls (read,
/// write, epoll_wait, ...), which then make the call through [`call_for_program`] instead of
/// paying for the trap (~2.8 µs: SIGSYS, its frame and sigreturn).
pub fn would_trap(nr: i64, a: &[u64; 6]) -> bool {
    match syscalls::rule(nr) {
        Rule::Check(args) => args
            .iter()
            .any(|arg| guarded(a[arg.ptr() as usize] as usize)),
        _ => false,
    }
}

/// Makes call `nr` for the program as the SIGSYS handler would have (buffers in the region
/// brought back and pinned first; on zmem's own threads, and in zmem's code serving a fault,
/// the plain call); returns what the kernel returns (`-errno` on failure).
pub fn call_for_program(nr: i64, a: [u64; 6]) -> i64 {
    // The caller sets errno from the result; a call that succeeds leaves it as it was.
    let _errno = zmem_os::errno::KeepErrno::new();
    WRAPPED.fetch_add(1, Relaxed);
    // As in the handler: zmem code on the program's thread allocates from zmem's heap.
    let call = || zmem_os::thread::as_zmem(|| dispatch(nr, a));
    match std::panic::catch_unwind(call) {
        Ok(r) => r,
        Err(_) => std::process::abort(),
    }
}

/// Runs a trapped call `nr` for the program and returns what the kernel would have.
fn dispatch(nr: i64, a: [u64; 6]) -> i64 {
    if on_zmem_thread() || crate::signal::serving_a_fault() {
        // zmem's threads never touch the region: nothing to bring back. Nor does zmem's code
        // serving a fault on a program thread (the signal route): a fault taken here would be
        // served inside that one, on the same thread, with its locks held (found: sort at
        // --resident 16M; its fault's store release waited on a pool lock, parking_lot's
        // FUTEX_WAIT was trapped on a stale pointer into the region in an argument FUTEX_WAIT
        // ignores, the touch faulted, and the handler thread that took the nested fault waited
        // for the region lock the outer one held).
        return raw(nr, a);
    }
    call(nr, a)
}

/// Makes system call `nr` for the program with its buffers in the region brought back and
/// pinned first; returns what the kernel returns (`-errno` on failure). The work of the SIGSYS
/// handler and of the preload library's wrappers (both through `dispatch`).
fn call(nr: i64, a: [u64; 6]) -> i64 {
    let rule = syscalls::rule(nr);
    match rule {
        Rule::Allow => raw(nr, a),
        Rule::Refuse => -(libc::ENOSYS as i64),
        Rule::Check(args) if is_plain_io(nr) => plain_io(nr, a, args),
        Rule::Check(args) => guarded_call(nr, a, args),
        Rule::SigMask => sigmask(a),
        Rule::SigAction => sigaction(a),
        Rule::SigAltStack => sigaltstack(a),
    }
}

/// Up to this many ranges of one call are pinned; the rest rely on the retry.
const MAX_RANGES: usize = 8;
const RETRIES: usize = 8;

fn guarded_call(nr: i64, a: [u64; 6], args: &[Arg]) -> i64 {
    let mut pins = [usize::MAX; MAX_RANGES];
    let mut npins = 0;
    let mut ranges = Ranges::default();
    for &arg in args {
        collect(arg, &a, &mut ranges);
    }
    for &(s, e) in &ranges.list[..ranges.n] {
        if npins < MAX_RANGES {
            if let Some(i) = pin(s, e, 0) {
                pins[npins] = i;
                npins += 1;
            }
        }
    }
    let mut r = 0;
    for _ in 0..RETRIES {
        for &(s, e) in &ranges.list[..ranges.n] {
            touch(s, e);
        }
        r = raw(nr, a);
        if r != -(libc::EFAULT as i64) || ranges.n == 0 {
            break;
        }
        // Some page went away between the touch and the kernel's access (the evictor took
        // it before it saw the pin), or lies beyond what the table knows: again.
        ranges.n = 0;
        for &arg in args {
            collect(arg, &a, &mut ranges);
        }
    }
    for &i in &pins[..npins] {
        unpin(i);
    }
    r
}

fn is_plain_io(nr: i64) -> bool {
    matches!(
        nr,
        libc::SYS_read | libc::SYS_write | libc::SYS_pread64 | libc::SYS_pwrite64
    )
}

/// read, write, pread64, pwrite64 with a buffer larger than a call may pin: made in pieces of
/// at most the pin cap, as a program's own loop would, so that the call still does all the
/// work it would have done. A read from a pipe or socket takes one piece (a short read, as
/// the kernel gives whenever less is ready: another piece could block); a read from a file
/// and every write go on while each piece is done whole.
fn plain_io(nr: i64, a: [u64; 6], args: &[Arg]) -> i64 {
    let cap = PIN_CAP.load(Relaxed) as u64;
    let (buf, len) = (a[1], a[2]);
    let end = buf.saturating_add(len) as usize;
    let touches_region = (buf as usize) < END.load(Relaxed) && end > START.load(Relaxed);
    if len <= cap || !touches_region {
        return guarded_call(nr, a, args);
    }
    let reads = nr == libc::SYS_read || nr == libc::SYS_pread64;
    if reads && !is_file(a[0]) {
        let mut b = a;
        b[2] = cap;
        return guarded_call(nr, b, args);
    }
    let positional = nr == libc::SYS_pread64 || nr == libc::SYS_pwrite64;
    let mut done = 0u64;
    while done < len {
        let n = cap.min(len - done);
        let mut b = a;
        b[1] = buf + done;
        b[2] = n;
        if positional {
            b[3] = a[3] + done;
        }
        let r = guarded_call(nr, b, args);
        if r < 0 {
            return if done > 0 { done as i64 } else { r };
        }
        done += r as u64;
        if (r as u64) < n {
            break;
        }
    }
    done as i64
}

/// Whether descriptor `fd` is a regular file or a block device (a read of it is never short
/// for want of data that could still come).
fn is_file(fd: u64) -> bool {
    // SAFETY: a zeroed stat is a valid buffer for the kernel to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = raw(libc::SYS_fstat, [fd, &mut st as *mut _ as u64, 0, 0, 0, 0]);
    let kind = st.st_mode & libc::S_IFMT;
    r == 0 && (kind == libc::S_IFREG || kind == libc::S_IFBLK)
}

/// The guarded parts of a call's buffers.
struct Ranges {
    list: [(usize, usize); 64],
    n: usize,
}

impl Default for Ranges {
    fn default() -> Self {
        Ranges {
            list: [(0, 0); 64],
            n: 0,
        }
    }
}

impl Ranges {
    /// Adds `[start, start + len)` clipped to the guarded range and to the pin cap.
    fn add(&mut self, start: usize, len: usize) {
        self.add_whole(start, len.min(PIN_CAP.load(Relaxed)))
    }

    /// Adds `[start, start + len)` clipped to the guarded range only. A range on the same
    /// pages as one already listed, or on the pages next to them, joins it (pins and touches
    /// are by page): an exec's argument and environment arrays are one range, not one per
    /// slot, and strings allocated together share theirs. With a range per slot, an
    /// environment of 30 variables filled the list, the rest of it was neither pinned nor
    /// brought back, and the exec failed with EFAULT.
    fn add_whole(&mut self, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        let (gs, ge) = (START.load(Relaxed), END.load(Relaxed));
        let s = start.max(gs);
        let e = start.saturating_add(len).min(ge);
        if s < e {
            self.insert(s, e);
        }
    }

    /// Adds the non-empty `[s, e)`, joined to a listed range on the same or neighbouring pages
    /// (see `add_whole`); dropped when the list is full and it joins none.
    fn insert(&mut self, s: usize, e: usize) {
        let (first, last) = (s / PAGE, (e - 1) / PAGE);
        for r in &mut self.list[..self.n] {
            let (rfirst, rlast) = (r.0 / PAGE, (r.1 - 1) / PAGE);
            if first <= rlast + 1 && rfirst <= last + 1 {
                *r = (r.0.min(s), r.1.max(e));
                return;
            }
        }
        if self.n < self.list.len() {
            self.list[self.n] = (s, e);
            self.n += 1;
        }
    }
}

/// Reads a `T` the program passed (which may itself be in the region: reading it from user
/// mode brings its page back).
fn read_user<T: Copy>(addr: usize) -> Option<T> {
    if addr == 0 {
        return None;
    }
    // SAFETY: the program handed this address to the kernel as a pointer to a T; if it is
    // bad the kernel would have failed the call with EFAULT, and so does this read with
    // SIGSEGV in the program's thread, as the program's own read would.
    Some(unsafe { std::ptr::read_unaligned(addr as *const T) })
}

/// Length of the NUL-terminated string at `addr`, its NUL included (at most 64 KiB).
fn str_len(addr: usize) -> usize {
    if addr == 0 {
        return 0;
    }
    let mut n = 0;
    while n < 64 << 10 {
        // SAFETY: as in read_user: the program passed a string here.
        if unsafe { std::ptr::read_volatile((addr + n) as *const u8) } == 0 {
            return n + 1;
        }
        n += 1;
    }
    n
}

fn collect(arg: Arg, a: &[u64; 6], out: &mut Ranges) {
    let v = |i: u8| a[i as usize] as usize;
    match arg {
        Arg::Bytes(p, l) => out.add(v(p), v(l)),
        Arg::Array(p, n, size) => out.add(v(p), v(n).saturating_mul(size as usize)),
        Arg::Fixed(p, size) => {
            if v(p) != 0 {
                out.add(v(p), size as usize)
            }
        }
        Arg::ForFutex(p, size, commands) => {
            if v(p) != 0 && syscalls::futex_uses(commands, a[1]) {
                out.add(v(p), size as usize)
            }
        }
        Arg::LenAt(p, l) => {
            if let Some(len) = read_user::<u32>(v(l)) {
                out.add(v(p), len as usize);
            }
        }
        Arg::Str(p) => {
            if guarded(v(p)) {
                out.add(v(p), str_len(v(p)))
            }
        }
        Arg::StrArray(p) => {
            let mut at = v(p);
            out.add(at, 8);
            while let Some(s) = read_user::<usize>(at) {
                if s == 0 || out.n == out.list.len() {
                    break;
                }
                if guarded(s) {
                    out.add(s, str_len(s));
                }
                at += 8;
                out.add(at, 8);
            }
        }
        Arg::Iovec(p, n) => iovecs(v(p), v(n), out),
        Arg::Msghdr(p) => msghdr(v(p), out),
        Arg::Mmsghdr(p, n) => {
            // struct mmsghdr { struct msghdr msg_hdr (56); unsigned msg_len; } = 64 bytes.
            out.add(v(p), v(n).saturating_mul(64));
            for k in 0..v(n).min(64) {
                msghdr(v(p) + 64 * k, out);
            }
        }
    }
}

fn iovecs(p: usize, n: usize, out: &mut Ranges) {
    out.add(p, n.saturating_mul(16));
    for k in 0..n.min(1024) {
        let Some((base, len)) = read_user::<(usize, usize)>(p + 16 * k) else {
            return;
        };
        out.add(base, len);
    }
}

fn msghdr(p: usize, out: &mut Ranges) {
    // struct msghdr: name (0), namelen u32 (8), iov (16), iovlen (24), control (32),
    // controllen (40), flags (48); 56 bytes.
    let Some(m) = read_user::<[u64; 7]>(p) else {
        return;
    };
    out.add(p, 56);
    out.add(m[0] as usize, m[1] as u32 as usize);
    iovecs(m[2] as usize, m[3] as usize, out);
    out.add(m[4] as usize, m[5] as usize);
}

/// Touches every page of `[s, e)` from user mode: an evicted one comes back (SIGBUS, served
/// by `signal.rs` on this thread).
fn touch(s: usize, e: usize) {
    let mut p = s & !(PAGE - 1);
    while p < e {
        // SAFETY: a page of the region, which is mapped (registered) in full.
        unsafe { std::ptr::read_volatile(p as *const u8) };
        p += PAGE;
    }
}

/// rt_sigprocmask(how, set, oldset, size): SIGBUS and SIGSYS are never blocked (a fault
/// or a trap while they are would end the process).
fn sigmask(a: [u64; 6]) -> i64 {
    let (how, set, old) = (a[0] as i32, a[1] as usize, a[2] as usize);
    let mut ranges = Ranges::default();
    ranges.add(old, 8);
    ranges.add(set, 8);
    for &(s, e) in &ranges.list[..ranges.n] {
        touch(s, e);
    }
    let mut local: u64;
    let mut b = a;
    if set != 0 {
        local = read_user::<u64>(set).unwrap_or(0);
        if how == libc::SIG_BLOCK || how == libc::SIG_SETMASK {
            local &= !((1u64 << (libc::SIGBUS - 1)) | (1u64 << (libc::SIGSYS - 1)));
        }
        b[1] = &local as *const u64 as u64;
    }
    raw(libc::SYS_rt_sigprocmask, b)
}

/// rt_sigaction for SIGBUS or SIGSYS: the program's handler is recorded and called for the
/// signals that are not zmem's; zmem's stays installed. Other signals go to the kernel.
fn sigaction(a: [u64; 6]) -> i64 {
    let sig = a[0] as i32;
    let slot = match sig {
        libc::SIGBUS => &PROGRAM_BUS,
        libc::SIGSYS => &PROGRAM_SYS,
        _ => {
            return guarded_call(
                libc::SYS_rt_sigaction,
                a,
                syscalls::args_of(Rule::SigAction),
            )
        }
    };
    let (new, old) = (a[1] as usize, a[2] as usize);
    let incoming = read_user::<KernelSigaction>(new);
    let previous = {
        let mut g = slot.lock();
        let previous = *g;
        if let Some(n) = incoming {
            *g = n;
        }
        previous
    };
    if old != 0 {
        // SAFETY: the program passed a pointer to a kernel sigaction for the old one.
        unsafe { std::ptr::write_unaligned(old as *mut KernelSigaction, previous) };
    }
    0
}

/// sigaltstack(ss, old): on a thread with zmem's alternate stack, the program's is recorded
/// (`program_sigaltstack`); elsewhere an alternate stack in the region is pinned while it is
/// the thread's (the kernel writes signal frames there, from kernel mode).
fn sigaltstack(a: [u64; 6]) -> i64 {
    let ss = read_user::<libc::stack_t>(a[0] as usize);
    // SAFETY: stack_t is plain data; all zeros is a valid value.
    let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
    if let Some(r) = program_sigaltstack(ss.as_ref(), (a[1] != 0).then_some(&mut old)) {
        if r == 0 && a[1] != 0 {
            // SAFETY: the program passed a pointer to a stack_t for the old one.
            unsafe { std::ptr::write_unaligned(a[1] as *mut libc::stack_t, old) };
        }
        return r;
    }
    let r = guarded_call(
        libc::SYS_sigaltstack,
        a,
        syscalls::args_of(Rule::SigAltStack),
    );
    if r != 0 || a[0] == 0 {
        return r;
    }
    // stack_t: ss_sp (0), ss_flags i32 (8), ss_size (16).
    if let Some((sp, flags, size)) = read_user::<(usize, i32, usize)>(a[0] as usize) {
        alternate_stack(sp, size, flags & libc::SS_DISABLE != 0);
    }
    r
}

/// For the preload's `sigaction`/`signal`: the program's handler for SIGBUS or SIGSYS, which
/// zmem keeps behind its own while the guard is on; `new` replaces it. Returns the previous
/// one, or None for other signals or without the guard (the call then goes to the kernel).
pub fn program_handler(sig: i32, new: Option<KernelSigaction>) -> Option<KernelSigaction> {
    if !active() {
        return None;
    }
    let slot = match sig {
        libc::SIGBUS => &PROGRAM_BUS,
        libc::SIGSYS => &PROGRAM_SYS,
        _ => return None,
    };
    let mut g = slot.lock();
    let previous = *g;
    if let Some(n) = new {
        *g = n;
    }
    Some(previous)
}

/// For the preload's `sigaltstack`: the calling thread's alternate signal stack is now
/// `[sp, sp + size)` (or none, `disabled`); one in the region is pinned while it is in use,
/// since the kernel writes signal frames there from kernel mode.
pub fn alternate_stack(sp: usize, size: usize, disabled: bool) {
    if !active() {
        return;
    }
    let tid = raw(libc::SYS_gettid, [0; 6]) as i32;
    for (i, p) in PIN_TABLE.iter().enumerate() {
        if p.owner.load(Relaxed) == tid && p.end.load(SeqCst) != 0 {
            unpin(i);
        }
    }
    if disabled || size == 0 {
        return;
    }
    let mut ranges = Ranges::default();
    ranges.add_whole(sp, size);
    if ranges.n == 1 {
        let (s, e) = ranges.list[0];
        if pin(s, e, tid).is_some() {
            touch(s, e);
        }
    }
}

// ---------------------------------------------------------------- alternate signal stacks

/// Bytes of zmem's alternate signal stack per program thread (a guard page below it). Only
/// touched pages take DRAM: serving faults that evict (compression included) touched 8 KiB of
/// it in a release build, 28 KiB in a debug build (64 MiB read and written three times at
/// `--resident 8M`, /proc/PID/smaps).
pub const SIGNAL_STACK: usize = 128 << 10;

/// A program's alternate stack at least this large is installed as it asks (zmem's handlers
/// fit on it); a smaller one (Rust's threads set ~12 KiB for their stack-overflow handler) is
/// only recorded, and the program's handlers run on zmem's.
pub const PROGRAM_STACK_MIN: usize = 64 << 10;

/// A thread's alternate signal stack as zmem keeps it: its own (mapped by the kernel, outside
/// the region), and the one the program asked for, which the program sees.
struct SignalStack {
    /// Start of zmem's mapping (its guard page), 0: none yet.
    map: std::cell::Cell<usize>,
    /// Whether zmem's stack is the thread's (false while a larger one of the program's is).
    ours_installed: std::cell::Cell<bool>,
    /// The program's alternate stack: (sp, size), or None (SS_DISABLE).
    program: std::cell::Cell<Option<(usize, usize)>>,
}

/// The pthread key whose destructor gives a thread's alternate stack back at its end (plus
/// one; 0: none). A key and not a thread-local with a destructor: registering that allocates
/// (glibc's `__cxa_thread_atexit_impl` callocs), which on a program thread that had not
/// allocated yet set up a heap for it in the region, and faults on it at the thread's end
/// (5000 threads: 87 -> 170 µs each); `pthread_setspecific` of an early key allocates nothing.
static SIGNAL_STACK_KEY: AtomicUsize = AtomicUsize::new(0);

/// The key's destructor: the thread is ending; its alternate stack is unmapped.
extern "C" fn signal_stack_ends(value: *mut libc::c_void) {
    let map = value as usize;
    let _ = SIGNAL_STACK_OF_THREAD.try_with(|st| {
        if st.map.get() != map {
            return;
        }
        if st.ours_installed.get() {
            // Its own destructors run on the thread's stack, never on the alternate one.
            set_alternate_stack(0, 0, libc::SS_DISABLE);
            st.ours_installed.set(false);
        }
        st.map.set(0);
        give_back_signal_stack(map);
    });
}

/// A mapping for an alternate stack (its guard page first), from the kernel (never the
/// preload's map space). None if the kernel refuses.
fn take_signal_stack() -> Option<usize> {
    let map = raw(
        libc::SYS_mmap,
        [
            0,
            (SIGNAL_STACK + PAGE) as u64,
            libc::PROT_NONE as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64,
            u64::MAX,
            0,
        ],
    );
    if map < 0 {
        return None;
    }
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    if raw(
        libc::SYS_mprotect,
        [map as u64 + PAGE as u64, SIGNAL_STACK as u64, prot, 0, 0, 0],
    ) != 0
    {
        give_back_signal_stack(map as usize);
        return None;
    }
    Some(map as usize)
}

/// Unmaps `map` (from [`take_signal_stack`], no longer any thread's). Kept spares for the next
/// threads instead were measured no faster (5000 threads made and joined one by one: 76-100
/// µs each without, 87 with; plain 73-98).
fn give_back_signal_stack(map: usize) {
    raw(
        libc::SYS_munmap,
        [map as u64, (SIGNAL_STACK + PAGE) as u64, 0, 0, 0, 0],
    );
}

thread_local! {
    static SIGNAL_STACK_OF_THREAD: SignalStack = const {
        SignalStack {
            map: std::cell::Cell::new(0),
            ours_installed: std::cell::Cell::new(false),
            program: std::cell::Cell::new(None),
        }
    };
}

/// Gives the calling thread zmem's alternate signal stack, on which SIGBUS (a fault) and
/// SIGSYS (a trapped call) are handled while the guard is on: a thread running on a stack in
/// the region (a coroutine's or a cloned child's malloc'd stack) then takes a fault even when
/// the page below its stack pointer is evicted, where the kernel could not write the signal
/// frame on that stack (SIGSEGV). Called for the thread that installs the guard and, by the
/// preload library, at the start of every thread `pthread_create` makes (a new thread has no
/// alternate stack; a forked child keeps its parent thread's); given back at the thread's end
/// (`signal_stack_ends`). An alternate stack the program sets afterwards is recorded instead
/// (`program_sigaltstack`). Without the guard: nothing.
pub fn give_thread_signal_stack() {
    if !active() {
        return;
    }
    let _ = SIGNAL_STACK_OF_THREAD.try_with(|st| {
        if st.map.get() != 0 {
            return;
        }
        let Some(map) = take_signal_stack() else {
            return;
        };
        let stack = map + PAGE;
        // SAFETY: stack_t is plain data; all zeros is a valid value.
        let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
        if raw(
            libc::SYS_sigaltstack,
            [0, &mut old as *mut _ as u64, 0, 0, 0, 0],
        ) != 0
        {
            give_back_signal_stack(map);
            return;
        }
        // One the program set before (on the thread that installs the guard) stays the
        // program's, and stays installed if it is large enough.
        let program = (old.ss_flags & libc::SS_DISABLE == 0 && old.ss_size > 0)
            .then_some((old.ss_sp as usize, old.ss_size));
        let keep = program.is_some_and(|(_, n)| n >= PROGRAM_STACK_MIN);
        if !keep && set_alternate_stack(stack, SIGNAL_STACK, 0) != 0 {
            give_back_signal_stack(map);
            return;
        }
        st.map.set(map);
        st.ours_installed.set(!keep);
        st.program.set(program);
        let key = SIGNAL_STACK_KEY.load(Acquire);
        if key != 0 {
            // SAFETY: a key made by pthread_key_create; the value is the mapping's address.
            unsafe { libc::pthread_setspecific((key - 1) as libc::pthread_key_t, map as *const _) };
        }
    });
}

/// Makes `[sp, sp + size)` the calling thread's alternate signal stack (`flags`: 0 or
/// SS_DISABLE) with a system call of zmem's (never trapped, never the preload's wrapper).
fn set_alternate_stack(sp: usize, size: usize, flags: i32) -> i64 {
    let ss = libc::stack_t {
        ss_sp: sp as *mut libc::c_void,
        ss_flags: flags,
        ss_size: size,
    };
    raw(
        libc::SYS_sigaltstack,
        [&ss as *const _ as u64, 0, 0, 0, 0, 0],
    )
}

/// The program's `sigaltstack(ss, old)` on a thread with zmem's alternate stack: `ss` is
/// recorded as the program's, and `old` gets the program's previous one (with SS_ONSTACK
/// while the thread runs on the alternate stack), as if it were the thread's; zmem's stays
/// installed, unless the program's has [`PROGRAM_STACK_MIN`] bytes or more (then the program's
/// is installed, pinned if in the region, and zmem's comes back when the program disables
/// it). Returns the call's result (`-errno` on failure), or None on a thread without zmem's
/// stack (the caller makes the call).
pub fn program_sigaltstack(
    ss: Option<&libc::stack_t>,
    old: Option<&mut libc::stack_t>,
) -> Option<i64> {
    if !active() {
        return None;
    }
    SIGNAL_STACK_OF_THREAD
        .try_with(|st| {
            let map = st.map.get();
            if map == 0 {
                return None;
            }
            // Where this thread's signals run now: on an alternate stack if the stack pointer
            // is in the installed one.
            let sp: usize;
            // SAFETY: reads the stack pointer.
            unsafe { std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack)) };
            let installed = if st.ours_installed.get() {
                Some((map + PAGE, SIGNAL_STACK))
            } else {
                st.program.get()
            };
            let on_stack = installed.is_some_and(|(s, n)| sp >= s && sp < s + n);
            if let Some(old) = old {
                let (sp0, size, flags) = match st.program.get() {
                    Some((s, n)) => (s, n, 0),
                    None => (0, 0, libc::SS_DISABLE),
                };
                *old = libc::stack_t {
                    ss_sp: sp0 as *mut libc::c_void,
                    ss_flags: flags | if on_stack { libc::SS_ONSTACK } else { 0 },
                    ss_size: size,
                };
            }
            let Some(ss) = ss else {
                return Some(0);
            };
            // The kernel's checks, in its order.
            if on_stack {
                return Some(-(libc::EPERM as i64));
            }
            /// SS_AUTODISARM (linux/signal.h): taken and ignored, zmem's stack is never disarmed.
            const SS_AUTODISARM: i32 = 1 << 31;
            let flags = ss.ss_flags & !SS_AUTODISARM;
            if flags != 0 && flags != libc::SS_DISABLE && flags != libc::SS_ONSTACK {
                return Some(-(libc::EINVAL as i64));
            }
            if flags == libc::SS_DISABLE {
                if !st.ours_installed.get() {
                    let r = set_alternate_stack(map + PAGE, SIGNAL_STACK, 0);
                    if r != 0 {
                        return Some(r);
                    }
                    st.ours_installed.set(true);
                }
                st.program.set(None);
                alternate_stack(0, 0, true);
                return Some(0);
            }
            if ss.ss_size < libc::MINSIGSTKSZ {
                return Some(-(libc::ENOMEM as i64));
            }
            let (s, n) = (ss.ss_sp as usize, ss.ss_size);
            if n >= PROGRAM_STACK_MIN {
                // Brought back and pinned first: a fault while it is installed has its frame
                // written there.
                alternate_stack(s, n, false);
                let r = set_alternate_stack(s, n, 0);
                if r != 0 {
                    alternate_stack(0, 0, true);
                    return Some(r);
                }
                st.ours_installed.set(false);
            } else if !st.ours_installed.get() {
                let r = set_alternate_stack(map + PAGE, SIGNAL_STACK, 0);
                if r != 0 {
                    return Some(r);
                }
                st.ours_installed.set(true);
                alternate_stack(0, 0, true);
            }
            st.program.set(Some((s, n)));
            Some(0)
        })
        .ok()
        .flatten()
}

/// For the preload's exec and posix_spawn wrappers: runs `f` (the C library's call) with the
/// path and the strings of `argv` and `envp` (NULL-terminated arrays) that are in the region
/// brought back and pinned, so that the kernel can copy them. execve is never trapped (see
/// `syscalls.rs`): this is what keeps its strings in DRAM.
pub fn with_exec_strings<R>(path: usize, argv: usize, envp: usize, f: impl FnOnce() -> R) -> R {
    if !active() || on_zmem_thread() {
        return f();
    }
    let mut ranges = Ranges::default();
    let a = [path as u64, argv as u64, envp as u64, 0, 0, 0];
    for arg in [Arg::Str(0), Arg::StrArray(1), Arg::StrArray(2)] {
        collect(arg, &a, &mut ranges);
    }
    let mut pins = [usize::MAX; 64];
    let mut npins = 0;
    for &(s, e) in &ranges.list[..ranges.n] {
        if let Some(i) = pin(s, e, 0) {
            pins[npins] = i;
            npins += 1;
        }
    }
    // posix_spawn's child runs with every signal blocked: a page taken after the touch would
    // end it (a fault there cannot be served), not merely fail the exec with EFAULT.
    crate::signal::wait_for_eviction_batches(START.load(Relaxed));
    for &(s, e) in &ranges.list[..ranges.n] {
        touch(s, e);
    }
    let r = f();
    for &i in &pins[..npins] {
        unpin(i);
    }
    r
}

/// Memory kept in DRAM by [`keep_in_memory`] until dropped.
pub struct Held(Option<usize>);

impl Held {
    /// Nothing kept.
    pub fn nothing() -> Held {
        Held(None)
    }

    /// Whether the memory is kept (false when the guard is off, the range is not the region's,
    /// or the pin table was full).
    pub fn is_held(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            unpin(i);
        }
    }
}

/// Brings `[start, end)` back and keeps it in DRAM until the returned [`Held`] is dropped:
/// pinned first, then every eviction batch that may have picked its pages before the pin was
/// seen is waited out, then touched. For the windows where the C library runs with every signal
/// blocked, where a fault on the signal route cannot be served and ends the process (a new
/// thread reads the locale's data before it unblocks them). Nothing when the guard is off, the
/// range is not the region's, or the pin table is full.
pub fn keep_in_memory(start: usize, end: usize) -> Held {
    if !active() || on_zmem_thread() || !guarded(start) {
        return Held(None);
    }
    let held = Held(pin(start, end, 0));
    if held.0.is_some() {
        crate::signal::wait_for_eviction_batches(start);
        touch(start, end);
    }
    held
}

/// The program's handler for a SIGBUS or SIGSYS that is not zmem's, as the kernel would
/// have run it; with none (or SIG_IGN), the default action: the process ends with that
/// signal.
pub(crate) fn forward_bus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    forward(&PROGRAM_BUS, sig, info, ctx)
}

fn forward(
    slot: &zmem_os::spin::SpinLock<KernelSigaction>,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    let act = {
        let mut program = slot.lock();
        let act = *program;
        // A handler set to run once (SA_RESETHAND: `sysv_signal`'s) is the default from now on.
        if act.flags & libc::SA_RESETHAND as u64 != 0 {
            *program = NO_ACTION;
        }
        act
    };
    match act.handler {
        h if h == libc::SIG_DFL || h == libc::SIG_IGN => {
            // The default action, restored in the kernel (a raw call: the preload's `sigaction`
            // would only record it), then the signal again: the process ends as it would have
            // without zmem.
            let dfl = NO_ACTION;
            let a = [sig as u64, &dfl as *const _ as u64, 0, 8, 0, 0];
            raw(libc::SYS_rt_sigaction, a);
            let (pid, tid) = (raw(libc::SYS_getpid, [0; 6]), raw(libc::SYS_gettid, [0; 6]));
            raw(
                libc::SYS_tgkill,
                [pid as u64, tid as u64, sig as u64, 0, 0, 0],
            );
        }
        h => {
            let siginfo = act.flags & libc::SA_SIGINFO as u64 != 0;
            crate::signal::call_handler(h, siginfo, sig, info, ctx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter on a call the way the kernel would (classic BPF, the subset we emit).
    fn run(filter: &[libc::sock_filter], nr: u32, ip: u64, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&AUDIT_ARCH_X86_64.to_le_bytes());
        data[8..16].copy_from_slice(&ip.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let word = |off: u32| u32::from_le_bytes(data[off as usize..][..4].try_into().unwrap());
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = filter[pc];
            pc += 1;
            match ins.code {
                LD_W_ABS => acc = word(ins.k),
                AND_K => acc &= ins.k,
                JA => pc += ins.k as usize,
                JEQ_K | JGE_K | JGT_K => {
                    let t = match ins.code {
                        JEQ_K => acc == ins.k,
                        JGE_K => acc >= ins.k,
                        _ => acc > ins.k,
                    };
                    pc += if t { ins.jt } else { ins.jf } as usize;
                }
                RET_K => return ins.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    const LEN: usize = 200 << 30;

    /// An exec's arrays and strings: ranges on the same or neighbouring pages are one, so
    /// that an environment of hundreds of variables fits the list.
    #[test]
    fn ranges_on_the_same_pages_are_joined() {
        let base = GUARDED_BASE;
        let mut r = Ranges::default();
        // An array of 500 pointers, added slot by slot: one range.
        for k in 0..500 {
            r.insert(base + 8 * k, base + 8 * k + 8);
        }
        assert_eq!(&r.list[..r.n], &[(base, base + 4000)]);
        // Strings on the array's last page and the next one join it; one a page further
        // away does not.
        r.insert(base + 4090, base + 4100);
        r.insert(base + 2 * PAGE - 3, base + 2 * PAGE - 1);
        r.insert(base + 3 * PAGE + 5, base + 3 * PAGE + 9);
        assert_eq!(
            &r.list[..r.n],
            &[
                (base, base + 2 * PAGE - 1),
                (base + 3 * PAGE + 5, base + 3 * PAGE + 9)
            ]
        );
        // A range that bridges two listed ones joins the first (both stay listed: pins and
        // touches of a page twice are harmless).
        r.insert(base + 2 * PAGE, base + 3 * PAGE);
        assert_eq!(r.list[0], (base, base + 3 * PAGE));
        // 300 strings on pages far apart: the list keeps the first 64 ranges.
        let mut far = Ranges::default();
        for k in 0..300 {
            far.insert(base + k * 4 * PAGE, base + k * 4 * PAGE + 10);
        }
        assert_eq!(far.n, far.list.len());
        assert_eq!(far.list[63], (base + 252 * PAGE, base + 252 * PAGE + 10));
    }

    /// The id a guarded process leaves for the programs it execs names its filter: the same
    /// for the same range, another for a range whose end differs (other instructions).
    #[test]
    fn the_filter_id_follows_the_filter() {
        let len = 64usize << 30;
        assert_eq!(filter_id(GUARDED_BASE, len), filter_id(GUARDED_BASE, len));
        assert_eq!(
            filter_id(GUARDED_BASE, len),
            hash_filter(&build_filter(GUARDED_BASE, GUARDED_BASE + len))
        );
        assert_ne!(
            filter_id(GUARDED_BASE, len),
            filter_id(GUARDED_BASE, 2 * len)
        );
    }

    #[test]
    fn the_filter_traps_calls_into_the_range_and_nothing_else() {
        let f = build_filter(GUARDED_BASE, GUARDED_BASE + LEN);
        assert!(f.len() < 4096, "{} instructions", f.len());
        let inside = (GUARDED_BASE + 12345) as u64;
        let outside = 0x7fff_1234_5000u64;
        let ip = 0x5555_0000_1000u64;
        let read = libc::SYS_read as u32;
        assert_eq!(run(&f, read, ip, [3, inside, 10, 0, 0, 0]), RET_TRAP);
        assert_eq!(run(&f, read, ip, [3, outside, 10, 0, 0, 0]), RET_ALLOW);
        // The end of the range, and just past it.
        let last = (GUARDED_BASE + LEN - 1) as u64;
        assert_eq!(run(&f, read, ip, [3, last, 10, 0, 0, 0]), RET_TRAP);
        let past = ((GUARDED_BASE + LEN + (4usize << 30)) & !((4usize << 30) - 1)) as u64;
        assert_eq!(run(&f, read, ip, [3, past, 10, 0, 0, 0]), RET_ALLOW);
        // An argument the table does not list as a pointer (the count) is not looked at.
        assert_eq!(run(&f, read, ip, [3, outside, inside, 0, 0, 0]), RET_ALLOW);
        // From the trampoline page: never trapped.
        let tip = (TRAMPOLINE + 23) as u64;
        assert_eq!(run(&f, read, tip, [3, inside, 10, 0, 0, 0]), RET_ALLOW);
        // Address-only memory calls and calls never re-issued pass whatever they hold.
        for nr in [
            libc::SYS_madvise,
            libc::SYS_munmap,
            libc::SYS_clone,
            libc::SYS_rt_sigreturn,
        ] {
            assert_eq!(run(&f, nr as u32, ip, [inside; 6]), RET_ALLOW, "{nr}");
        }
        // Pointers behind pointers: the first level only (the preload's wrappers do the rest).
        let wv = libc::SYS_writev as u32;
        assert_eq!(run(&f, wv, ip, [1, outside, 1, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, wv, ip, [1, inside, 1, 0, 0, 0]), RET_TRAP);
        // Signal calls are trapped on their structs only, never on the signal number: a program
        // exec'd without zmem inherits the filter, and an unhandled SIGSYS would end it.
        assert_eq!(
            run(&f, libc::SYS_rt_sigprocmask as u32, ip, [0; 6]),
            RET_ALLOW
        );
        let sa = libc::SYS_rt_sigaction as u32;
        assert_eq!(
            run(&f, sa, ip, [libc::SIGBUS as u64, outside, 0, 8, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            run(&f, sa, ip, [libc::SIGINT as u64, inside, 0, 8, 0, 0]),
            RET_TRAP
        );
        // io_uring: refused by the filter itself, no trap.
        let ur = libc::SYS_io_uring_setup as u32;
        assert_eq!(run(&f, ur, ip, [8, outside, 0, 0, 0, 0]), RET_ENOSYS);
        // A call number the table does not know: every argument is checked.
        assert_eq!(run(&f, 600, ip, [0, 0, 0, 0, 0, inside]), RET_TRAP);
        assert_eq!(run(&f, 600, ip, [1, 2, 3, 4, 5, 6]), RET_ALLOW);
        // Every call number lands somewhere (no fall-through past the end), and nothing is
        // trapped whose arguments stay out of the range.
        for nr in 0..600u32 {
            let r = run(&f, nr, ip, [0, 1, 2, 3, 4, outside]);
            assert!(r == RET_ALLOW || r == RET_ENOSYS, "{nr}");
        }
    }
}
