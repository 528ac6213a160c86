//! The `zmem` command: run a program with its heap compressed, watch it, and benchmark zmem side
//! by side with the kernel's zram.

pub mod cli;
pub mod demo;
pub mod demo_redis;
pub mod demo_store;
pub mod demo_worker;
pub mod doctor;
pub mod metrics;
pub mod run;
pub mod size;
pub mod stat;
