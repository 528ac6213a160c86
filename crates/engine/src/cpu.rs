//! The CPU backend: QZRAM's page-based parallel write module. A FIFO queue feeds a pool of
//! worker threads that sleep while it is empty; the submitter returns as soon as its jobs are
//! queued.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::{compress_on_cpu, Completion, Counters, EngineError, Job, Sink};

struct Task {
    job: Job,
    sink: Sink,
}

struct Inner {
    tx: Mutex<Option<Sender<Task>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
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
        let (tx, rx) = crossbeam_channel::bounded::<Task>(queue);
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let rx: Receiver<Task> = rx.clone();
            let counters = counters.clone();
            let h = std::thread::Builder::new()
                .name(format!("zmem-cpu-{i}"))
                .spawn(move || {
                    // recv() sleeps while the queue is empty and ends when every sender is gone.
                    while let Ok(Task { job, sink }) = rx.recv() {
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
                })
                .map_err(|e| EngineError::Config(format!("cannot start a CPU worker: {e}")))?;
            handles.push(h);
        }
        Ok(CpuBackend {
            inner: Arc::new(Inner {
                tx: Mutex::new(Some(tx)),
                workers: Mutex::new(handles),
            }),
            counters,
        })
    }

    /// Queues the jobs in order; blocks only while the queue is full.
    pub(crate) fn submit_jobs(&self, jobs: Vec<Job>, sink: Sink) -> Result<(), EngineError> {
        let tx = self.inner.tx.lock().clone().ok_or(EngineError::Shutdown)?;
        self.counters
            .jobs_cpu
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        for job in jobs {
            if let Err(e) = tx.send(Task {
                job,
                sink: sink.clone(),
            }) {
                // Workers are gone: complete the job with an error rather than dropping it.
                let Task { job, sink } = e.into_inner();
                sink(Completion {
                    job,
                    result: Err(EngineError::Shutdown),
                    backend: "cpu",
                });
            }
        }
        Ok(())
    }

    /// Finishes the queued jobs, then stops the workers.
    pub(crate) fn shutdown(&self) {
        drop(self.inner.tx.lock().take());
        let handles = std::mem::take(&mut *self.inner.workers.lock());
        for h in handles {
            let _ = h.join();
        }
    }
}
