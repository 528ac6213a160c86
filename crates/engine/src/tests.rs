use super::*;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;

fn page(seed: u64) -> Arc<[u8]> {
    // Compressible, distinct per seed.
    let mut v = Vec::with_capacity(4096);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < 4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let word = ["alpha ", "beta ", "gamma ", "delta\n"][(x % 4) as usize];
        v.extend_from_slice(word.as_bytes());
        v.extend_from_slice(&seed.to_le_bytes()[..2]);
    }
    v.truncate(4096);
    v.into()
}

/// An accelerator stand-in that fails in every way a real one can, on demand.
#[derive(Default)]
struct FaultyBackend {
    refuse_submit: AtomicBool,
    saturated: AtomicBool,
    unsupported: AtomicBool,
    fail_jobs: AtomicBool,
    corrupt: AtomicBool,
    in_flight: AtomicUsize,
    accepted: AtomicUsize,
}

impl Backend for FaultyBackend {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn submit(&self, jobs: Vec<Job>, sink: Sink) -> Result<(), Rejected> {
        if self.refuse_submit.load(Ordering::SeqCst) {
            return Err(Rejected::Failed(jobs, BackendError("device lost".into())));
        }
        if self.saturated.load(Ordering::SeqCst) {
            return Err(Rejected::Saturated(jobs));
        }
        if self.unsupported.load(Ordering::SeqCst) {
            return Err(Rejected::Unsupported(jobs));
        }
        self.accepted.fetch_add(jobs.len(), Ordering::SeqCst);
        self.in_flight.fetch_add(jobs.len(), Ordering::SeqCst);
        let fail = self.fail_jobs.load(Ordering::SeqCst);
        let corrupt = self.corrupt.load(Ordering::SeqCst);
        let me = self as *const FaultyBackend as usize;
        std::thread::spawn(move || {
            // SAFETY (test): the backend lives in an Arc owned by the test until drain() returns.
            let me = unsafe { &*(me as *const FaultyBackend) };
            for job in jobs {
                let result = if fail {
                    Err(EngineError::Config("injected job failure".into()))
                } else {
                    let mut out = vec![0u8; zmem_codec::max_encoded_len(job.input.len())];
                    let enc = zmem_codec::encode(
                        Codec::Deflate { level: 1 },
                        None,
                        &job.input,
                        &mut out,
                        0.9,
                    )
                    .unwrap();
                    out.truncate(enc.len);
                    if corrupt {
                        let n = out.len();
                        out[n / 2] ^= 0x5a;
                        out[n - 1] ^= 0xff;
                    }
                    Ok((out, enc))
                };
                sink(Completion {
                    job,
                    result,
                    backend: "faulty",
                });
                me.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        });
        Ok(())
    }
    fn drain(&self) {
        while self.in_flight.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

fn cfg() -> EngineConfig {
    EngineConfig {
        cpu_workers: 2,
        cpu_queue: 64,
        offload_min_bytes: 8 * 4096,
        failure_threshold: 2,
        retry_after: Duration::from_millis(30),
        ..EngineConfig::default()
    }
}

/// Submits `n` jobs in batches of `batch` and checks every one completes exactly once with
/// output that decodes to its input.
fn run_batches(engine: &Engine, first_tag: u64, n: u64, batch: usize, codec: Codec) {
    let (tx, rx) = mpsc::channel::<Completion>();
    let tx = Mutex::new(tx);
    let sink: Sink = Arc::new(move |c| tx.lock().send(c).unwrap());
    let tags: Vec<u64> = (first_tag..first_tag + n).collect();
    for chunk in tags.chunks(batch) {
        let jobs = chunk
            .iter()
            .map(|&t| Job {
                tag: t,
                input: page(t),
                codec,
                dict: None,
            })
            .collect();
        engine.submit(jobs, sink.clone()).unwrap();
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for _ in 0..n {
        let c = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a completion went missing");
        let (obj, _) = c
            .result
            .as_ref()
            .expect("the engine never returns a failed job");
        let mut back = vec![0u8; 4096];
        zmem_codec::decode(obj, None, &mut back).unwrap();
        assert_eq!(&back[..], &page(c.job.tag)[..], "tag {}", c.job.tag);
        *seen.entry(c.job.tag).or_default() += 1;
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "a job completed twice"
    );
    assert_eq!(seen.len() as u64, n);
    assert!(seen.values().all(|&k| k == 1));
}

#[test]
fn cpu_only_engine_completes_every_job_once() {
    let engine = Engine::new(cfg()).unwrap();
    run_batches(&engine, 0, 500, 7, Codec::LZ4);
    run_batches(&engine, 1000, 200, 1, Codec::Zstd { level: 1 });
    let s = engine.stats();
    assert_eq!(s.jobs_cpu, 700);
    assert_eq!(s.jobs_offloaded, 0);
    assert_eq!(s.per_codec[CodecId::Lz4 as usize].objects, 500);
    assert_eq!(s.per_codec[CodecId::Zstd as usize].objects, 200);
    assert!(s.per_codec[CodecId::Lz4 as usize].out_bytes < 500 * 4096);
}

/// The CPU workers start with the first batch, not with the engine (a process that never
/// compresses a batch never pays for them), and then complete every job; an engine shut down
/// before any batch completes later ones with an error, never silently.
#[test]
fn cpu_workers_start_with_the_first_batch() {
    let engine = Engine::new(cfg()).unwrap();
    let workers = |e: &Engine| e.shared.cpu.started_workers();
    assert_eq!(workers(&engine), 0);
    let _ = engine.compress_now(Codec::LZ4, None, &page(1)).unwrap();
    assert_eq!(workers(&engine), 0, "compress_now runs on the caller");
    run_batches(&engine, 0, 50, 5, Codec::LZ4);
    assert_eq!(workers(&engine), cfg().cpu_workers);

    let unused = Engine::new(cfg()).unwrap();
    unused.shared.cpu.shutdown();
    let (tx, rx) = mpsc::channel::<Completion>();
    let tx = Mutex::new(tx);
    let sink: Sink = Arc::new(move |c| tx.lock().send(c).unwrap());
    let job = Job {
        tag: 9,
        input: page(9),
        codec: Codec::LZ4,
        dict: None,
    };
    match unused.submit(vec![job], sink) {
        Err(EngineError::Shutdown) => {}
        other => panic!("a shut-down engine took a batch: {:?}", other.map(|_| ())),
    }
    assert!(rx.try_recv().is_err());
    assert_eq!(workers(&unused), 0);
}

/// When the system refuses the workers' threads at the first batch, the batch is compressed on
/// the submitting thread (every job completes once, decodable), and a later batch tries to
/// start the workers again.
#[test]
fn a_batch_without_workers_is_compressed_by_its_submitter() {
    let engine = Engine::new(cfg()).unwrap();
    engine.shared.cpu.refuse_threads(true);
    run_batches(&engine, 0, 20, 4, Codec::LZ4);
    engine.shared.cpu.refuse_threads(false);
    assert_eq!(engine.shared.cpu.started_workers(), 0);
    run_batches(&engine, 100, 20, 4, Codec::LZ4);
    assert_eq!(engine.shared.cpu.started_workers(), cfg().cpu_workers);
    assert_eq!(engine.stats().jobs_cpu, 40);
}

#[test]
fn small_batches_stay_on_the_cpu() {
    let backend = Arc::new(FaultyBackend::default());
    let engine = Engine::with_accelerator(cfg(), backend.clone()).unwrap();
    run_batches(&engine, 0, 40, 4, Codec::Deflate { level: 1 });
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 0);
    run_batches(&engine, 100, 32, 16, Codec::Deflate { level: 1 });
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 32);
    assert_eq!(engine.stats().jobs_offloaded, 32);
}

#[test]
fn failing_jobs_fall_back_without_loss_and_the_backend_recovers() {
    let backend = Arc::new(FaultyBackend::default());
    // A rest long enough that the out-of-service phase below cannot outlast it.
    let rest = Duration::from_secs(2);
    let engine = Engine::with_accelerator(
        EngineConfig {
            retry_after: rest,
            ..cfg()
        },
        backend.clone(),
    )
    .unwrap();
    run_batches(&engine, 0, 64, 16, Codec::Deflate { level: 1 });
    assert!(engine.stats().backend_healthy);

    backend.fail_jobs.store(true, Ordering::SeqCst);
    run_batches(&engine, 1000, 64, 16, Codec::Deflate { level: 1 });
    let s = engine.stats();
    assert!(s.fallbacks >= 16, "{s:?}");
    assert!(!s.backend_healthy);
    assert_eq!(s.backend_failures, 1);

    // While out of service (before retry_after), batches go straight to the CPU.
    let before = backend.accepted.load(Ordering::SeqCst);
    run_batches(&engine, 2000, 32, 16, Codec::Deflate { level: 1 });
    assert_eq!(backend.accepted.load(Ordering::SeqCst), before);

    // Repaired: after retry_after a probe goes through and the backend is back.
    backend.fail_jobs.store(false, Ordering::SeqCst);
    std::thread::sleep(rest + Duration::from_millis(50));
    run_batches(&engine, 3000, 64, 16, Codec::Deflate { level: 1 });
    let s = engine.stats();
    assert!(s.backend_healthy, "{s:?}");
    assert_eq!(s.backend_recoveries, 1);
    assert!(backend.accepted.load(Ordering::SeqCst) > before);
}

#[test]
fn corrupt_accelerator_output_is_caught_and_redone() {
    let backend = Arc::new(FaultyBackend::default());
    backend.corrupt.store(true, Ordering::SeqCst);
    let engine = Engine::with_accelerator(cfg(), backend.clone()).unwrap();
    run_batches(&engine, 0, 48, 16, Codec::Deflate { level: 1 });
    let s = engine.stats();
    assert!(s.bad_outputs >= 1, "{s:?}");
    assert_eq!(s.bad_outputs, s.fallbacks);
}

#[test]
fn refused_and_saturated_submits_run_on_the_cpu() {
    let backend = Arc::new(FaultyBackend::default());
    let engine = Engine::with_accelerator(cfg(), backend.clone()).unwrap();
    backend.saturated.store(true, Ordering::SeqCst);
    run_batches(&engine, 0, 64, 16, Codec::Deflate { level: 1 });
    assert_eq!(engine.stats().saturated, 4);
    assert!(
        engine.stats().backend_healthy,
        "saturation is not a failure"
    );
    backend.saturated.store(false, Ordering::SeqCst);
    backend.refuse_submit.store(true, Ordering::SeqCst);
    run_batches(&engine, 100, 64, 16, Codec::Deflate { level: 1 });
    let s = engine.stats();
    assert_eq!(
        s.fallbacks, 32,
        "two refused batches before it was taken out: {s:?}"
    );
    assert!(!s.backend_healthy);
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 0);
}

#[test]
fn jobs_a_backend_cannot_do_run_on_the_cpu_and_count_nothing_against_it() {
    let backend = Arc::new(FaultyBackend::default());
    let engine = Engine::with_accelerator(cfg(), backend.clone()).unwrap();
    backend.unsupported.store(true, Ordering::SeqCst);
    run_batches(&engine, 0, 64, 16, Codec::Zstd { level: 1 });
    let s = engine.stats();
    assert_eq!(
        (s.fallbacks, s.saturated, s.jobs_offloaded),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.jobs_cpu, 64);
    assert!(s.backend_healthy);
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 0);
}

#[test]
fn random_fault_schedule_never_loses_or_corrupts() {
    let backend = Arc::new(FaultyBackend::default());
    let engine = Engine::with_accelerator(cfg(), backend.clone()).unwrap();
    let mut x = 42u64;
    for round in 0..30u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        backend.fail_jobs.store(x & 1 != 0, Ordering::SeqCst);
        backend.corrupt.store(x & 2 != 0, Ordering::SeqCst);
        backend.saturated.store(x & 4 != 0, Ordering::SeqCst);
        backend.refuse_submit.store(x & 8 != 0, Ordering::SeqCst);
        run_batches(&engine, round * 1000, 40, 10, Codec::Deflate { level: 1 });
    }
}

#[test]
fn configuration_and_names_are_checked() {
    assert!(matches!(
        Engine::new(EngineConfig {
            cpu_workers: 0,
            ..cfg()
        }),
        Err(EngineError::Config(_))
    ));
    assert!(matches!(
        Engine::new(EngineConfig {
            reject_ratio: 1.5,
            ..cfg()
        }),
        Err(EngineError::Config(_))
    ));
    for p in Policy::ALL {
        assert_eq!(p.name().parse::<Policy>().unwrap(), p);
    }
    assert_eq!("turbo".parse::<Policy>(), Err(PolicyError("turbo".into())));
    assert_eq!(Policy::Fast.write_codec(), Codec::LZ4);
    assert_eq!(Policy::Balanced.write_codec(), Codec::Zstd { level: 1 });
    assert!(Policy::Auto.cold_codec().is_some());
    // Blocks of idle pages take a denser level than the single pages of the cold pass.
    assert_eq!(
        Policy::Auto.cold_block_codec(),
        Some(Codec::Zstd { level: 3 })
    );
    assert_eq!(Policy::Fast.cold_block_codec(), None);
    // A bad input completes with a typed error, not a panic.
    let engine = Engine::new(cfg()).unwrap();
    assert!(matches!(
        engine.compress_now(Codec::LZ4, None, &[]),
        Err(EngineError::Codec(CodecError::EmptyInput))
    ));
}
