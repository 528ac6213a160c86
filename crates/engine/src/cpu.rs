//! The CPU backend: QZRAM's page-based parallel write module. A FIFO queue feeds a pool of
//! worker threads that sleep while it is empty; the submitter returns as soon as its jobs are
//! queued.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::{compress_on_cpu, Completion, Counters, EngineError, Job, Sink};

/// A slice of a batch: one queue operation and at most one wake-up for several jobs.
struct Task {
    jobs: Vec<Job>,
    sink: Sink,
}

struct Inner {
    tx: Mutex<Option<Sender<Task>>>,
    /// The workers' end of the queue, kept until the first batch starts them: a process that
    /// never compresses a batch (most short-lived programs under `zmem run`) never pays for
    /// their threads, ~0.1-0.4 ms at its start and at each fork.
    rx: Mutex<Option<Receiver<Task>>>,
    started: AtomicBool,
    workers: Mutex<Vec<JoinHandle<()>>>,
    nworkers: usize,
    reject_ratio: f32,
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
        let (tx, rx) = crossbeam_channel::bounded::<Task>(queue);
        Ok(CpuBackend {
            inner: Arc::new(Inner {
                tx: Mutex::new(Some(tx)),
                rx: Mutex::new(Some(rx)),
                started: AtomicBool::new(false),
                workers: Mutex::new(Vec::with_capacity(workers)),
                nworkers: workers,
                reject_ratio,
            }),
            counters,
        })
    }

    /// Starts the workers if they are not running yet. An error only if none could start.
    fn ensure_workers(&self) -> Result<(), EngineError> {
        if self.inner.started.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut handles = self.inner.workers.lock();
        let Some(rx) = self.inner.rx.lock().take() else {
            // Started meanwhile, or shut down (the send then fails and says so).
            return Ok(());
        };
        let mut failure = None;
        for i in 0..self.inner.nworkers {
            let rx: Receiver<Task> = rx.clone();
            let counters = self.counters.clone();
            let reject_ratio = self.inner.reject_ratio;
            let spawned = zmem_os::thread::spawn(format!("zmem-cpu-{i}"), move || {
                // recv() sleeps while the queue is empty and ends when every sender is gone.
                while let Ok(Task { jobs, sink }) = rx.recv() {
                    for job in jobs {
                        let result = compress_on_cpu(
                            &counters,
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
            });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => failure = Some(e),
            }
        }
        self.inner.started.store(true, Ordering::Release);
        match failure {
            Some(e) if handles.is_empty() => Err(EngineError::Config(format!(
                "cannot start a CPU worker: {e}"
            ))),
            _ => Ok(()),
        }
    }

    /// Queues the jobs in order, split into one slice per worker; blocks only while the
    /// queue is full.
    pub(crate) fn submit_jobs(&self, mut jobs: Vec<Job>, sink: Sink) -> Result<(), EngineError> {
        let tx = self.inner.tx.lock().clone().ok_or(EngineError::Shutdown)?;
        self.ensure_workers()?;
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

    /// Workers running (0 until the first batch).
    #[cfg(test)]
    pub(crate) fn started_workers(&self) -> usize {
        self.inner.workers.lock().len()
    }

    /// Finishes the queued jobs, then stops the workers.
    pub(crate) fn shutdown(&self) {
        drop(self.inner.tx.lock().take());
        drop(self.inner.rx.lock().take());
        let handles = std::mem::take(&mut *self.inner.workers.lock());
        for h in handles {
            let _ = h.join();
        }
    }
}
