//! What every zmem layer needs of the operating system, defined once: the page size zmem works
//! in, anonymous mappings that unmap themselves, the start hook of zmem's own threads, another
//! process's memory by address, and system-call errors that print without libc (safe on zmem's
//! threads).
//!
//! This crate is the bottom of the graph (it depends on libc only), so the codec, the pool, the
//! engine, the store and the region can all share it without depending on each other.

pub mod caps;
pub mod errno;
pub mod extents;
pub mod fds;
pub mod idle;
pub mod mapping;
pub mod remote;
pub mod spin;
pub mod sync;
pub mod thread;

pub use errno::Errno;
pub use extents::Extents;
pub use mapping::{Mapping, MappingFlags, ZeroedTable};
pub use spin::SpinLock;

/// The page size zmem compresses, stores and faults in: the base page of x86-64 and of the
/// default arm64 kernels. Regions refuse to start where the kernel's page size differs (the
/// userfaultfd ioctls work in kernel pages).
pub const PAGE_SIZE: usize = 4096;

/// The kernel's base page size, for the check above.
pub fn kernel_page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running kernel and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(PAGE_SIZE)
}

/// Milliseconds of `clock` (CLOCK_MONOTONIC, or CLOCK_MONOTONIC_COARSE where the tick's few ms
/// of resolution are enough: read from the vDSO either way, no system call).
pub fn clock_ms(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: t is a valid timespec.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

/// Helpers the unit tests of several modules share.
#[cfg(test)]
pub(crate) mod test_support {
    /// Runs `add` `per_thread` times on each of `threads` threads at once and waits for them:
    /// a lock under test then holds `threads * per_thread` if it lost no update.
    pub fn add_from_threads(threads: usize, per_thread: usize, add: impl Fn() + Send + Sync) {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| (0..per_thread).for_each(|_| add()));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_size_is_the_kernels() {
        assert_eq!(super::kernel_page_size(), super::PAGE_SIZE);
    }
}
