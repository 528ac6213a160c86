//! A page's whole state in 16 bytes: a state word and an auxiliary word.
//!
//! ```text
//! word bits 0..3    kind: EMPTY, SAME, OBJECT, BLOCK, PENDING, LOWER (on the SSD log)
//!      bit  3       LOCK (per-page lock, like zram's ZRAM_LOCK)
//!      bit  4       IDLE (set by mark_idle, cleared by any access; drives recompression)
//!      bit  5       HUGE (stored raw: incompressible)
//!      bit  6       LATER (stored raw, the entropy coder's try still to come: `entropy`)
//!      bit  7       TRIED (stored raw, and a block of its run did not shrink: not tried again)
//!      bits 8..16   position of this page in its block / pending buffer
//!      bits 16..24  pages in that block / pending buffer
//!      bits 24..28  codec id of the object
//!      bits 32..64  object length in bytes (for OBJECT and LOWER; the block's length for BLOCK)
//! aux               SAME: the repeated word; OBJECT/BLOCK: pool handle;
//!                   PENDING: pointer to the shared uncompressed buffer; LOWER: log location
//! ```
//! The aux word is written only with LOCK held and published by the unlocking store (Release).

use std::sync::atomic::{AtomicU64, Ordering};

use zmem_os::ZeroedTable;

pub const KIND_MASK: u64 = 0b111;
pub const EMPTY: u64 = 0;
pub const SAME: u64 = 1;
pub const OBJECT: u64 = 2;
pub const BLOCK: u64 = 3;
pub const PENDING: u64 = 4;
/// Written back to the SSD log (`lower`): aux is the object's log location.
pub const LOWER: u64 = 5;

pub const LOCK: u64 = 1 << 3;
pub const IDLE: u64 = 1 << 4;
pub const HUGE: u64 = 1 << 5;
pub const LATER: u64 = 1 << 6;
/// A raw page whose run was tried as a block that did not shrink: the idle pass does not try
/// it again while the page keeps this content (a rewrite makes a new state without it).
pub const TRIED: u64 = 1 << 7;

pub struct Slot {
    word: AtomicU64,
    aux: AtomicU64,
}

// The slot table is allocated zeroed (`Slot::table`), so that the kernel hands it out lazily
// and a huge store costs DRAM only for the pages it holds: an empty slot must be all zero
// bits, with nothing else in the struct (a new field or padding fails to compile).
const _: () = {
    // SAFETY: Slot is two AtomicU64, each with the in-memory representation of a u64.
    let bits: [u64; 2] = unsafe { std::mem::transmute(Slot::empty()) };
    assert!(
        bits[0] == 0 && bits[1] == 0,
        "Slot::empty() must be all zero bits"
    );
};

/// A decoded state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State(pub u64);

impl State {
    pub fn kind(self) -> u64 {
        self.0 & KIND_MASK
    }
    pub fn pos(self) -> usize {
        ((self.0 >> 8) & 0xff) as usize
    }
    pub fn pages(self) -> usize {
        ((self.0 >> 16) & 0xff) as usize
    }
    pub fn codec(self) -> u8 {
        ((self.0 >> 24) & 0xf) as u8
    }
    pub fn len(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub fn has(self, flag: u64) -> bool {
        self.0 & flag != 0
    }
    pub fn new(kind: u64) -> State {
        State(kind)
    }
    pub fn with_block(self, pos: usize, pages: usize) -> State {
        State(self.0 & !0xff_ff00 | ((pos as u64 & 0xff) << 8) | ((pages as u64 & 0xff) << 16))
    }
    pub fn with_object(self, codec: u8, len: usize) -> State {
        State(self.0 & 0xff_ffff | (u64::from(codec & 0xf) << 24) | ((len as u64) << 32))
    }
    pub fn with_flag(self, flag: u64, on: bool) -> State {
        State(if on { self.0 | flag } else { self.0 & !flag })
    }
}

impl Slot {
    pub const fn empty() -> Slot {
        Slot {
            word: AtomicU64::new(EMPTY),
            aux: AtomicU64::new(0),
        }
    }

    /// A table of `n` empty slots, never written (`zmem_os::ZeroedTable`): a store for a huge
    /// region costs DRAM only for the pages it holds.
    pub fn table(n: usize) -> std::io::Result<ZeroedTable<Slot>> {
        // SAFETY: all zero bits is `Slot::empty()` (asserted at compile time above).
        unsafe { ZeroedTable::new(n) }
    }

    /// Takes the page's lock, spinning briefly then yielding; returns the state it held.
    pub fn lock(&self) -> (State, u64) {
        let mut spins = 0u32;
        loop {
            let w = self.word.load(Ordering::Relaxed);
            if w & LOCK == 0
                && self
                    .word
                    .compare_exchange_weak(w, w | LOCK, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return (State(w), self.aux.load(Ordering::Relaxed));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Stores a new state and releases the lock. Caller holds the lock.
    pub fn unlock_with(&self, state: State, aux: u64) {
        self.aux.store(aux, Ordering::Relaxed);
        self.word.store(state.0 & !LOCK, Ordering::Release);
    }

    /// Releases the lock keeping the state (minus `clear` flags). Caller holds the lock.
    pub fn unlock_keep(&self, state: State, clear: u64) {
        self.word
            .store(state.0 & !(LOCK | clear), Ordering::Release);
    }

    /// A racy look at the state, for scans that lock before acting.
    pub fn peek(&self) -> State {
        State(self.word.load(Ordering::Relaxed))
    }

    /// A racy look at the aux word, for heuristics that tolerate a stale value.
    pub fn peek_aux(&self) -> u64 {
        self.aux.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_empty_slots() {
        for n in [0, 1, 7, 100_000] {
            let t = Slot::table(n).unwrap();
            assert_eq!(t.len(), n);
            for s in t.iter() {
                assert_eq!(s.peek(), State::new(EMPTY));
                assert_eq!(s.aux.load(Ordering::Relaxed), 0);
            }
            if let Some(s) = t.last() {
                let (st, _) = s.lock();
                s.unlock_with(State::new(SAME), 0x0101);
                assert_eq!(s.lock(), (State::new(SAME), 0x0101));
                s.unlock_keep(st, 0);
            }
        }
    }
}
