//! The library's messages: tracing to stderr, filtered by ZMEM_LOG (default `warn`), each line
//! prefixed with `zmem` so it stands out from the program's own output.

use tracing_subscriber::EnvFilter;

pub fn init(filter: Option<&str>) {
    let filter =
        EnvFilter::try_new(filter.unwrap_or("warn")).unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_thread_names(true)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
