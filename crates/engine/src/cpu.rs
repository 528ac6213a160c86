//! The CPU backend: QZRAM's page-based parallel write module. A FIFO queue feeds a pool of
//! worker threads that sleep while it is empty; the submitter returns as soon as its jobs are
//! queued.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use zmem_os::sync::Mutex;

use crate::{compress_on_cpu, Completion, Counters, EngineError, Job, Sink};

/// A slice of a batch: one queue operation and at most one wake-up for several jobs.
struct Task {
    jobs: Vec<Job>,
    sink: Sink,
}

/// The queue and its workers, made by the first batch: a process that never compresses a
/// batch (most short-lived programs under `zmem run`, and forked children that exec at once)
/// never pays for them: ~0.4 MB of queue slots written and two threads started, ~0.3-0.6 ms
/// at each process start and fork.
enum Lane {
    Idle,
    Running {
        tx: Sender<Task>,
        workers: Vec<JoinHandle<()>>,
    },
    Shut,
}

struct Inner {
    lane: Mutex<Lane>,
    nworkers: usize,
    queue: usize,
    reject_ratio: f32,
    /// Tests: the system refuses every worker thread (as under RLIMIT_NPROC).
    #[cfg(test)]
    refuse_threads: std::sync::atomic::AtomicBool,
}

/// Compresses `jobs` in order on this thread, each completed through `sink`.
fn compress_jobs(counters: &Counters, jobs: Vec<Job>, sink: &Sink, reject_ratio: f32) {
    for job in jobs {
        let result = compress_on_cpu(
            counters,
            job.codec,
            job.dict.as_deref(),
            &job.input,
            reject_ratio,
        );
        sink(Completion {
            job,
            result,
            backend: "cpu",
        });
    }
}

/// Handle to the worker pool; clones share it.
#[derive(Clone)]
pub struct CpuBackend {
    inner: Arc<Inner>,
    counters: Arc<Counters>,
}

impl CpuBackend {
    pub(crate) fn start(
        workers: usize,
        queue: usize,
        reject_ratio: f32,
        counters: Arc<Counters>,
    ) -> Result<CpuBackend, EngineError> {
        zmem_os::thread::add_thread_preparer(zmem_codec::prepare_thread);
        Ok(CpuBackend {
            inner: Arc::new(Inner {
                lane: Mutex::new(Lane::Idle),
                nworkers: workers,
                queue,
                reject_ratio,
                #[cfg(test)]
                refuse_threads: std::sync::atomic::AtomicBool::new(false),
            }),
            counters,
        })
    }

    /// The queue's sending end, the queue and its workers made first if this is the first
    /// batch. An error after `shutdown`, or if no worker could start.
    fn sender(&self) -> Result<Sender<Task>, EngineError> {
        let mut lane = self.inner.lane.lock();
        match &*lane {
            Lane::Running { tx, .. } => return Ok(tx.clone()),
            Lane::Shut => return Err(EngineError::Shutdown),
            Lane::Idle => {}
        }
        let (tx, rx) = crossbeam_channel::bounded::<Task>(self.inner.queue);
        let mut workers = Vec::with_capacity(self.inner.nworkers);
        let mut failure = None;
        for i in 0..self.inner.nworkers {
            let rx: Receiver<Task> = rx.clone();
            let counters = self.counters.clone();
            let reject_ratio = self.inner.reject_ratio;
            #[cfg(test)]
            if self.inner.refuse_threads.load(Ordering::Relaxed) {
                failure = Some(std::io::Error::other("refused by the test"));
                continue;
            }
            let spawned = zmem_os::thread::spawn(format!("zmem-cpu-{i}"), move || {
                // recv() sleeps while the queue is empty and ends when every sender is gone.
                while let Ok(Task { jobs, sink }) = rx.recv() {
                    compress_jobs(&counters, jobs, &sink, reject_ratio);
                }
            });
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => failure = Some(e),
            }
        }
        if let (Some(e), true) = (failure, workers.is_empty()) {
            // Still idle: a later batch tries again.
            return Err(EngineError::Config(format!(
                "cannot start a CPU worker: {e}"
            )));
        }
        *lane = Lane::Running {
            tx: tx.clone(),
            workers,
        };
        Ok(tx)
    }

    /// Queues the jobs in order, split into one slice per worker; blocks only while the
    /// queue is full.
    pub(crate) fn submit_jobs(&self, mut jobs: Vec<Job>, sink: Sink) -> Result<(), EngineError> {
        let tx = match self.sender() {
            Ok(tx) => tx,
            Err(EngineError::Shutdown) => return Err(EngineError::Shutdown),
            Err(e) => {
                // No worker could start (the system refused threads): the jobs are compressed
                // here, on the caller's thread, rather than lost.
                tracing::warn!(%e, "compressing a batch on the submitting thread");
                self.counters
                    .jobs_cpu
                    .fetch_add(jobs.len() as u64, Ordering::Relaxed);
                compress_jobs(&self.counters, jobs, &sink, self.inner.reject_ratio);
                return Ok(());
            }
        };
        self.counters
            .jobs_cpu
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        let per = jobs.len().div_ceil(self.inner.nworkers).max(1);
        while !jobs.is_empty() {
            let rest = jobs.split_off(per.min(jobs.len()));
            let slice = std::mem::replace(&mut jobs, rest);
            if let Err(e) = tx.send(Task {
                jobs: slice,
                sink: sink.clone(),
            }) {
                // Workers are gone: complete the jobs with an error rather than dropping them.
                let Task { jobs, sink } = e.into_inner();
                for job in jobs {
                    sink(Completion {
                        job,
                        result: Err(EngineError::Shutdown),
                        backend: "cpu",
                    });
                }
            }
        }
        Ok(())
    }

    /// Tests: whether worker threads are refused from now on.
    #[cfg(test)]
    pub(crate) fn refuse_threads(&self, refuse: bool) {
        self.inner.refuse_threads.store(refuse, Ordering::Relaxed);
    }

    /// Workers running (0 until the first batch).
    #[cfg(test)]
    pub(crate) fn started_workers(&self) -> usize {
        match &*self.inner.lane.lock() {
            Lane::Running { workers, .. } => workers.len(),
            _ => 0,
        }
    }

    /// Finishes the queued jobs, then stops the workers.
    pub(crate) fn shutdown(&self) {
        let lane = std::mem::replace(&mut *self.inner.lane.lock(), Lane::Shut);
        if let Lane::Running { tx, workers } = lane {
            drop(tx);
            for h in workers {
                let _ = h.join();
            }
        }
    }
}
