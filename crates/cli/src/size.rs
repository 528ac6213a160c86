//! Sizes on the command line (shared with the preload library's ZMEM_* settings).

pub use zmem_runenv::size::{parse_size, parse_size_usize, SizeError};
