//! What the backend needs of a device: compress a batch of inputs from host memory into host
//! memory. The nvCOMP device implements it, and so does the test device (`sim`), which can fail
//! in every way a GPU can.

use crate::{GpuCodec, GpuError};

/// What one batch cost besides time: bytes over the bus each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfer {
    pub to_device: u64,
    pub to_host: u64,
}

pub trait Device: Send + 'static {
    /// One line for logs and `zmem stat`: the device, its driver, the library.
    fn describe(&self) -> String;
    /// The most inputs one call takes.
    fn max_chunks(&self) -> usize;
    /// The largest input it takes.
    fn max_chunk_bytes(&self) -> usize;
    /// The most input bytes of one call, counted as `batch_bytes` counts them.
    fn max_batch_bytes(&self) -> usize;
    /// Compresses every input with `codec`. On success `out[i]` is input i's payload (a raw
    /// deflate stream or an LZ4 block, no header) or that input's own failure (`Chunk`); an
    /// `Err` fails the whole batch (a lost context, no memory on the device).
    fn compress(
        &mut self,
        codec: GpuCodec,
        inputs: &[&[u8]],
        out: &mut Vec<Result<Vec<u8>, GpuError>>,
    ) -> Result<Transfer, GpuError>;
    /// Sets the device up again after a failure that lost its context (`loses_context`).
    fn reset(&mut self) -> Result<(), GpuError>;
}

/// Alignment of every input and output on both sides of the bus (nvCOMP asks for at most 8;
/// more keeps the copies on whole cache lines).
pub const ALIGN: usize = 256;

/// Staging bytes a batch of `n` inputs of at most `max_len` bytes takes: one stride per input,
/// the largest input rounded up to `ALIGN`.
pub fn batch_bytes(n: usize, max_len: usize) -> usize {
    n * max_len.next_multiple_of(ALIGN)
}
