//! The kernel side's guards, each restoring the machine as found when dropped (on success, on
//! error and after Ctrl-C alike): a zram device ([`zram::ZramSession`]), swap on it
//! ([`swap::SwapOn`]), a swap file ([`swapfile::SwapFile`]), a cgroup v1 memory cgroup
//! ([`memcg::MemCgroup`]). Imports nothing from the benchmarks.

pub mod memcg;
pub mod swap;
pub mod swapfile;
pub mod zram;
