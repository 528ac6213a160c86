//! Handles and the handle-table entries they point at: the one indirection that lets
//! compaction move an object without invalidating its handle, and the generation bits that make
//! a stale, double-freed or forged handle detectable. Pure bit encoding; a leaf of the crate.
//!
//! ```text
//! Handle (u64): [0..32) table index | [32..48) class id | [48..60) generation (1..=4095) | 0000
//! Live entry:   [0..13) slot | [13..39) span id | [39..51) slot size - length | [51..63) gen | 1
//! Free entry:   [0..32) next free index (NIL = u32::MAX) | [51..63) gen | 0
//! ```

use std::num::NonZeroU64;

/// An opaque reference to an object in a [`Pool`](crate::Pool). It stays valid when compaction
/// moves the object, and becomes invalid (detected) when the object is freed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Handle(pub(crate) NonZeroU64);

impl Handle {
    /// The handle as a non-zero integer (for storing in a state word).
    pub fn to_raw(self) -> u64 {
        self.0.get()
    }

    /// Rebuilds a handle from [`Handle::to_raw`]; `None` for 0. Any other value is accepted
    /// here and checked by the pool when used.
    pub fn from_raw(v: u64) -> Option<Handle> {
        NonZeroU64::new(v).map(Handle)
    }
}

const GEN_BITS: u32 = 12;
pub(crate) const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
pub(crate) const H_CLASS_SHIFT: u32 = 32;
pub(crate) const H_GEN_SHIFT: u32 = 48;
pub(crate) const H_RESERVED_SHIFT: u32 = H_GEN_SHIFT + GEN_BITS;

const E_SLOT_BITS: u32 = 13;
const E_SPAN_SHIFT: u32 = E_SLOT_BITS;
pub(crate) const E_SPAN_BITS: u32 = 26;
const E_DELTA_SHIFT: u32 = E_SPAN_SHIFT + E_SPAN_BITS;
const E_DELTA_BITS: u32 = 12;
const E_GEN_SHIFT: u32 = E_DELTA_SHIFT + E_DELTA_BITS;
pub(crate) const E_LIVE: u64 = 1 << 63;

pub(crate) fn next_gen(g: u64) -> u64 {
    if g >= GEN_MASK {
        1
    } else {
        g + 1
    }
}

pub(crate) fn live_entry(gen: u64, delta: u64, span: u32, slot: u32) -> u64 {
    E_LIVE
        | (gen << E_GEN_SHIFT)
        | (delta << E_DELTA_SHIFT)
        | ((span as u64) << E_SPAN_SHIFT)
        | slot as u64
}

pub(crate) fn free_entry(gen: u64, next: u32) -> u64 {
    (gen << E_GEN_SHIFT) | next as u64
}

pub(crate) fn entry_gen(e: u64) -> u64 {
    (e >> E_GEN_SHIFT) & GEN_MASK
}

/// A resolved live object: span id, slot, and slot size minus length.
#[derive(Clone, Copy)]
pub(crate) struct Loc {
    pub(crate) span: u32,
    pub(crate) slot: u32,
    pub(crate) delta: u32,
}

pub(crate) fn entry_loc(e: u64) -> Loc {
    Loc {
        slot: (e & ((1 << E_SLOT_BITS) - 1)) as u32,
        span: ((e >> E_SPAN_SHIFT) & ((1 << E_SPAN_BITS) - 1)) as u32,
        delta: ((e >> E_DELTA_SHIFT) & ((1 << E_DELTA_BITS) - 1)) as u32,
    }
}

pub(crate) fn with_loc(e: u64, span: u32, slot: u32) -> u64 {
    let keep = !((1u64 << E_DELTA_SHIFT) - 1);
    (e & keep) | ((span as u64) << E_SPAN_SHIFT) | slot as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_roundtrip() {
        let e = live_entry(4095, 4095, (1 << E_SPAN_BITS) - 1, (1 << E_SLOT_BITS) - 1);
        assert_eq!(entry_gen(e), 4095);
        let l = entry_loc(e);
        assert_eq!(
            (l.span, l.slot, l.delta),
            ((1 << E_SPAN_BITS) - 1, (1 << E_SLOT_BITS) - 1, 4095)
        );
        let m = with_loc(e, 7, 9);
        let l = entry_loc(m);
        assert_eq!((l.span, l.slot, l.delta, entry_gen(m)), (7, 9, 4095, 4095));
        assert!(m & E_LIVE != 0);
        let f = free_entry(3, 42);
        assert_eq!((entry_gen(f), f as u32, f & E_LIVE), (3, 42, 0));
        assert_eq!(next_gen(GEN_MASK), 1);
    }
}
