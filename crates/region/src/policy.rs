//! Cold-page policy (placeholder being written: see the helper's spec).

/// Which pages leave DRAM first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Eviction {
    /// zmem's policy (fault-history CLOCK).
    #[default]
    Clock,
    /// First in, first out (umap's policy), the baseline.
    Fifo,
}
