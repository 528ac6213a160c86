//! `zmem`: errors print as one line `zmem: error: ...` on stderr and exit with status 2.

use clap::error::ErrorKind;
use clap::Parser;
use zmem_cli::cli::{self, Cli};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();

    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                let _ = e.print();
                std::process::exit(0);
            }
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                std::process::exit(2);
            }
            _ => fail(&clap_one_line(&e)),
        },
    };
    if let Err(err) = cli::run(cli) {
        fail(&format!("{err:#}"));
    }
}

fn fail(msg: &str) -> ! {
    let one = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    eprintln!("zmem: error: {one}");
    std::process::exit(2);
}

/// clap's multi-line message as one line: "invalid value 'x' for '--rw <RW>'; [possible values: ...]".
fn clap_one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    text.lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("For more information") && !l.starts_with("Usage:")
        })
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("; ")
}
