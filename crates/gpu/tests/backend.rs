//! The GPU backend under the engine, on the simulated device: every job completes exactly
//! once with an object that decodes to its input, whatever the device does. The last test
//! runs on a real GPU only (`ZMEM_GPU_TESTS=1`).

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use zmem_codec::Codec;
use zmem_engine::{Completion, Engine, EngineConfig, EngineStats, Job, Sink};
use zmem_gpu::sim::{SimDevice, SimFaults};
use zmem_gpu::{GpuBackend, GpuConfig};

const PAGE: usize = 4096;

/// Compressible and distinct per seed; every 7th page is noise (stored raw).
fn page(seed: u64) -> Arc<[u8]> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut v = Vec::with_capacity(PAGE);
    if seed % 7 == 3 {
        while v.len() < PAGE {
            v.extend_from_slice(&next().to_le_bytes());
        }
    } else {
        let words = ["page ", "fault ", "pool ", "zram\n", "evict "];
        while v.len() < PAGE {
            v.extend_from_slice(words[(next() % 5) as usize].as_bytes());
            v.extend_from_slice(&seed.to_le_bytes()[..3]);
        }
    }
    v.truncate(PAGE);
    v.into()
}

struct Rig {
    engine: Engine,
    backend: Arc<GpuBackend>,
    faults: Arc<SimFaults>,
}

fn rig(cfg: GpuConfig) -> Rig {
    rig_resting(cfg, Duration::from_millis(20))
}

/// A rig whose engine lets a failed device rest `retry_after` before probing it again.
fn rig_resting(cfg: GpuConfig, retry_after: Duration) -> Rig {
    let (device, faults) = SimDevice::new(&cfg);
    rig_over(
        GpuBackend::with_device(device, cfg).unwrap(),
        faults,
        retry_after,
    )
}

/// The test engine over `backend` (whose devices share `faults`).
fn rig_over(backend: GpuBackend, faults: Arc<SimFaults>, retry_after: Duration) -> Rig {
    let backend = Arc::new(backend);
    let engine = Engine::with_accelerator(
        EngineConfig {
            cpu_workers: 2,
            cpu_queue: 256,
            offload_min_bytes: 8 * PAGE,
            failure_threshold: 2,
            retry_after,
            ..EngineConfig::default()
        },
        backend.clone(),
    )
    .unwrap();
    Rig {
        engine,
        backend,
        faults,
    }
}

/// Small device calls, and a queue deep enough that no batch of a test is handed back.
fn small() -> GpuConfig {
    GpuConfig {
        max_chunks: 16,
        max_chunk_bytes: 16 * 1024,
        queue_batches: 64,
        ..GpuConfig::default()
    }
}

/// Submits `n` pages from `first` in batches of `batch`, waits for every completion and
/// checks each: exactly once, and the object decodes to the page. Returns completions per
/// backend name.
fn run(
    engine: &Engine,
    first: u64,
    n: u64,
    batch: usize,
    codec: Codec,
) -> HashMap<&'static str, u64> {
    let rx = submit(engine, first, n, batch, codec);
    collect(rx, n)
}

/// Submits `n` pages from `first` in batches of `batch`; the completions come to the receiver.
fn submit(
    engine: &Engine,
    first: u64,
    n: u64,
    batch: usize,
    codec: Codec,
) -> mpsc::Receiver<Completion> {
    let (tx, rx) = mpsc::channel::<Completion>();
    let tx = Mutex::new(tx);
    let sink: Sink = Arc::new(move |c| tx.lock().unwrap().send(c).unwrap());
    let tags: Vec<u64> = (first..first + n).collect();
    for chunk in tags.chunks(batch) {
        let jobs = chunk
            .iter()
            .map(|&tag| Job {
                tag,
                input: page(tag),
                codec,
                dict: None,
            })
            .collect();
        engine.submit(jobs, sink.clone()).unwrap();
    }
    rx
}

/// Waits for `n` completions and checks each (see `run`).
fn collect(rx: mpsc::Receiver<Completion>, n: u64) -> HashMap<&'static str, u64> {
    let mut seen = HashMap::new();
    let mut by_backend = HashMap::new();
    for _ in 0..n {
        let c = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a job never completed");
        let (obj, _) = c
            .result
            .as_ref()
            .expect("the engine hands out only good objects");
        let mut back = vec![0u8; PAGE];
        zmem_codec::decode(obj, None, &mut back).unwrap();
        assert_eq!(&back[..], &page(c.job.tag)[..], "page {}", c.job.tag);
        *seen.entry(c.job.tag).or_insert(0) += 1;
        *by_backend.entry(c.backend).or_insert(0) += 1;
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "a job completed twice"
    );
    assert_eq!(seen.len() as u64, n);
    by_backend
}

fn stats(r: &Rig) -> EngineStats {
    r.engine.stats()
}

#[test]
fn pages_compressed_on_the_device_decode_on_the_cpu() {
    let r = rig(small());
    for codec in [Codec::Deflate { level: 1 }, Codec::LZ4] {
        let by = run(&r.engine, 0, 200, 40, codec);
        assert_eq!(by.get("gpu").copied(), Some(200), "{by:?}");
    }
    let s = stats(&r);
    assert_eq!(
        (s.jobs_offloaded, s.fallbacks, s.bad_outputs),
        (400, 0, 0),
        "{s:?}"
    );
    // Noise pages went raw under the rejection rule, the rest compressed.
    assert!(
        s.rejected > 0 && s.per_codec[3].objects > 0 && s.per_codec[1].objects > 0,
        "{s:?}"
    );
    let g = r.backend.stats();
    // Batches of 40 split into device calls of at most 16 pages.
    assert_eq!((g.pages, g.batches), (400, 30), "{g:?}");
    assert_eq!(g.bytes_in, 400 * PAGE as u64);
    assert!(
        g.bytes_out < g.bytes_in && g.to_device >= g.bytes_in,
        "{g:?}"
    );
}

/// Runs one batch of 16 at a time until the engine has put the device back in service.
fn until_recovered(r: &Rig, first: u64, codec: Codec) {
    for round in 0..80 {
        std::thread::sleep(Duration::from_millis(25));
        run(&r.engine, first + round * 16, 16, 16, codec);
        if stats(r).backend_recoveries > 0 {
            return;
        }
    }
    panic!("never back in service: {:?}", stats(r));
}

#[test]
fn a_lost_context_loses_no_page_and_the_device_comes_back_after_a_reset() {
    let r = rig(small());
    r.faults.lose_context.store(1, SeqCst);
    let by = run(&r.engine, 0, 16, 16, Codec::Deflate { level: 1 });
    let s = stats(&r);
    assert_eq!(s.fallbacks, 16, "the batch redone on the CPU: {s:?}");
    assert_eq!(by.get("cpu").copied(), Some(16), "{by:?}");
    assert_eq!(r.faults.resets.load(SeqCst), 1);
    assert_eq!(r.backend.stats().resets, 1);
    assert!(r
        .backend
        .stats()
        .last_error
        .unwrap()
        .contains("CUDA error 999"));
    // Sixteen failed pages in a row: out of service until a probe after the rest succeeds.
    assert!(!s.backend_healthy, "{s:?}");
    until_recovered(&r, 100, Codec::Deflate { level: 1 });
    let by = run(&r.engine, 5000, 64, 16, Codec::Deflate { level: 1 });
    assert_eq!(by.get("gpu").copied(), Some(64), "{by:?}");
    assert_eq!(stats(&r).fallbacks, 16);
}

#[test]
fn a_device_out_of_service_is_probed_again_after_its_rest() {
    // A rest long enough that nothing below probes the device before the test means it to.
    let r = rig_resting(small(), Duration::from_millis(1000));
    // Failing resets keep the context lost: every batch fails until they succeed.
    r.faults.reset_fails.store(true, SeqCst);
    r.faults.lose_context.store(1, SeqCst);
    run(&r.engine, 0, 16, 16, Codec::LZ4);
    let s = stats(&r);
    assert!(!s.backend_healthy && s.backend_failures == 1, "{s:?}");
    assert_eq!(r.backend.stats().reset_failures, 1);
    // Out of service and resting: the CPU takes everything, the device is not asked.
    let before = r.backend.stats().batches;
    let by = run(&r.engine, 100, 32, 16, Codec::LZ4);
    assert_eq!(by.get("cpu").copied(), Some(32), "{by:?}");
    assert_eq!(r.backend.stats().batches, before);
    // After the rest a probe fails (still lost, the reset refused again).
    std::thread::sleep(Duration::from_millis(1050));
    run(&r.engine, 200, 16, 16, Codec::LZ4);
    assert_eq!(r.backend.stats().reset_failures, 2);
    assert!(!stats(&r).backend_healthy);
    // Resets work again: the next probe fails and resets, the one after succeeds.
    r.faults.reset_fails.store(false, SeqCst);
    until_recovered(&r, 1000, Codec::LZ4);
    assert_eq!(r.faults.resets.load(SeqCst), 1);
    let by = run(&r.engine, 5000, 64, 16, Codec::LZ4);
    assert_eq!(by.get("gpu").copied(), Some(64), "{by:?}");
}

#[test]
fn out_of_device_memory_fails_one_batch_without_a_reset() {
    let r = rig(small());
    r.faults.out_of_memory.store(1, SeqCst);
    run(&r.engine, 0, 48, 16, Codec::Deflate { level: 1 });
    assert_eq!(stats(&r).fallbacks, 16);
    assert_eq!(r.faults.resets.load(SeqCst), 0);
    assert_eq!(r.backend.stats().batch_failures, 1);
}

#[test]
fn pages_the_device_refuses_or_garbles_are_redone_on_the_cpu() {
    let r = rig(small());
    r.faults.refuse_every.store(4, SeqCst);
    run(&r.engine, 0, 64, 16, Codec::Deflate { level: 1 });
    assert_eq!(stats(&r).fallbacks, 16, "every 4th page of 64");
    assert_eq!(r.backend.stats().page_failures, 16);
    r.faults.refuse_every.store(0, SeqCst);
    r.faults.corrupt_every.store(5, SeqCst);
    run(&r.engine, 100, 80, 16, Codec::LZ4);
    let s = stats(&r);
    // Every 5th output is garbled (some are noise pages, stored raw, so never decoded).
    assert!(s.bad_outputs >= 8 && s.bad_outputs <= 16, "{s:?}");
    assert_eq!(s.fallbacks, 16 + s.bad_outputs);
}

#[test]
fn a_panic_in_the_devices_code_fails_its_batch_and_nothing_else() {
    let r = rig(small());
    r.faults.panic.store(true, SeqCst);
    run(&r.engine, 0, 48, 16, Codec::LZ4);
    assert_eq!(stats(&r).fallbacks, 16);
    assert!(r.backend.stats().last_error.unwrap().contains("panicked"));
}

#[test]
fn a_device_that_answers_for_fewer_pages_fails_the_whole_batch() {
    let r = rig(small());
    r.faults.drop_one.store(true, SeqCst);
    run(&r.engine, 0, 32, 16, Codec::LZ4);
    assert_eq!(stats(&r).fallbacks, 16);
    assert!(r
        .backend
        .stats()
        .last_error
        .unwrap()
        .contains("answered for 15 of 16"));
}

#[test]
fn a_busy_device_hands_batches_back_to_the_cpu() {
    let r = rig(GpuConfig {
        queue_batches: 1,
        ..small()
    });
    // Held until every batch is submitted: the first waits on the device, the queue is full.
    r.faults.hold.store(true, SeqCst);
    let rx = submit(&r.engine, 0, 64, 16, Codec::LZ4);
    r.faults.hold.store(false, SeqCst);
    let by = collect(rx, 64);
    let s = stats(&r);
    assert_eq!(
        s.saturated, 3,
        "one batch held on the device, three handed back: {s:?}"
    );
    assert_eq!(
        (by.get("gpu").copied(), by.get("cpu").copied()),
        (Some(16), Some(48))
    );
    assert!(s.backend_healthy);
}

#[test]
fn codecs_and_sizes_the_device_cannot_take_stay_on_the_cpu() {
    let r = rig(small());
    run(&r.engine, 0, 32, 16, Codec::Zstd { level: 1 });
    let s = stats(&r);
    assert_eq!(
        (s.jobs_offloaded, s.fallbacks, s.saturated),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(s.backend_healthy);
    assert_eq!(r.backend.stats().batches, 0);
    // A block larger than the device's chunk.
    let (tx, rx) = mpsc::channel::<Completion>();
    let tx = Mutex::new(tx);
    let sink: Sink = Arc::new(move |c| tx.lock().unwrap().send(c).unwrap());
    let big: Arc<[u8]> = (0..64 * 1024)
        .map(|i| (i / 100) as u8)
        .collect::<Vec<_>>()
        .into();
    r.engine
        .submit(
            vec![Job {
                tag: 1,
                input: big.clone(),
                codec: Codec::Deflate { level: 1 },
                dict: None,
            }],
            sink,
        )
        .unwrap();
    let c = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(c.backend, "cpu");
    let mut back = vec![0u8; big.len()];
    zmem_codec::decode(&c.result.unwrap().0, None, &mut back).unwrap();
    assert_eq!(&back[..], &big[..]);
}

/// On a machine with a GPU and nvCOMP (a lent machine): the real device through the engine.
#[test]
fn the_real_device_compresses_pages_that_decode_on_the_cpu() {
    if std::env::var_os("ZMEM_GPU_TESTS").is_none_or(|v| v != "1") {
        eprintln!("skipped: set ZMEM_GPU_TESTS=1 on a machine with an NVIDIA GPU and nvCOMP");
        return;
    }
    let backend = Arc::new(GpuBackend::open(GpuConfig::default()).expect("a GPU was promised"));
    eprintln!("device: {}", backend.describe());
    let engine = Engine::with_accelerator(EngineConfig::default(), backend.clone()).unwrap();
    for codec in [Codec::Deflate { level: 1 }, Codec::LZ4] {
        let by = run(&engine, 0, 4096, 1024, codec);
        assert_eq!(by.get("gpu").copied(), Some(4096), "{codec}: {by:?}");
    }
    let s = engine.stats();
    assert_eq!((s.bad_outputs, s.fallbacks), (0, 0), "{s:?}");
    let g = backend.stats();
    eprintln!("{g:?}");
    assert!(g.bytes_out < g.bytes_in);
}

#[test]
fn a_batch_larger_than_the_staging_area_is_split_across_device_calls() {
    let r = rig(GpuConfig {
        max_chunks: 16,
        max_chunk_bytes: 16 * 1024,
        staging_bytes: 5 * PAGE,
        queue_batches: 64,
        ..GpuConfig::default()
    });
    let by = run(&r.engine, 0, 40, 40, Codec::LZ4);
    assert_eq!(by.get("gpu").copied(), Some(40), "{by:?}");
    // 40 pages, at most 5 a call.
    assert_eq!(r.backend.stats().batches, 8);
}

/// Two streams (two threads, two devices on one simulated GPU): every page once, both used,
/// and a context lost under both is reset and nothing is lost.
#[test]
fn two_streams_share_the_work_and_survive_a_lost_context() {
    let cfg = GpuConfig {
        streams: 2,
        ..small()
    };
    let (first, faults) = SimDevice::new(&cfg);
    let second = SimDevice::sharing(&cfg, faults.clone());
    let r = rig_over(
        GpuBackend::with_devices(vec![first, second], cfg).unwrap(),
        faults,
        Duration::from_millis(20),
    );
    assert!(
        r.backend.describe().contains("2 batches in flight"),
        "{}",
        r.backend.describe()
    );
    let by = run(&r.engine, 0, 640, 32, Codec::Deflate { level: 1 });
    assert_eq!(by.get("gpu").copied(), Some(640), "{by:?}");
    assert_eq!(r.faults.batches.load(SeqCst), 40);
    r.faults.lose_context.store(1, SeqCst);
    run(&r.engine, 1000, 64, 32, Codec::LZ4);
    assert!(r.faults.resets.load(SeqCst) >= 1);
    until_recovered(&r, 2000, Codec::LZ4);
    let by = run(&r.engine, 5000, 256, 32, Codec::LZ4);
    assert_eq!(by.get("gpu").copied(), Some(256), "{by:?}");
}
