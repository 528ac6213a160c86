//! The `zmem` command: benchmarks side by side with the kernel's zram (run and stat later).

pub mod bench;
pub mod cli;
pub mod demo;
pub mod size;
