//! The `zmem` command: run a program with its heap compressed, watch it, and benchmark zmem side
//! by side with the kernel's zram.

pub mod cli;
pub mod demo;
pub mod demo_redis;
pub mod run;
pub mod size;
