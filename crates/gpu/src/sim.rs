//! A device that compresses on the CPU and fails on demand in every way a GPU can: a lost
//! context, no device memory, a page the device refuses, output that does not decode, a
//! reset that fails, a device that answers for fewer pages than it was given. The backend's
//! and the engine's handling of each is tested with it on machines without a GPU.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use zmem_codec::{Codec, CodecId};

use crate::device::{Device, Transfer};
use crate::{GpuCodec, GpuError};

/// The switches of a `SimDevice`, shared with the test that flips them.
#[derive(Default)]
pub struct SimFaults {
    /// The next N batches fail as a lost context would (CUDA 999, a reset follows).
    pub lose_context: AtomicU32,
    /// The next N batches fail for want of device memory (CUDA 2: no reset).
    pub out_of_memory: AtomicU32,
    /// Every Nth page of a batch gets nvCOMP's "cannot compress" (0: none).
    pub refuse_every: AtomicUsize,
    /// Every Nth page's output has a byte flipped (0: none).
    pub corrupt_every: AtomicUsize,
    /// Resets fail while set.
    pub reset_fails: AtomicBool,
    /// The context is lost (set by a `lose_context` failure, cleared by a reset): shared by
    /// every device made with these faults, as a GPU context is by its streams.
    pub lost: AtomicBool,
    /// The next batch answers for one page fewer than it was given.
    pub drop_one: AtomicBool,
    /// Batches wait while set (a busy device: the queue fills).
    pub hold: AtomicBool,
    /// The next batch panics inside the device's code.
    pub panic: AtomicBool,
    /// Counts: batches compressed, resets done.
    pub batches: AtomicU64,
    pub resets: AtomicU64,
}

fn take(n: &AtomicU32) -> bool {
    n.fetch_update(SeqCst, SeqCst, |v| v.checked_sub(1)).is_ok()
}

pub struct SimDevice {
    faults: Arc<SimFaults>,
    max_chunks: usize,
    max_chunk_bytes: usize,
    max_batch_bytes: usize,
}

impl SimDevice {
    /// A device of the geometry `cfg` asks for.
    pub fn new(cfg: &crate::GpuConfig) -> (SimDevice, Arc<SimFaults>) {
        let faults = Arc::new(SimFaults::default());
        (Self::sharing(cfg, faults.clone()), faults)
    }

    /// Another device on the same simulated GPU (one more stream): the faults are shared.
    pub fn sharing(cfg: &crate::GpuConfig, faults: Arc<SimFaults>) -> SimDevice {
        SimDevice {
            faults,
            max_chunks: cfg.max_chunks,
            max_chunk_bytes: cfg.max_chunk_bytes,
            max_batch_bytes: cfg.staging_bytes,
        }
    }

    /// What the CPU codec makes of `input`, without zmem's header; for input it cannot
    /// shrink, a payload longer than the input (as a GPU's stored deflate blocks are).
    fn payload(codec: GpuCodec, input: &[u8]) -> Vec<u8> {
        // nvCOMP's deflate algorithms by the zlib level each aims to beat.
        let cpu = match codec {
            GpuCodec::Lz4 => Codec::LZ4,
            GpuCodec::Deflate { algorithm } => Codec::Deflate {
                level: match algorithm {
                    ..=3 => 1,
                    4 => 6,
                    _ => 9,
                },
            },
        };
        let mut out = vec![0u8; zmem_codec::max_encoded_len(input.len())];
        let enc = zmem_codec::encode(cpu, None, input, &mut out, 1.0).expect("valid input");
        if enc.codec == CodecId::Raw {
            return vec![0; input.len() + 16];
        }
        out[zmem_codec::HEADER_LEN..enc.len].to_vec()
    }
}

impl Device for SimDevice {
    fn describe(&self) -> String {
        "simulated GPU (CPU codecs, injected faults)".into()
    }

    fn max_chunks(&self) -> usize {
        self.max_chunks
    }

    fn max_chunk_bytes(&self) -> usize {
        self.max_chunk_bytes
    }

    fn max_batch_bytes(&self) -> usize {
        self.max_batch_bytes
    }

    fn compress(
        &mut self,
        codec: GpuCodec,
        inputs: &[&[u8]],
        out: &mut Vec<Result<Vec<u8>, GpuError>>,
    ) -> Result<Transfer, GpuError> {
        let f = &self.faults;
        while f.hold.load(SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if f.lost.load(SeqCst) || take(&f.lose_context) {
            f.lost.store(true, SeqCst);
            return Err(GpuError::Cuda {
                call: "cuStreamSynchronize",
                code: 999,
                name: "CUDA_ERROR_UNKNOWN (simulated)".into(),
            });
        }
        if f.panic.swap(false, SeqCst) {
            panic!("simulated panic in the device's code");
        }
        if take(&f.out_of_memory) {
            return Err(GpuError::Cuda {
                call: "cuMemAlloc",
                code: 2,
                name: "CUDA_ERROR_OUT_OF_MEMORY (simulated)".into(),
            });
        }
        let longest = inputs.iter().map(|i| i.len()).max().unwrap_or(0);
        if inputs.len() > self.max_chunks
            || crate::batch_bytes(inputs.len(), longest) > self.max_batch_bytes
        {
            return Err(GpuError::Config(format!(
                "a batch of {} inputs (longest {longest})",
                inputs.len()
            )));
        }
        f.batches.fetch_add(1, SeqCst);
        let (refuse, corrupt) = (f.refuse_every.load(SeqCst), f.corrupt_every.load(SeqCst));
        out.clear();
        let mut moved = 0u64;
        for (i, input) in inputs.iter().enumerate() {
            moved += input.len() as u64;
            if refuse > 0 && (i + 1) % refuse == 0 {
                out.push(Err(GpuError::Chunk {
                    index: i,
                    status: 19,
                }));
                continue;
            }
            let mut p = Self::payload(codec, input);
            if corrupt > 0 && (i + 1) % corrupt == 0 {
                let k = p.len() / 2;
                p[k] ^= 0x5a;
                let last = p.len() - 1;
                p[last] ^= 0xff;
            }
            out.push(Ok(p));
        }
        if f.drop_one.swap(false, SeqCst) {
            out.pop();
        }
        Ok(Transfer {
            to_device: moved,
            to_host: moved,
        })
    }

    fn reset(&mut self) -> Result<(), GpuError> {
        if self.faults.reset_fails.load(SeqCst) {
            return Err(GpuError::Injected("reset refused (simulated)".into()));
        }
        self.faults.resets.fetch_add(1, SeqCst);
        self.faults.lost.store(false, SeqCst);
        Ok(())
    }
}
