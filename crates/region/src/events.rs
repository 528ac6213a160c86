//! The program's own changes to region memory, read as userfaultfd events: madvise
//! (DONTNEED/REMOVE: the pages read as zeros again), munmap (they leave the region) and mremap
//! (not supported: what was evicted cannot follow the move, so it raises SIGBUS).
//!
//! The kernel lets the program's madvise/munmap/mremap go on as soon as a handler has *read*
//! the event, not when it has applied it. So the handler applies these events under the space
//! lock it held across the read (`read_and_apply`): until they are applied no fault, eviction
//! or settle can touch the pages. Applied later, an event would forget whatever the program
//! had written into the range since (mimalloc purges a range and hands it out again at once):
//! a page written again and evicted meanwhile lost its new content (jq aborted and perl wrote
//! wrong output under `zmem run` on a busy machine; test
//! `a_page_reused_right_after_madvise_keeps_its_new_content`). Events read during a fork are
//! the exception: `fork_mode` defers them, since applying one may allocate while glibc's fork
//! holds the malloc locks (see there); they are applied right after the child's snapshot, and
//! no fault is served until then (`Shared::range_events_deferred`).

use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Arc;
use std::time::Duration;

use crate::config::PAGE;
use crate::manager::{Shared, Space, SpaceInner};
use crate::state::PageState::*;
use crate::uffd::{self, Msg};

/// Whether a message is one of the events this module applies.
pub(crate) fn is_range_event(m: &Msg) -> bool {
    matches!(
        m.event,
        uffd::EVENT_REMOVE | uffd::EVENT_UNMAP | uffd::EVENT_REMAP
    )
}

impl Shared {
    /// Reads a batch of messages from space `s`'s descriptor into `msgs` and applies its range
    /// events before the space lock is released (see the module's comment); the caller
    /// dispatches the rest (`is_range_event` tells which were applied). How many were read (0
    /// also while a child's eviction batch is in flight: nothing is read then).
    pub(crate) fn read_and_apply(
        &self,
        s: &Space,
        msgs: &mut [Msg],
    ) -> Result<usize, zmem_os::Errno> {
        let mut inner = s.inner.lock();
        if s.moving.load(std::sync::atomic::Ordering::Acquire) {
            // A child's batch is in flight: its events wait for it (see `Space::moving`).
            return Ok(0);
        }
        let n = s.uffd.read_msgs(msgs)?;
        let delay = self.event_delay_us.load(Relaxed);
        if delay > 0 && msgs[..n].iter().any(is_range_event) {
            std::thread::sleep(Duration::from_micros(delay));
        }
        for m in msgs[..n].iter().filter(|m| is_range_event(m)) {
            self.apply_range_event(s, &mut inner, m);
        }
        Ok(n)
    }

    /// Applies, in the order they were read, the range events `fork_mode` deferred into
    /// `deferred` (the faults stay there), and lets faults be served again.
    pub(crate) fn apply_deferred_range_events(&self, deferred: &mut Vec<(Arc<Space>, Msg)>) {
        let mut applied = 0;
        // `retain` visits in order: each event is applied as it is taken out.
        deferred.retain(|(s, m)| {
            if !is_range_event(m) {
                return true;
            }
            let delay = self.event_delay_us.load(Relaxed);
            if applied == 0 && delay > 0 {
                std::thread::sleep(Duration::from_micros(delay));
            }
            self.apply_range_event(s, &mut s.inner.lock(), m);
            applied += 1;
            false
        });
        if applied > 0 {
            self.range_events_deferred.fetch_sub(applied, Release);
        }
    }

    /// Applies a REMOVE, UNMAP or REMAP event (anything else is ignored).
    pub(crate) fn apply_range_event(&self, s: &Space, inner: &mut SpaceInner, m: &Msg) {
        match m.event {
            uffd::EVENT_REMOVE | uffd::EVENT_UNMAP => self.remove_locked(
                s,
                inner,
                m.arg0 as usize,
                m.arg1 as usize,
                m.event == uffd::EVENT_UNMAP,
            ),
            uffd::EVENT_REMAP => {
                self.remap_locked(s, inner, m.arg0 as usize, m.arg1 as usize, m.arg2 as usize)
            }
            _ => {}
        }
    }

    pub(crate) fn on_remove(&self, s: &Space, start: usize, end: usize, unmap: bool) {
        let mut inner = s.inner.lock();
        self.remove_locked(s, &mut inner, start, end, unmap);
    }

    fn remove_locked(
        &self,
        s: &Space,
        inner: &mut SpaceInner,
        start: usize,
        end: usize,
        unmap: bool,
    ) {
        let lo = start.max(s.base);
        let hi = end.min(s.base + s.pages * PAGE);
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
                // The program races its own access to it (the zap follows), or a fault maps it
                // beside another page: left out there (`Runs`).
                inner.runs.dropped(i);
                continue;
            }
            inner.forget(&**s.store, i, if unmap { Unmapped } else { Absent });
        }
    }

    fn remap_locked(&self, s: &Space, inner: &mut SpaceInner, from: usize, to: usize, len: usize) {
        // mremap of region memory is not supported: pages that were evicted cannot follow the
        // move. Drop what the old range held; anything the kernel cannot find at the new place
        // raises SIGBUS (fault outside the range, or Poisoned inside it).
        self.remove_locked(s, inner, from, from + len, true);
        let lo = to.max(s.base);
        let hi = (to + len).min(s.base + s.pages * PAGE);
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
