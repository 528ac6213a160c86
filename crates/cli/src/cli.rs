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
    /// Shows what zmem saves on the built-in demo data (the Calgary corpus), per policy.
    Demo(crate::demo::DemoArgs),
    /// Runs an unmodified program with its heap compressed: `zmem run --resident 2G -- PROGRAM
    /// ARGS...`; prints a summary when it exits.
    Run(crate::run::RunArgs),
    /// A running program's live statistics (zmem stat PID).
    Stat(crate::run::StatArgs),
    /// Benchmarks, measured side by side with the kernel's zram.
    #[command(subcommand)]
    Bench(zmem_bench::BenchCommand),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(a) => crate::demo::run(&a),
        Command::Run(a) => match crate::run::run(&a) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("zmem: error: {e}");
                std::process::exit(e.exit_code());
            }
        },
        Command::Stat(a) => crate::run::stat(&a),
        Command::Bench(b) => b.run(),
    }
}
