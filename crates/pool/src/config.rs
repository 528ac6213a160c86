//! The pool's settings and errors. A leaf of the crate (it imports nothing from its siblings),
//! so every module can name them without an import circle.

/// Pool configuration.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Largest object in bytes (1..=1 MiB). Default 64 KiB + 64.
    pub max_object_size: usize,
    /// Upper bound on pages per span for classes of objects up to a page (1..=32). Default 16.
    pub max_span_pages: usize,
    /// Bytes of span memory the pool may take from the OS; `None` = unlimited.
    pub mem_limit: Option<u64>,
    /// Objects larger than a page are stored as a run of their whole pages plus their tail as
    /// an object of the page classes (exact, no partly used large spans; a read copies the two
    /// parts together). Default true; false keeps them in the large size classes.
    pub split_large_objects: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_object_size: 64 * 1024 + 64,
            max_span_pages: 16,
            mem_limit: None,
            split_large_objects: true,
        }
    }
}

/// Errors of the pool.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    #[error("object of {size} bytes is larger than the pool's maximum object size {max}")]
    TooLarge { size: usize, max: usize },
    #[error("empty objects cannot be stored")]
    Empty,
    #[error("memory limit reached: {used} bytes used, limit {limit}, need {needed} more")]
    LimitExceeded { used: u64, limit: u64, needed: u64 },
    #[error("invalid or stale handle {0:#x}")]
    InvalidHandle(u64),
    #[error("the operating system refused memory: {0}")]
    OutOfMemory(String),
    #[error("invalid pool configuration: {0}")]
    InvalidConfig(String),
}
