//! The compression service engine (QZRAM/QZFS): it picks a codec per request from a policy,
//! routes batches to a backend (the CPU worker pool now, an accelerator later), and falls back to
//! the CPU when a backend fails, is saturated or returns bad output, so no page is ever lost or
//! corrupted. It comes back to the backend once the backend recovers.
//!
//! The interface is one asynchronous batch call: [`Engine::submit`] takes jobs and a completion
//! sink; every job gets exactly one [`Completion`] through the sink, from whichever thread
//! finished it. The caller does not block on compression (only on a full CPU queue, which is the
//! back-pressure of the last resort).

mod backend;
mod cpu;
mod policy;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_codec::{Codec, CodecError, CodecId, Dictionary, Encoded};
use zmem_os::sync::Mutex;

pub use backend::{Backend, BackendError, Rejected, SharedBackend};
pub use cpu::CpuBackend;
pub use policy::{Policy, PolicyError};

/// One compression request.
pub struct Job {
    /// Caller's identifier, returned in the completion.
    pub tag: u64,
    /// The bytes to compress (a page or a multi-page block).
    pub input: Arc<[u8]>,
    pub codec: Codec,
    pub dict: Option<Arc<Dictionary>>,
}

/// The result of one job: an encoded object in zmem's format, decodable on the CPU whichever
/// backend produced it.
pub struct Completion {
    /// The job as submitted (so a failed one can be redone).
    pub job: Job,
    pub result: Result<(Vec<u8>, Encoded), EngineError>,
    /// Which backend produced the output.
    pub backend: &'static str,
}

/// Where completions go. Called once per job, from any thread.
pub type Sink = Arc<dyn Fn(Completion) + Send + Sync>;

#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum EngineError {
    #[error("codec error: {0}")]
    Codec(#[from] CodecError),
    #[error("the CPU backend is shut down")]
    Shutdown,
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// An accelerator could not finish a job it had taken (the engine redoes it on the CPU).
    #[error("accelerator: {0}")]
    Backend(#[from] BackendError),
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// CPU worker threads (default: the number of CPUs).
    pub cpu_workers: usize,
    /// Bound of the CPU queue in jobs; a full queue blocks the submitter (back-pressure).
    pub cpu_queue: usize,
    /// QZFS's size rule: batches smaller than this many bytes stay on the CPU.
    pub offload_min_bytes: usize,
    /// QZFS's rejection threshold handed to the codec.
    pub reject_ratio: f32,
    /// Consecutive accelerator failures after which it is taken out of service.
    pub failure_threshold: u32,
    /// How long an out-of-service accelerator rests before the engine probes it again.
    pub retry_after: Duration,
    /// Decode the accelerator's output and compare it with the input before accepting it.
    pub verify_offload: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            // The affinity mask, not std's `available_parallelism`: that also reads the
            // cgroup's CPU quota (/proc/self/cgroup, mountinfo, the quota files), ~70 µs in
            // every process a zmem run starts in, where the pool is made only by a batch.
            cpu_workers: zmem_os::thread::cpus_available(),
            cpu_queue: 8192,
            offload_min_bytes: 64 * 1024,
            reject_ratio: zmem_codec::DEFAULT_REJECT_RATIO,
            failure_threshold: 3,
            retry_after: Duration::from_millis(200),
            verify_offload: true,
        }
    }
}

/// Counters of the engine, cumulative.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub jobs_cpu: u64,
    pub jobs_offloaded: u64,
    /// Jobs that an accelerator did not finish correctly and the CPU redid.
    pub fallbacks: u64,
    /// Batches kept on the CPU because the accelerator was saturated.
    pub saturated: u64,
    /// Accelerator outputs that failed verification.
    pub bad_outputs: u64,
    /// Times the accelerator was taken out of service / put back.
    pub backend_failures: u64,
    pub backend_recoveries: u64,
    pub backend_healthy: bool,
    /// Per codec id (raw, lz4, zstd, deflate): objects produced, input bytes, output bytes,
    /// nanoseconds of CPU time in the codec on the CPU path.
    pub per_codec: [CodecCounters; 4],
    pub rejected: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodecCounters {
    pub objects: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    pub nanos: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) jobs_cpu: AtomicU64,
    pub(crate) jobs_offloaded: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
    pub(crate) saturated: AtomicU64,
    pub(crate) bad_outputs: AtomicU64,
    pub(crate) backend_failures: AtomicU64,
    pub(crate) backend_recoveries: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) codec: [[AtomicU64; 4]; 4],
}

impl Counters {
    pub(crate) fn record(&self, requested: Codec, enc: &Encoded, in_len: usize, nanos: u64) {
        let slot = &self.codec[enc.codec as usize];
        slot[0].fetch_add(1, Ordering::Relaxed);
        slot[1].fetch_add(in_len as u64, Ordering::Relaxed);
        slot[2].fetch_add(enc.len as u64, Ordering::Relaxed);
        // Time is charged to the codec that was asked for: a rejected lz4 attempt cost lz4 time.
        self.codec[requested.id() as usize][3].fetch_add(nanos, Ordering::Relaxed);
        if enc.rejected {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Compresses one input on the calling thread: the path for single pages (QZFS's size rule).
pub(crate) fn compress_on_cpu(
    counters: &Counters,
    codec: Codec,
    dict: Option<&Dictionary>,
    input: &[u8],
    reject_ratio: f32,
) -> Result<(Vec<u8>, Encoded), EngineError> {
    let mut out = vec![0u8; zmem_codec::max_encoded_len(input.len())];
    let t = Instant::now();
    let enc = zmem_codec::encode(codec, dict, input, &mut out, reject_ratio)?;
    counters.record(codec, &enc, input.len(), t.elapsed().as_nanos() as u64);
    out.truncate(enc.len);
    Ok((out, enc))
}

struct Accelerator {
    backend: Arc<dyn Backend>,
    healthy: AtomicBool,
    consecutive_failures: AtomicU64,
    down_since: Mutex<Option<Instant>>,
}

/// What the engine and the completion sinks of in-flight accelerator jobs share.
struct Shared {
    cfg: EngineConfig,
    cpu: CpuBackend,
    accel: Option<Accelerator>,
    counters: Arc<Counters>,
}

/// The engine: a CPU backend that always exists, and optionally one accelerator backend.
pub struct Engine {
    shared: Arc<Shared>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Result<Engine, EngineError> {
        Self::build(cfg, None)
    }

    /// An engine whose large batches go to `backend` first (QZFS's size rule keeps small ones
    /// on the CPU).
    pub fn with_accelerator(
        cfg: EngineConfig,
        backend: Arc<dyn Backend>,
    ) -> Result<Engine, EngineError> {
        Self::build(cfg, Some(backend))
    }

    fn build(cfg: EngineConfig, accel: Option<Arc<dyn Backend>>) -> Result<Engine, EngineError> {
        if cfg.cpu_workers == 0 || cfg.cpu_queue == 0 {
            return Err(EngineError::Config(
                "cpu_workers and cpu_queue must be at least 1".into(),
            ));
        }
        if !(cfg.reject_ratio > 0.0 && cfg.reject_ratio <= 1.0) {
            return Err(EngineError::Config(format!(
                "reject_ratio {} is not in (0, 1]",
                cfg.reject_ratio
            )));
        }
        let counters = Arc::new(Counters::default());
        let cpu = CpuBackend::start(
            cfg.cpu_workers,
            cfg.cpu_queue,
            cfg.reject_ratio,
            counters.clone(),
        )?;
        let accel = accel.map(|backend| Accelerator {
            backend,
            healthy: AtomicBool::new(true),
            consecutive_failures: AtomicU64::new(0),
            down_since: Mutex::new(None),
        });
        Ok(Engine {
            shared: Arc::new(Shared {
                cfg,
                cpu,
                accel,
                counters,
            }),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.cfg
    }

    /// Compresses on the calling thread, now. For single pages, where a queue hop costs more
    /// than it saves.
    pub fn compress_now(
        &self,
        codec: Codec,
        dict: Option<&Dictionary>,
        input: &[u8],
    ) -> Result<(Vec<u8>, Encoded), EngineError> {
        let s = &self.shared;
        s.counters.jobs_cpu.fetch_add(1, Ordering::Relaxed);
        compress_on_cpu(&s.counters, codec, dict, input, s.cfg.reject_ratio)
    }

    /// Submits a batch; each job completes exactly once through `sink`.
    pub fn submit(&self, jobs: Vec<Job>, sink: Sink) -> Result<(), EngineError> {
        if jobs.is_empty() {
            return Ok(());
        }
        let s = &self.shared;
        let bytes: usize = jobs.iter().map(|j| j.input.len()).sum();
        if let Some(acc) = &s.accel {
            if bytes >= s.cfg.offload_min_bytes && s.accel_available(acc) {
                let n = jobs.len() as u64;
                let shared = self.shared.clone();
                let caller = sink.clone();
                let wrapped: Sink = Arc::new(move |c| shared.accelerator_done(c, &caller));
                match acc.backend.submit(jobs, wrapped) {
                    Ok(()) => {
                        s.counters.jobs_offloaded.fetch_add(n, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(Rejected::Saturated(jobs)) => {
                        s.counters.saturated.fetch_add(1, Ordering::Relaxed);
                        return s.cpu.submit_jobs(jobs, sink);
                    }
                    Err(Rejected::Unsupported(jobs)) => {
                        return s.cpu.submit_jobs(jobs, sink);
                    }
                    Err(Rejected::Failed(jobs, err)) => {
                        tracing::warn!(backend = acc.backend.name(), %err, "submit failed; using the CPU");
                        s.note_failure(acc);
                        s.counters
                            .fallbacks
                            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
                        return s.cpu.submit_jobs(jobs, sink);
                    }
                }
            }
        }
        s.cpu.submit_jobs(jobs, sink)
    }

    pub fn stats(&self) -> EngineStats {
        let s = &self.shared;
        let c = &s.counters;
        let mut per_codec = [CodecCounters::default(); 4];
        for id in CodecId::ALL {
            let k = &c.codec[id as usize];
            per_codec[id as usize] = CodecCounters {
                objects: k[0].load(Ordering::Relaxed),
                in_bytes: k[1].load(Ordering::Relaxed),
                out_bytes: k[2].load(Ordering::Relaxed),
                nanos: k[3].load(Ordering::Relaxed),
            };
        }
        EngineStats {
            jobs_cpu: c.jobs_cpu.load(Ordering::Relaxed),
            jobs_offloaded: c.jobs_offloaded.load(Ordering::Relaxed),
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            saturated: c.saturated.load(Ordering::Relaxed),
            bad_outputs: c.bad_outputs.load(Ordering::Relaxed),
            backend_failures: c.backend_failures.load(Ordering::Relaxed),
            backend_recoveries: c.backend_recoveries.load(Ordering::Relaxed),
            backend_healthy: s
                .accel
                .as_ref()
                .map(|a| a.healthy.load(Ordering::Acquire))
                .unwrap_or(false),
            per_codec,
            rejected: c.rejected.load(Ordering::Relaxed),
        }
    }

    /// Name of the accelerator, if any.
    pub fn accelerator(&self) -> Option<&str> {
        self.shared.accel.as_ref().map(|a| a.backend.name())
    }
}

impl Shared {
    /// Whether the accelerator may take work: healthy, or resting long enough to be probed.
    fn accel_available(&self, acc: &Accelerator) -> bool {
        if acc.healthy.load(Ordering::Acquire) {
            return true;
        }
        let mut down = acc.down_since.lock();
        match *down {
            Some(t) if t.elapsed() >= self.cfg.retry_after => {
                // Probe: let this batch through; a success marks it healthy again.
                *down = Some(Instant::now());
                true
            }
            _ => false,
        }
    }

    fn note_failure(&self, acc: &Accelerator) {
        let n = acc.consecutive_failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= u64::from(self.cfg.failure_threshold) && acc.healthy.swap(false, Ordering::AcqRel) {
            self.counters
                .backend_failures
                .fetch_add(1, Ordering::Relaxed);
            *acc.down_since.lock() = Some(Instant::now());
            tracing::warn!(
                backend = acc.backend.name(),
                "accelerator taken out of service"
            );
        } else if !acc.healthy.load(Ordering::Acquire) {
            *acc.down_since.lock() = Some(Instant::now());
        }
    }

    fn note_success(&self, acc: &Accelerator) {
        acc.consecutive_failures.store(0, Ordering::Release);
        if !acc.healthy.swap(true, Ordering::AcqRel) {
            self.counters
                .backend_recoveries
                .fetch_add(1, Ordering::Relaxed);
            *acc.down_since.lock() = None;
            tracing::info!(backend = acc.backend.name(), "accelerator back in service");
        }
    }

    /// An accelerator completion: accepted if it succeeded and verifies, otherwise redone on
    /// the CPU before the caller sees it.
    fn accelerator_done(&self, c: Completion, sink: &Sink) {
        let Some(acc) = &self.accel else {
            sink(c);
            return;
        };
        let ok = match &c.result {
            Ok((obj, _)) => !self.cfg.verify_offload || verify(obj, &c.job),
            Err(_) => false,
        };
        if ok {
            self.note_success(acc);
            if let Ok((_, enc)) = &c.result {
                // Accelerator time is not CPU time: no codec nanos are charged.
                self.counters.record(c.job.codec, enc, c.job.input.len(), 0);
            }
            sink(c);
            return;
        }
        if c.result.is_ok() {
            self.counters.bad_outputs.fetch_add(1, Ordering::Relaxed);
        }
        self.note_failure(acc);
        self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.cpu.submit_jobs(vec![c.job], sink.clone()) {
            tracing::error!(%e, "CPU fallback refused a job");
        }
    }
}

fn verify(obj: &[u8], job: &Job) -> bool {
    let mut back = vec![0u8; job.input.len()];
    matches!(zmem_codec::decode(obj, job.dict.as_deref(), &mut back),
        Ok(n) if n == job.input.len() && back[..] == job.input[..])
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(acc) = &self.shared.accel {
            acc.backend.drain();
        }
        self.shared.cpu.shutdown();
    }
}

#[cfg(test)]
mod tests;
