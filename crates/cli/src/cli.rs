//! The command line (clap derive) and its dispatch.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "zmem",
    version,
    about = "User-space memory compression (zram as a library): benchmarks side by side with the kernel's zram"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Shows what zmem saves: a key-value program built into zmem under `zmem run` (needs
    /// nothing installed); `zmem demo redis` on redis-server, `zmem demo store` on the corpus.
    Demo(crate::demo::DemoArgs),
    /// The program of `zmem demo` (internal).
    #[command(name = "demo-worker", hide = true)]
    DemoWorker(crate::demo_worker::WorkerArgs),
    /// Checks what `zmem run` and the benchmarks need on this machine, and how to fix what is
    /// missing; exit status 1 when `zmem run` cannot work here.
    Doctor(crate::doctor::DoctorArgs),
    /// Runs an unmodified program with its heap compressed: `zmem run --resident 2G -- PROGRAM
    /// ARGS...`; prints a summary when it exits.
    Run(crate::run::RunArgs),
    /// A running program's live statistics (zmem stat PID), every zmem process of this user
    /// (--all), or Prometheus text (--prometheus).
    Stat(crate::stat::StatArgs),
    /// Benchmarks, measured side by side with the kernel's zram.
    #[command(subcommand)]
    Bench(zmem_bench::BenchCommand),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(a) => crate::demo::run(&a),
        Command::DemoWorker(a) => {
            if let Err(e) = crate::demo_worker::run(&a) {
                // Status 1 and the message on stderr, which `zmem demo` passes on.
                eprintln!("zmem demo-worker: error: {e:#}");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Doctor(a) => std::process::exit(crate::doctor::run(&a)?),
        Command::Run(a) => match crate::run::run(&a) {
            Ok(never) => match never {},
            Err(e) => {
                eprintln!("zmem: error: {e}");
                std::process::exit(e.exit_code());
            }
        },
        Command::Stat(a) => crate::stat::run(&a),
        Command::Bench(b) => b.run(),
    }
}
