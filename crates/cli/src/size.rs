//! Sizes on the command line (shared with the preload library's ZMEM_* settings).

pub use zmem_runenv::size::{
    format_mib, format_mib_1, format_size, format_size_approx, format_size_mg, parse_size,
    parse_size_usize, SizeError,
};
