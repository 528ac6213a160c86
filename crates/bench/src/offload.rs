//! `zmem bench codecs --backend gpu|sim`: the corpus's blocks compressed through the
//! accelerator backend in batches, end to end (packing, transfers, the device, zmem's object
//! header), beside the CPU codecs' rows: MB/s, ratio, host CPU seconds per GiB, bytes over
//! the bus. Every object is decoded on the CPU after the timed passes and compared.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use zmem_codec::Codec;
use zmem_engine::{Backend, Completion, Job, Sink};
use zmem_gpu::{GpuBackend, GpuConfig};

use crate::pages::cpu_times;

/// Which device the offload rows use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The CPU codecs, one thread (the default table).
    Cpu,
    /// nvCOMP on an NVIDIA GPU (needs the driver and nvCOMP 6; `zmem doctor` says what is
    /// missing).
    Gpu,
    /// The GPU backend over a simulated device that compresses on the CPU: checks the
    /// benchmark's own path on machines without a GPU; its speeds mean nothing.
    Sim,
}

/// The codecs an accelerator produces in formats the CPU decodes.
pub const OFFLOAD_CODECS: [&str; 3] = ["lz4", "deflate-1", "deflate-6"];

#[derive(serde::Serialize)]
pub struct OffloadRow {
    pub backend: &'static str,
    pub codec: String,
    pub block: usize,
    pub blocks: usize,
    pub batch: usize,
    pub ratio: f64,
    /// Input bytes per second of wall time, end to end (median pass).
    pub compress_mb_s: f64,
    /// Host CPU seconds (every thread of this process) per GiB compressed.
    pub host_cpu_s_per_gib: f64,
    /// Bytes over the bus per input byte, both ways.
    pub bus_bytes_per_byte: f64,
    pub rejected_blocks: usize,
    /// Pages the device failed (redone on the CPU by the engine in real use; counted here).
    pub device_failures: u64,
}

/// The backend `kind` names (None for the CPU), or why there is none.
pub fn open_backend(kind: BackendKind, cfg: GpuConfig) -> anyhow::Result<Option<GpuBackend>> {
    match kind {
        BackendKind::Gpu => GpuBackend::open(cfg)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--backend gpu: no GPU backend on this machine: {e}")),
        BackendKind::Sim => {
            let (first, faults) = zmem_gpu::sim::SimDevice::new(&cfg);
            let mut devices = vec![first];
            for _ in 1..cfg.streams {
                devices.push(zmem_gpu::sim::SimDevice::sharing(&cfg, faults.clone()));
            }
            Ok(Some(GpuBackend::with_devices(devices, cfg)?))
        }
        BackendKind::Cpu => Ok(None),
    }
}

/// One pass: every block submitted in batches of `batch`, every completion awaited.
/// Returns the objects by block index, or the first failure.
fn pass(
    backend: &GpuBackend,
    blocks: &[Arc<[u8]>],
    codec: Codec,
    batch: usize,
) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
    let (tx, rx) = mpsc::channel::<Completion>();
    let tx = Mutex::new(tx);
    let sink: Sink = Arc::new(move |c| {
        let _ = tx.lock().map(|t| t.send(c));
    });
    let mut sent = 0;
    let mut objects: Vec<Option<Vec<u8>>> = vec![None; blocks.len()];
    let mut got = 0;
    let take = |c: Completion, objects: &mut Vec<Option<Vec<u8>>>| {
        // A page the device failed stays None (counted by the backend's statistics).
        objects[c.job.tag as usize] = c.result.ok().map(|(o, _)| o);
    };
    while sent < blocks.len() {
        let end = (sent + batch).min(blocks.len());
        let jobs: Vec<Job> = (sent..end)
            .map(|i| Job {
                tag: i as u64,
                input: blocks[i].clone(),
                codec,
                dict: None,
            })
            .collect();
        match backend.submit(jobs, sink.clone()) {
            Ok(()) => sent = end,
            // The queue is full: take a completion and try again.
            Err(zmem_engine::Rejected::Saturated(_)) => {
                let c = rx.recv_timeout(Duration::from_secs(60))?;
                take(c, &mut objects);
                got += 1;
            }
            Err(zmem_engine::Rejected::Unsupported(_)) => {
                anyhow::bail!(
                    "the backend does not take {codec} blocks of {} bytes",
                    blocks[0].len()
                )
            }
            Err(zmem_engine::Rejected::Failed(_, e)) => anyhow::bail!("the backend failed: {e}"),
        }
    }
    while got < blocks.len() {
        let c = rx.recv_timeout(Duration::from_secs(60))?;
        take(c, &mut objects);
        got += 1;
    }
    Ok(objects)
}

/// The offload rows for one block size.
pub fn rows(
    kind: BackendKind,
    blocks: &[&[u8]],
    bs: usize,
    batch: usize,
) -> anyhow::Result<Vec<OffloadRow>> {
    let cfg = GpuConfig {
        max_chunks: batch,
        max_chunk_bytes: bs.next_multiple_of(zmem_gpu::ALIGN).max(512),
        staging_bytes: zmem_gpu::batch_bytes(batch, bs).max(bs.next_multiple_of(zmem_gpu::ALIGN)),
        ..GpuConfig::default()
    };
    let backend = open_backend(kind, cfg)?
        .ok_or_else(|| anyhow::anyhow!("the CPU rows are not offloaded"))?;
    let owned: Vec<Arc<[u8]>> = blocks.iter().map(|b| Arc::<[u8]>::from(*b)).collect();
    let total = (blocks.len() * bs) as f64;
    let mut out = Vec::new();
    for name in OFFLOAD_CODECS {
        let codec: Codec = name.parse()?;
        let before = backend.stats();
        let (u0, s0) = cpu_times();
        let mut objects = Vec::new();
        let mut passes = 0u32;
        let t = crate::codecs::time_passes(|| {
            objects = pass(&backend, &owned, codec, batch)?;
            passes += 1;
            Ok(())
        })?;
        let (u1, s1) = cpu_times();
        let after = backend.stats();
        let mut stored = 0usize;
        let mut rejected = 0;
        let mut back = vec![0u8; bs];
        for (i, o) in objects.iter().enumerate() {
            let Some(o) = o else {
                anyhow::bail!(
                    "{name}: block {i} failed on the device ({:?})",
                    after.last_error
                );
            };
            let h = zmem_codec::peek_header(o)?;
            rejected += usize::from(h.codec == zmem_codec::CodecId::Raw);
            let n = zmem_codec::decode(o, None, &mut back)?;
            anyhow::ensure!(
                n == bs && back[..] == blocks[i][..],
                "{name} block {i} of {bs} bytes from the {kind:?} backend did not round-trip"
            );
            stored += o.len();
        }
        let bytes = total * f64::from(passes);
        let bus = (after.to_device - before.to_device + after.to_host - before.to_host) as f64;
        out.push(OffloadRow {
            backend: match kind {
                BackendKind::Gpu => "gpu",
                _ => "sim",
            },
            codec: name.to_string(),
            block: bs,
            blocks: blocks.len(),
            batch,
            ratio: total / stored as f64,
            compress_mb_s: total / t / 1e6,
            host_cpu_s_per_gib: ((u1 - u0) + (s1 - s0)) / (bytes / (1u64 << 30) as f64),
            bus_bytes_per_byte: bus / bytes,
            rejected_blocks: rejected,
            device_failures: after.page_failures - before.page_failures
                + (after.batch_failures - before.batch_failures),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(n: usize, bs: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let line = format!("block {i} of the offload test, compressible text\n");
                line.bytes().cycle().take(bs).collect()
            })
            .collect()
    }

    /// The whole offload path (batches, completions, CPU decode and compare) on the simulated
    /// device: one row per offload codec, every block round-tripped, the bus counted.
    #[test]
    fn the_offload_rows_come_from_verified_round_trips() {
        let owned = blocks(200, 4096);
        let refs: Vec<&[u8]> = owned.iter().map(|b| &b[..]).collect();
        let rows = rows(BackendKind::Sim, &refs, 4096, 64).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.codec.as_str()).collect();
        assert_eq!(names, OFFLOAD_CODECS);
        for r in &rows {
            assert!(r.ratio > 3.0, "{}: {}", r.codec, r.ratio);
            assert_eq!(
                (r.backend, r.blocks, r.batch, r.device_failures),
                ("sim", 200, 64, 0)
            );
            assert!(r.bus_bytes_per_byte >= 2.0, "{}", r.bus_bytes_per_byte);
            assert!(r.compress_mb_s > 0.0 && r.host_cpu_s_per_gib > 0.0);
        }
    }

    #[test]
    fn without_a_gpu_the_backend_says_why() {
        match open_backend(BackendKind::Gpu, GpuConfig::default()) {
            Ok(b) => assert!(b.is_some()), // a lent GPU machine
            Err(e) => assert!(e.to_string().starts_with("--backend gpu: "), "{e}"),
        }
        assert!(open_backend(BackendKind::Cpu, GpuConfig::default())
            .unwrap()
            .is_none());
    }
}
