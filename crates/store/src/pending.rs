//! The shared pieces of the asynchronous write path: the uncompressed data a PENDING page
//! points at until its compression is installed, and the latch that counts compression jobs in
//! flight so that `flush`, `write_batch` and drop can wait for them. A leaf of the crate (it
//! imports nothing from its siblings), so the crate root can hold both in its types.

use std::sync::{Arc, Condvar, Mutex as StdMutex};

/// Written data waiting for compression; shared by its pages' slots and the in-flight job.
pub(crate) struct Pending {
    pub(crate) input: Arc<[u8]>,
}

/// Counts jobs in flight so flush() and drop can wait for them.
#[derive(Default)]
pub(crate) struct Latch {
    n: StdMutex<u64>,
    cv: Condvar,
}

impl Latch {
    pub(crate) fn add(&self, k: u64) {
        *self.n.lock().unwrap_or_else(|e| e.into_inner()) += k;
    }
    pub(crate) fn done(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.cv.notify_all();
        }
    }
    pub(crate) fn wait(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        while *n != 0 {
            n = self.cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}
