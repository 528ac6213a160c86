//! SIGINT/SIGTERM as a flag the benchmark loops check, so that guards (zram reset, swapoff,
//! cgroup removal) run on the way out.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Returned by benchmark loops when SIGINT/SIGTERM arrived, so that guards (zram reset) run.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

static ABORT: AtomicBool = AtomicBool::new(false);
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static HANDLER: Once = Once::new();

/// Turns SIGINT/SIGTERM into the global abort flag (checked by the bench loops). A second
/// signal exits at once (status 130) in case a loop is stuck in a system call.
pub fn install_abort_handler() {
    HANDLER.call_once(|| {
        let res = ctrlc::set_handler(|| {
            ABORT.store(true, Ordering::SeqCst);
            if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
                eprintln!("zmem: second interrupt, exiting without cleanup");
                std::process::exit(130);
            }
            eprintln!("zmem: interrupted, stopping and cleaning up (again to exit at once)");
        });
        if let Err(e) = res {
            tracing::warn!("cannot install the SIGINT/SIGTERM handler: {e}");
        }
    });
}

/// Whether an abort was requested.
pub fn aborted() -> bool {
    ABORT.load(Ordering::Relaxed)
}

/// Err(Interrupted) once an abort was requested.
pub fn check_abort() -> Result<(), Interrupted> {
    if aborted() {
        Err(Interrupted)
    } else {
        Ok(())
    }
}

/// Requests an abort as a signal would (used by tests and by fatal errors in worker threads).
pub fn request_abort() {
    ABORT.store(true, Ordering::SeqCst);
}
