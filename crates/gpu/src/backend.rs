//! `GpuBackend`: the engine's accelerator backend over `Device`s. Batches wait in a short
//! queue (full: `Saturated`, the CPU takes the batch); one worker thread per device (a stream
//! of its own on the GPU) feeds it and delivers every job's completion to the engine's sink, an object in zmem's format or the
//! device's error (the engine then redoes the job on the CPU). A failure that loses the
//! device's context is followed by a reset before the next batch.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use zmem_engine::{Backend, BackendError, Completion, EngineError, Job, Rejected, Sink};
use zmem_os::sync::{Condvar, Mutex};

use crate::device::Device;
use crate::{GpuCodec, GpuConfig, GpuError};

/// Cumulative figures of a GPU backend (`zmem stat`, the benchmarks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Device calls made, and the pages (jobs) in them.
    pub batches: u64,
    pub pages: u64,
    /// Input bytes of those pages and bytes of the objects made from them.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Bytes over the bus, host to device and back (arrays and padding included).
    pub to_device: u64,
    pub to_host: u64,
    /// Batches the device failed as a whole, pages it failed alone, and resets after a lost
    /// context (and those that failed).
    pub batch_failures: u64,
    pub page_failures: u64,
    pub resets: u64,
    pub reset_failures: u64,
    /// Wall time the worker spent in device calls.
    pub busy_ns: u64,
    /// The latest failure, for `zmem stat` and logs.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    pages: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    to_device: AtomicU64,
    to_host: AtomicU64,
    batch_failures: AtomicU64,
    page_failures: AtomicU64,
    resets: AtomicU64,
    reset_failures: AtomicU64,
    busy_ns: AtomicU64,
    last_error: Mutex<Option<String>>,
}

struct Work {
    jobs: Vec<Job>,
    sink: Sink,
}

/// What the submitting side and the worker share: batches accepted and not yet completed.
struct Queue {
    pending: AtomicUsize,
    lock: Mutex<()>,
    idle: Condvar,
}

impl Queue {
    fn done_one(&self) {
        let _g = self.lock.lock();
        self.pending.fetch_sub(1, Relaxed);
        self.idle.notify_all();
    }
}

pub struct GpuBackend {
    tx: Option<Sender<Work>>,
    queue: Arc<Queue>,
    counters: Arc<Counters>,
    workers: Vec<JoinHandle<()>>,
    description: String,
    max_chunk_bytes: usize,
    queue_batches: usize,
}

impl GpuBackend {
    /// The nvCOMP backend on device `cfg.device` (`cfg.streams` batches in flight), or why
    /// there is none.
    pub fn open(cfg: GpuConfig) -> Result<GpuBackend, GpuError> {
        let devices = crate::CudaDevice::open_many(cfg.clone(), cfg.streams)?;
        Self::with_devices(devices, cfg)
    }

    /// A backend over one device (the test device, or a CudaDevice opened by the caller).
    pub fn with_device<D: Device>(device: D, cfg: GpuConfig) -> Result<GpuBackend, GpuError> {
        Self::with_devices(vec![device], cfg)
    }

    /// A backend with one thread per device, all taking batches from one queue.
    pub fn with_devices<D: Device>(
        devices: Vec<D>,
        cfg: GpuConfig,
    ) -> Result<GpuBackend, GpuError> {
        cfg.validate()?;
        let Some(first) = devices.first() else {
            return Err(GpuError::Config("no device to run on".into()));
        };
        let description = match devices.len() {
            1 => first.describe(),
            n => format!("{}, {n} batches in flight", first.describe()),
        };
        let max_chunk_bytes = devices
            .iter()
            .map(|d| d.max_chunk_bytes())
            .min()
            .unwrap_or(0)
            .min(cfg.max_chunk_bytes);
        let (tx, rx) = crossbeam_channel::unbounded();
        let queue = Arc::new(Queue {
            pending: AtomicUsize::new(0),
            lock: Mutex::new(()),
            idle: Condvar::new(),
        });
        let counters = Arc::new(Counters::default());
        let mut workers = Vec::with_capacity(devices.len());
        for (i, device) in devices.into_iter().enumerate() {
            let (queue, counters, rx) = (queue.clone(), counters.clone(), rx.clone());
            let reject = cfg.reject_ratio;
            let spawned = std::thread::Builder::new()
                .name(format!("zmem-gpu-{i}"))
                .spawn(move || work(device, rx, &queue, &counters, reject));
            match spawned {
                Ok(w) => workers.push(w),
                Err(e) => {
                    drop(tx); // the threads already started end
                    for w in workers {
                        let _ = w.join();
                    }
                    return Err(GpuError::Config(format!("cannot start a GPU thread: {e}")));
                }
            }
        }
        Ok(GpuBackend {
            tx: Some(tx),
            queue,
            counters,
            workers,
            description,
            max_chunk_bytes,
            queue_batches: cfg.queue_batches,
        })
    }

    /// The device, its driver and nvCOMP, in one line.
    pub fn describe(&self) -> &str {
        &self.description
    }

    pub fn stats(&self) -> GpuStats {
        let c = &self.counters;
        GpuStats {
            batches: c.batches.load(Relaxed),
            pages: c.pages.load(Relaxed),
            bytes_in: c.bytes_in.load(Relaxed),
            bytes_out: c.bytes_out.load(Relaxed),
            to_device: c.to_device.load(Relaxed),
            to_host: c.to_host.load(Relaxed),
            batch_failures: c.batch_failures.load(Relaxed),
            page_failures: c.page_failures.load(Relaxed),
            resets: c.resets.load(Relaxed),
            reset_failures: c.reset_failures.load(Relaxed),
            busy_ns: c.busy_ns.load(Relaxed),
            last_error: c.last_error.lock().clone(),
        }
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn submit(&self, jobs: Vec<Job>, sink: Sink) -> Result<(), Rejected> {
        let doable = |j: &Job| {
            GpuCodec::for_codec(j.codec).is_some()
                && !j.input.is_empty()
                && j.input.len() <= self.max_chunk_bytes
        };
        if !jobs.iter().all(doable) {
            return Err(Rejected::Unsupported(jobs));
        }
        let Some(tx) = &self.tx else {
            return Err(Rejected::Failed(
                jobs,
                BackendError("the GPU backend is shut down".into()),
            ));
        };
        // One slot per batch; a full queue hands the batch back for the CPU.
        let q = &self.queue;
        if q.pending
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < self.queue_batches).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Rejected::Saturated(jobs));
        }
        if let Err(e) = tx.send(Work { jobs, sink }) {
            q.done_one();
            return Err(Rejected::Failed(
                e.into_inner().jobs,
                BackendError("the GPU thread has stopped".into()),
            ));
        }
        Ok(())
    }

    fn drain(&self) {
        let q = &self.queue;
        let mut g = q.lock.lock();
        while q.pending.load(Relaxed) != 0 {
            q.idle.wait(&mut g);
        }
    }
}

impl Drop for GpuBackend {
    fn drop(&mut self) {
        self.tx = None; // the workers end after the batches already queued
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn work<D: Device>(
    mut device: D,
    rx: Receiver<Work>,
    queue: &Queue,
    counters: &Counters,
    reject: f32,
) {
    let mut outs = Vec::new();
    while let Ok(Work { jobs, sink }) = rx.recv() {
        // Jobs of one codec go to the device together, at most `max_chunks` at a time.
        let mut by_codec: Vec<(GpuCodec, Vec<Job>)> = Vec::new();
        for job in jobs {
            let codec = GpuCodec::for_codec(job.codec).expect("checked at submit");
            match by_codec.iter_mut().find(|(c, _)| *c == codec) {
                Some((_, v)) => v.push(job),
                None => by_codec.push((codec, vec![job])),
            }
        }
        for (codec, mut jobs) in by_codec {
            while !jobs.is_empty() {
                let take = fitting(&jobs, device.max_chunks(), device.max_batch_bytes());
                let rest = jobs.split_off(take);
                run_batch(&mut device, codec, jobs, &sink, &mut outs, counters, reject);
                jobs = rest;
            }
        }
        queue.done_one();
    }
}

/// How many of `jobs`, from the first, one device call takes (at least one: every job fits
/// alone, `submit` checked its size).
fn fitting(jobs: &[Job], max_chunks: usize, max_bytes: usize) -> usize {
    let mut longest = 0;
    for (i, j) in jobs.iter().enumerate().take(max_chunks) {
        longest = longest.max(j.input.len());
        if i > 0 && crate::batch_bytes(i + 1, longest) > max_bytes {
            return i;
        }
    }
    jobs.len().min(max_chunks)
}

fn run_batch<D: Device>(
    device: &mut D,
    codec: GpuCodec,
    jobs: Vec<Job>,
    sink: &Sink,
    outs: &mut Vec<Result<Vec<u8>, GpuError>>,
    c: &Counters,
    reject: f32,
) {
    let inputs: Vec<&[u8]> = jobs.iter().map(|j| &j.input[..]).collect();
    let t = Instant::now();
    // A panic in the device's code must not lose the batch's jobs (their owner waits for
    // every completion): it fails the batch like any device error.
    let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        device.compress(codec, &inputs, outs)
    }))
    .unwrap_or_else(|_| Err(GpuError::Config("the device's code panicked".into())));
    let r = called.and_then(|t| match outs.len() == inputs.len() {
        true => Ok(t),
        // A device that answers for fewer pages than it was given must not lose the rest.
        false => Err(GpuError::Config(format!(
            "the device answered for {} of {} pages",
            outs.len(),
            inputs.len()
        ))),
    });
    c.busy_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
    drop(inputs);
    c.batches.fetch_add(1, Relaxed);
    c.pages.fetch_add(jobs.len() as u64, Relaxed);
    let fail = |e: &GpuError| Err(EngineError::Backend(BackendError(e.to_string())));
    match r {
        Ok(t) => {
            c.to_device.fetch_add(t.to_device, Relaxed);
            c.to_host.fetch_add(t.to_host, Relaxed);
            for (job, out) in jobs.into_iter().zip(outs.drain(..)) {
                let result = match out {
                    Ok(payload) => {
                        let mut obj = Vec::with_capacity(payload.len() + zmem_codec::HEADER_LEN);
                        zmem_codec::wrap_payload(codec.id(), &job.input, &payload, &mut obj, reject)
                            .map(|enc| {
                                c.bytes_in.fetch_add(job.input.len() as u64, Relaxed);
                                c.bytes_out.fetch_add(enc.len as u64, Relaxed);
                                (obj, enc)
                            })
                            .map_err(EngineError::Codec)
                    }
                    Err(e) => {
                        c.page_failures.fetch_add(1, Relaxed);
                        *c.last_error.lock() = Some(e.to_string());
                        fail(&e)
                    }
                };
                sink(Completion {
                    job,
                    result,
                    backend: "gpu",
                });
            }
        }
        Err(e) => {
            c.batch_failures.fetch_add(1, Relaxed);
            *c.last_error.lock() = Some(e.to_string());
            tracing::warn!(error = %e, pages = jobs.len(), "GPU batch failed; the CPU redoes it");
            for job in jobs {
                sink(Completion {
                    job,
                    result: fail(&e),
                    backend: "gpu",
                });
            }
            if e.loses_context() {
                c.resets.fetch_add(1, Relaxed);
                if let Err(r) = device.reset() {
                    c.reset_failures.fetch_add(1, Relaxed);
                    tracing::warn!(error = %r, "GPU reset failed; it is tried again after the next failure");
                }
            }
        }
    }
}
