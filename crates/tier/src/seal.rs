//! Sealing objects and headers: AES-256-GCM under a per-log random key, or a crc32 when
//! encryption is off, so that a flipped bit, a truncated file or a stale segment is detected
//! either way.
//!
//! What a seal binds (the associated data, or the checksummed prefix): the owner, the page
//! index, the segment, the segment's generation, the object's offset and its length. So an
//! object read from the wrong place, for the wrong page, from an older write of the same
//! segment, or cut short, fails.
//!
//! Nonces (96 bits) are (generation: 64 bits, entry number: 32 bits). They never repeat under
//! one key: the key is drawn at random for each log and lives only in this process; the
//! generation is the log's counter of segment writes, bumped for every segment written (never
//! reused, never reset while the log lives, and a u64 does not wrap); within one segment write
//! each object has its own entry number, and the header uses [`HEADER_ENTRY`], which no object
//! can have. A failed write that is retried gets a new generation.
//!
//! The key and the cipher's expanded state live in their own page-aligned anonymous mapping,
//! locked in memory (never swapped), excluded from core dumps, and zeroed before it is
//! unmapped. The key is never written anywhere else (the constructor's temporaries on the
//! stack are the one copy we cannot control).

use aes_gcm::aead::generic_array::GenericArray;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;
use zmem_os::{Errno, Mapping, MappingFlags};

use crate::segment::HEADER_ENTRY;
use crate::TierError;

/// Bytes of an AES-GCM tag.
pub const TAG: usize = 16;
/// Bytes of a crc32.
pub const CRC: usize = 4;

/// What an object's seal binds, besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub owner: u32,
    pub segment: u32,
    pub index: u64,
    pub generation: u64,
    pub offset: u32,
    pub len: u32,
}

impl Binding {
    fn bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..4].copy_from_slice(&self.owner.to_le_bytes());
        b[4..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.index.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..28].copy_from_slice(&self.offset.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }
}

fn nonce(generation: u64, entry: u32) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&generation.to_le_bytes());
    n[8..].copy_from_slice(&entry.to_le_bytes());
    n
}

/// The cipher in its locked, undumpable mapping.
struct Secret {
    map: Mapping,
}

// SAFETY: the mapping holds one Aes256Gcm, written once at construction and then only read
// through &self (Aes256Gcm is Send + Sync: plain key schedule data).
unsafe impl Send for Secret {}
// SAFETY: as above.
unsafe impl Sync for Secret {}

impl Secret {
    fn new() -> Result<Secret, TierError> {
        let size = std::mem::size_of::<Aes256Gcm>() + 32;
        let map =
            Mapping::new(size.max(zmem_os::PAGE_SIZE), MappingFlags::default()).map_err(|e| {
                TierError::Io {
                    what: "mapping the key's memory",
                    errno: Errno(e.raw_os_error().unwrap_or(libc::ENOMEM)),
                }
            })?;
        // SAFETY: advice and locking on our own fresh mapping.
        unsafe {
            libc::madvise(map.as_ptr().cast(), map.len(), libc::MADV_DONTDUMP);
            if libc::mlock(map.as_ptr().cast(), map.len()) != 0 {
                // RLIMIT_MEMLOCK too low: the key could be swapped out by the kernel. Not a
                // reason to refuse the log; said once.
                tracing::info!(
                    "the SSD log's key could not be locked in memory: {}",
                    Errno::last().name()
                );
            }
        }
        let align = std::mem::align_of::<Aes256Gcm>();
        assert!(align <= zmem_os::PAGE_SIZE);
        let cipher_at = map.as_ptr().cast::<Aes256Gcm>();
        // The key sits after the cipher, in the same mapping.
        let key_off = std::mem::size_of::<Aes256Gcm>().next_multiple_of(8);
        // SAFETY: key_off + 32 <= size <= map.len().
        let key = unsafe { std::slice::from_raw_parts_mut(map.as_ptr().add(key_off), 32) };
        fill_random(key)?;
        // SAFETY: the mapping is page aligned (so aligned for Aes256Gcm), large enough, and
        // holds no value yet; Drop drops exactly this one.
        unsafe {
            cipher_at.write(Aes256Gcm::new(GenericArray::from_slice(key)));
        }
        wipe(key);
        Ok(Secret { map })
    }

    fn cipher(&self) -> &Aes256Gcm {
        // SAFETY: written in new(), dropped only in drop().
        unsafe { &*self.map.as_ptr().cast::<Aes256Gcm>() }
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // SAFETY: the one value written in new(); then the whole mapping is wiped before
        // Mapping's own drop unmaps it.
        unsafe {
            std::ptr::drop_in_place(self.map.as_ptr().cast::<Aes256Gcm>());
            wipe(std::slice::from_raw_parts_mut(
                self.map.as_ptr(),
                self.map.len(),
            ));
        }
    }
}

/// Zeroes `b` with writes the compiler may not remove.
fn wipe(b: &mut [u8]) {
    for x in b.iter_mut() {
        // SAFETY: a valid &mut u8.
        unsafe { std::ptr::write_volatile(x, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Fills `buf` from getrandom(2).
fn fill_random(buf: &mut [u8]) -> Result<(), TierError> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes into buf[done..], which is valid for its length.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = Errno::last();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(TierError::Io {
                what: "getrandom for the SSD log's key",
                errno: e,
            });
        }
        done += n as usize;
    }
    Ok(())
}

/// Seals and opens objects and headers of one log.
pub struct Sealer {
    secret: Option<Secret>,
}

impl Sealer {
    /// `encrypt`: AES-256-GCM under a fresh random key; otherwise crc32.
    pub fn new(encrypt: bool) -> Result<Sealer, TierError> {
        let secret = if encrypt { Some(Secret::new()?) } else { None };
        Ok(Sealer { secret })
    }

    pub fn encrypted(&self) -> bool {
        self.secret.is_some()
    }

    /// Bytes a seal adds to a payload.
    pub fn overhead(&self) -> usize {
        if self.encrypted() {
            TAG
        } else {
            CRC
        }
    }

    /// Seals the object in `buf` (payload followed by room for the seal, exactly
    /// `len + overhead()` bytes) in place. `entry` is its number in the segment.
    pub fn seal_object(&self, b: &Binding, entry: u32, buf: &mut [u8]) {
        let len = b.len as usize;
        let (payload, trailer) = buf.split_at_mut(len);
        match &self.secret {
            Some(s) => {
                // The payload length is bounded by a segment (64 MiB), far below GCM's limit.
                let tag = s
                    .cipher()
                    .encrypt_in_place_detached(
                        GenericArray::from_slice(&nonce(b.generation, entry)),
                        &b.bytes(),
                        payload,
                    )
                    .expect("a payload within GCM's limits");
                trailer[..TAG].copy_from_slice(&tag);
            }
            None => {
                let crc = crc(&b.bytes(), payload);
                trailer[..CRC].copy_from_slice(&crc.to_le_bytes());
            }
        }
    }

    /// Opens the sealed object in `buf` (`len + overhead()` bytes) in place: on success the
    /// first `len` bytes are the payload. On failure `buf` is unchanged ciphertext (AES-GCM
    /// checks the tag before it decrypts).
    pub fn open_object(&self, b: &Binding, entry: u32, buf: &mut [u8]) -> bool {
        let len = b.len as usize;
        if buf.len() != len + self.overhead() {
            return false;
        }
        let (payload, trailer) = buf.split_at_mut(len);
        match &self.secret {
            Some(s) => s
                .cipher()
                .decrypt_in_place_detached(
                    GenericArray::from_slice(&nonce(b.generation, entry)),
                    &b.bytes(),
                    payload,
                    GenericArray::from_slice(&trailer[..TAG]),
                )
                .is_ok(),
            None => crc(&b.bytes(), payload).to_le_bytes() == trailer[..CRC],
        }
    }

    /// Seals a header in place: `fixed` is its fixed part (associated data), `entries` the
    /// encoded entries (encrypted in place), `seal` the 16 bytes after them.
    pub fn seal_header(&self, generation: u64, fixed: &[u8], entries: &mut [u8], seal: &mut [u8]) {
        match &self.secret {
            Some(s) => {
                let tag = s
                    .cipher()
                    .encrypt_in_place_detached(
                        GenericArray::from_slice(&nonce(generation, HEADER_ENTRY)),
                        fixed,
                        entries,
                    )
                    .expect("a header within GCM's limits");
                seal[..TAG].copy_from_slice(&tag);
            }
            None => {
                seal[..CRC].copy_from_slice(&crc(fixed, entries).to_le_bytes());
                seal[CRC..TAG].fill(0);
            }
        }
    }

    /// Opens a header sealed by [`Sealer::seal_header`]; false if it fails its tag or crc.
    pub fn open_header(
        &self,
        generation: u64,
        fixed: &[u8],
        entries: &mut [u8],
        seal: &[u8],
    ) -> bool {
        match &self.secret {
            Some(s) => s
                .cipher()
                .decrypt_in_place_detached(
                    GenericArray::from_slice(&nonce(generation, HEADER_ENTRY)),
                    fixed,
                    entries,
                    GenericArray::from_slice(&seal[..TAG]),
                )
                .is_ok(),
            None => {
                crc(fixed, entries).to_le_bytes() == seal[..CRC]
                    && seal[CRC..TAG].iter().all(|&x| x == 0)
            }
        }
    }
}

fn crc(prefix: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(prefix);
    h.update(payload);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> Binding {
        Binding {
            owner: 1,
            segment: 2,
            index: 3,
            generation: 4,
            offset: 64,
            len: 100,
        }
    }

    fn round_trip(encrypt: bool) {
        let s = Sealer::new(encrypt).unwrap();
        let b = binding();
        let payload: Vec<u8> = (0..100u8).collect();
        let mut buf = payload.clone();
        buf.resize(100 + s.overhead(), 0);
        s.seal_object(&b, 0, &mut buf);
        if encrypt {
            assert_ne!(
                &buf[..100],
                &payload[..],
                "ciphertext differs from the payload"
            );
        }
        let sealed = buf.clone();
        assert!(s.open_object(&b, 0, &mut buf));
        assert_eq!(&buf[..100], &payload[..]);
        // Any field of the binding, the entry number (encrypted) or a bit of the bytes: fails.
        let others = [
            Binding { owner: 9, ..b },
            Binding { segment: 9, ..b },
            Binding { index: 9, ..b },
            Binding { generation: 9, ..b },
            Binding { offset: 9, ..b },
        ];
        for o in others {
            let mut c = sealed.clone();
            assert!(!s.open_object(&o, 0, &mut c), "{o:?}");
            assert_eq!(c, sealed, "a failed open leaves the bytes alone");
        }
        if encrypt {
            let mut c = sealed.clone();
            assert!(!s.open_object(&b, 1, &mut c));
        }
        for bit in [0usize, 7, 99 * 8 + 3, (100 + s.overhead()) * 8 - 1] {
            let mut c = sealed.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(!s.open_object(&b, 0, &mut c), "bit {bit}");
        }
        // Wrong length.
        let mut c = sealed.clone();
        assert!(!s.open_object(&Binding { len: 99, ..b }, 0, &mut c[..99 + s.overhead()]));
    }

    #[test]
    fn objects_round_trip_and_any_change_fails_encrypted() {
        round_trip(true);
    }

    #[test]
    fn objects_round_trip_and_any_change_fails_plain() {
        round_trip(false);
    }

    #[test]
    fn headers_round_trip_and_fail_when_changed() {
        for encrypt in [true, false] {
            let s = Sealer::new(encrypt).unwrap();
            let fixed = [5u8; 32];
            let plain = [7u8; 48];
            let mut entries = plain;
            let mut seal = [0u8; 16];
            s.seal_header(11, &fixed, &mut entries, &mut seal);
            assert_eq!(entries != plain, encrypt);
            let sealed = entries;
            assert!(s.open_header(11, &fixed, &mut entries, &seal));
            assert_eq!(entries, plain);
            let mut e = sealed;
            assert!(!s.open_header(12, &fixed, &mut e, &seal) || !encrypt);
            let mut e = sealed;
            e[3] ^= 0x10;
            assert!(!s.open_header(11, &fixed, &mut e, &seal));
            let mut f = fixed;
            f[0] = 0;
            let mut e = sealed;
            assert!(!s.open_header(11, &f, &mut e, &seal));
        }
    }

    #[test]
    fn two_logs_have_different_keys() {
        let (a, b) = (Sealer::new(true).unwrap(), Sealer::new(true).unwrap());
        let bind = binding();
        let mut buf = vec![0u8; 100 + TAG];
        a.seal_object(&bind, 0, &mut buf);
        assert!(!b.open_object(&bind, 0, &mut buf));
    }
}
