//! The on-disk format of a segment: a header of reverse pointers, then the objects.
//!
//! ```text
//! offset        size  field
//! 0             4     magic "ZMLG"
//! 4             2     format version (1)
//! 6             2     flags: bit 0 = objects and entries are encrypted (AES-256-GCM)
//! 8             4     segment number
//! 12            4     entry count n
//! 16            8     generation (the log's write counter when the segment was written)
//! 24            8     reserved (0)
//! 32            24*n  entries, one per object, in offset order:
//!                       +0  u32 owner id
//!                       +4  u32 offset of the object in the segment
//!                       +8  u64 page index
//!                       +16 u32 payload length
//!                       +20 u32 sealed length (payload + tag or checksum)
//! 32+24n        16    header seal: AES-GCM tag of the (encrypted) entries with bytes 0..32 as
//!                     associated data, nonce (generation, HEADER_ENTRY); unencrypted: crc32
//!                     of bytes 0..32+24n, then 12 zero bytes
//! header_len(n) = round_up(48 + 24n, 16)
//! ...           objects, each at a 16-byte aligned offset from header_len(n) on:
//!                     payload (ciphertext when encrypted), then the 16-byte tag or the
//!                     4-byte crc32 (see seal.rs for what each binds)
//! ...           nothing: a segment is written up to its last object (rounded up to the
//!               device's alignment); the rest is never written
//! ```
//! All integers little-endian. The header is only read by the collector (to learn whose
//! objects it moves); reads of an object fetch just the sectors that hold it.

/// "ZMLG" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"ZMLG");
pub const VERSION: u16 = 1;
pub const FLAG_ENCRYPTED: u16 = 1;

/// Bytes of the fixed part of the header.
pub const FIXED: usize = 32;
/// Bytes of one entry.
pub const ENTRY: usize = 24;
/// Bytes of the header's seal (tag or crc32 + padding).
pub const HEADER_SEAL: usize = 16;
/// Objects start at multiples of this.
pub const OBJECT_ALIGN: usize = 16;
/// The entry number that stands for the header in nonces (no object has it: a segment holds
/// fewer than 2^32 - 1 objects, far fewer than its bytes / OBJECT_ALIGN).
pub const HEADER_ENTRY: u32 = u32::MAX;

/// Smallest and largest segment sizes (a power of two between them).
pub const MIN_SEGMENT: usize = 64 << 10;
pub const MAX_SEGMENT: usize = 64 << 20;

// The layout above, checked at compile time: the fields of the fixed part and of an entry fill
// them exactly, and a header with any entry count stays 16-byte aligned for the objects.
const _: () = {
    assert!(4 + 2 + 2 + 4 + 4 + 8 + 8 == FIXED);
    assert!(4 + 4 + 8 + 4 + 4 == ENTRY);
    assert!(FIXED % OBJECT_ALIGN == 0 && HEADER_SEAL % OBJECT_ALIGN == 0);
    assert!(header_len(0) == 48 && header_len(1) == 80 && header_len(2) == 96);
    // Offsets and lengths are u32: the largest segment fits.
    assert!(MAX_SEGMENT <= u32::MAX as usize);
};

pub const fn align_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// Bytes of the header of a segment of `n` entries (objects start there).
pub const fn header_len(n: usize) -> usize {
    align_up(FIXED + ENTRY * n + HEADER_SEAL, OBJECT_ALIGN)
}

/// Bytes an object of `sealed` bytes takes in a segment (it and its padding).
pub const fn extent(sealed: usize) -> usize {
    align_up(sealed, OBJECT_ALIGN)
}

/// One entry of the header: a reverse pointer to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub owner: u32,
    pub offset: u32,
    pub index: u64,
    pub len: u32,
    pub sealed: u32,
}

impl Entry {
    pub fn encode(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.owner.to_le_bytes());
        out[4..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..16].copy_from_slice(&self.index.to_le_bytes());
        out[16..20].copy_from_slice(&self.len.to_le_bytes());
        out[20..24].copy_from_slice(&self.sealed.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Entry {
        Entry {
            owner: le32(&b[0..4]),
            offset: le32(&b[4..8]),
            index: le64(&b[8..16]),
            len: le32(&b[16..20]),
            sealed: le32(&b[20..24]),
        }
    }
}

/// The fixed part of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed {
    pub encrypted: bool,
    pub segment: u32,
    pub count: u32,
    pub generation: u64,
}

impl Fixed {
    pub fn encode(&self) -> [u8; FIXED] {
        let mut b = [0u8; FIXED];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.encrypted { FLAG_ENCRYPTED } else { 0 };
        b[6..8].copy_from_slice(&flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.segment.to_le_bytes());
        b[12..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b
    }

    /// Parses and checks the fixed part; `why` for a bad one.
    pub fn decode(b: &[u8]) -> Result<Fixed, &'static str> {
        if b.len() < FIXED {
            return Err("header shorter than its fixed part");
        }
        if le32(&b[0..4]) != MAGIC {
            return Err("bad segment magic");
        }
        if u16::from_le_bytes([b[4], b[5]]) != VERSION {
            return Err("unknown segment format version");
        }
        let flags = u16::from_le_bytes([b[6], b[7]]);
        if flags & !FLAG_ENCRYPTED != 0 || le64(&b[24..32]) != 0 {
            return Err("unknown segment header flags");
        }
        Ok(Fixed {
            encrypted: flags & FLAG_ENCRYPTED != 0,
            segment: le32(&b[8..12]),
            count: le32(&b[12..16]),
            generation: le64(&b[16..24]),
        })
    }
}

pub fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

pub fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Lays objects out in segments: given the sealed lengths in order, how many of them fit in one
/// segment of `segment_size` bytes starting from the first, and their offsets.
pub struct Layout {
    /// Offsets of the objects taken, in order.
    pub offsets: Vec<u32>,
}

/// Takes objects from the front of `sealed` while they fit one segment (at least one if it
/// fits an empty segment; none if the first does not).
pub fn layout(sealed: impl Iterator<Item = usize>, segment_size: usize) -> Layout {
    let mut data = 0usize;
    let mut exts: Vec<usize> = Vec::new();
    for s in sealed {
        let e = extent(s);
        if header_len(exts.len() + 1) + data + e > segment_size {
            break;
        }
        data += e;
        exts.push(e);
    }
    let mut off = header_len(exts.len());
    let mut offsets = Vec::with_capacity(exts.len());
    for e in exts {
        offsets.push(off as u32);
        off += e;
    }
    Layout { offsets }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_fixed_part_round_trip() {
        let e = Entry {
            owner: 7,
            offset: 4096,
            index: u64::MAX - 3,
            len: 1234,
            sealed: 1250,
        };
        let mut b = [0u8; ENTRY];
        e.encode(&mut b);
        assert_eq!(Entry::decode(&b), e);
        let f = Fixed {
            encrypted: true,
            segment: 9,
            count: 3,
            generation: 1 << 40,
        };
        assert_eq!(Fixed::decode(&f.encode()), Ok(f));
        let mut bad = f.encode();
        bad[0] ^= 1;
        assert_eq!(Fixed::decode(&bad), Err("bad segment magic"));
        let mut bad = f.encode();
        bad[4] = 2;
        assert!(Fixed::decode(&bad).is_err());
        assert!(Fixed::decode(&bad[..10]).is_err());
    }

    #[test]
    fn layout_packs_until_the_segment_is_full() {
        // 64 KiB segment, 1000-byte objects (1008 with padding).
        let l = layout(std::iter::repeat_n(1000, 100), 64 << 10);
        let n = l.offsets.len();
        assert_eq!(l.offsets[0] as usize, header_len(n));
        assert!(l.offsets[n - 1] as usize + 1008 <= 64 << 10);
        assert!(
            header_len(n + 1) + (n + 1) * 1008 > 64 << 10,
            "one more would not fit"
        );
        for w in l.offsets.windows(2) {
            assert_eq!(w[1] - w[0], 1008);
            assert_eq!(w[0] % 16, 0);
        }
        // An object larger than a segment: none taken.
        let l = layout([70_000usize].into_iter(), 64 << 10);
        assert!(l.offsets.is_empty());
        // Exactly the largest object.
        let max = (64 << 10) - header_len(1);
        let l = layout([max].into_iter(), 64 << 10);
        assert_eq!(l.offsets, vec![header_len(1) as u32]);
    }
}
