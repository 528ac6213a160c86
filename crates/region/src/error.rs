//! The errors of a region.

use zmem_store::StoreError;

/// Errors of a region. Creating a region either succeeds whole or leaves nothing behind.
#[derive(thiserror::Error, Debug)]
pub enum RegionError {
    #[error(
        "cannot open /dev/userfaultfd: {source}. zmem needs full-mode userfaultfd: give this user \
         read-write access to /dev/userfaultfd (e.g. `setfacl -m u:$USER:rw /dev/userfaultfd`), \
         or run with CAP_SYS_PTRACE, or set vm.unprivileged_userfaultfd=1"
    )]
    Permission { source: std::io::Error },
    #[error("userfaultfd lacks {feature}: {why}")]
    Unsupported { feature: &'static str, why: String },
    #[error("{op} failed: {source}")]
    Os {
        op: &'static str,
        source: std::io::Error,
    },
    #[error("invalid region configuration: {0}")]
    Config(String),
    #[error("page store: {0}")]
    Store(#[from] StoreError),
    #[error("this process is a fork of the one that created the region; only the creator can {0}")]
    ForkedChild(&'static str),
}

/// The error of a failed system call `op` (errno).
pub(crate) fn os(op: &'static str) -> RegionError {
    RegionError::Os {
        op,
        source: std::io::Error::last_os_error(),
    }
}
