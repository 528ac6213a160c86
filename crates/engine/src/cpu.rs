//! The CPU backend: QZRAM's page-based parallel write module. A FIFO queue feeds a pool of
//! worker threads that sleep while it is empty; the submitter returns as soon as its jobs are
//! queued.

use std::sync::atomic::Ordering;
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
    workers: Mutex<Vec<JoinHandle<()>>>,
    nworkers: usize,
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
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let rx: Receiver<Task> = rx.clone();
            let counters = counters.clone();
            let h = zmem_os::thread::spawn(format!("zmem-cpu-{i}"), move || {
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
            })
            .map_err(|e| EngineError::Config(format!("cannot start a CPU worker: {e}")))?;
            handles.push(h);
        }
        Ok(CpuBackend {
            inner: Arc::new(Inner {
                tx: Mutex::new(Some(tx)),
                workers: Mutex::new(handles),
                nworkers: workers,
            }),
            counters,
        })
    }

    /// Queues the jobs in order, split into one slice per worker; blocks only while the
    /// queue is full.
    pub(crate) fn submit_jobs(&self, mut jobs: Vec<Job>, sink: Sink) -> Result<(), EngineError> {
        let tx = self.inner.tx.lock().clone().ok_or(EngineError::Shutdown)?;
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

    /// Finishes the queued jobs, then stops the workers.
    pub(crate) fn shutdown(&self) {
        drop(self.inner.tx.lock().take());
        let handles = std::mem::take(&mut *self.inner.workers.lock());
        for h in handles {
            let _ = h.join();
        }
    }
}
