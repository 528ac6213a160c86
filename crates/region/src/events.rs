//! The program's own changes to region memory, read as userfaultfd events: madvise
//! (DONTNEED/REMOVE: the pages read as zeros again), munmap (they leave the region) and mremap
//! (not supported: what was evicted cannot follow the move, so it raises SIGBUS).

use crate::config::PAGE;
use crate::manager::{Shared, Space};
use crate::state::PageState::*;

impl Shared {
    pub(crate) fn on_remove(&self, s: &Space, start: usize, end: usize, unmap: bool) {
        let lo = start.max(s.base);
        let hi = end.min(s.base + s.pages * PAGE);
        let mut inner = s.inner.lock();
        if unmap && start < end {
            inner.unmapped.push((start, end));
        }
        if lo >= hi {
            return;
        }
        let first = (lo - s.base).div_ceil(PAGE).min(s.pages);
        let last = ((hi - s.base) / PAGE).min(s.pages);
        for i in first..last {
            if inner.state.get(i) == Faulting {
                continue; // the program races its own access: the zap follows
            }
            inner.forget(&**s.store, i, if unmap { Unmapped } else { Absent });
        }
    }

    pub(crate) fn on_remap(&self, s: &Space, from: usize, to: usize, len: usize) {
        // mremap of region memory is not supported: pages that were evicted cannot follow the
        // move. Drop what the old range held; anything the kernel cannot find at the new place
        // raises SIGBUS (fault outside the range, or Poisoned inside it).
        self.on_remove(s, from, from + len, true);
        let lo = to.max(s.base);
        let hi = (to + len).min(s.base + s.pages * PAGE);
        let mut inner = s.inner.lock();
        if !inner.remap_warned {
            inner.remap_warned = true;
            tracing::warn!(
                "mremap of zmem region memory ({from:#x} -> {to:#x}, {len} bytes) is not supported: \
                 its evicted pages will raise SIGBUS at the new address"
            );
        }
        if lo < hi {
            for i in (lo - s.base) / PAGE..(hi - s.base).div_ceil(PAGE) {
                inner.forget(&**s.store, i, Poisoned);
            }
        }
    }
}
