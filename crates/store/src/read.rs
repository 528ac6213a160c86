//! Reading pages, and decoding stored objects. A batch read keeps one block member locked
//! while it copies the others, so a block is decoded once for all of its pages in the range;
//! pending pages are copied from their uncompressed data. Reads clear the IDLE mark.

use std::sync::atomic::Ordering;
use std::time::Instant;

use zmem_codec::{CodecError, PAGE_SIZE};
use zmem_pool::{Handle, PoolError};

use crate::entropy::ENTROPY_CODEC;
use crate::pending::Pending;
use crate::slot::{State, BLOCK, IDLE, LOWER, OBJECT, PENDING, SAME};
use crate::{Inner, StoreCore, StoreError, SCRATCH};

impl StoreCore {
    /// Reads one page into `buf` (4096 bytes). A page never written reads as zeros.
    pub fn read(&self, index: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if buf.len() != PAGE_SIZE {
            return Err(StoreError::BadLength {
                len: buf.len(),
                what: "one page (4096 bytes)",
            });
        }
        self.read_batch(index, buf)
    }

    /// Reads consecutive pages; a block is decoded once for all of its pages in the range,
    /// wherever they are in it.
    pub fn read_batch(&self, start: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = Self::pages_of(buf.len(), "a whole number of pages")?;
        self.check_range(start, n)?;
        let inner = &self.inner;
        inner.counters.reads.fetch_add(n, Ordering::Relaxed);
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            // The block decoded in `scratch` and the member whose lock we keep: while one member
            // is locked the block cannot be freed, so every other page that points at the same
            // handle is a member of this very block and is copied without decoding again.
            // (Locks are taken in ascending index order, as everywhere in the store.)
            let mut held: Option<(usize, State, u64)> = None;
            let mut result = Ok(());
            let cold_id = inner.cold.as_ref().map(|c| c.codec.id() as u8);
            // Pages the entropy coder shrank (under a policy whose own codec is another).
            let entropy = inner.later.as_ref().map(|l| (l, ENTROPY_CODEC.id() as u8));
            for i in 0..n as usize {
                let index = start + i as u64;
                let slot = &inner.slots[index as usize];
                let (st, aux) = slot.lock();
                if matches!(st.kind(), OBJECT | BLOCK) && Some(st.codec()) == cold_id {
                    inner.counters.cold_reads.fetch_add(1, Ordering::Relaxed);
                }
                if let Some((later, id)) = entropy {
                    if st.kind() == OBJECT && st.codec() == id {
                        later.came_back();
                    }
                }
                let out = &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                let mut keep = false;
                let res = match st.kind() {
                    SAME => {
                        zmem_codec::fill_same(out, aux);
                        Ok(())
                    }
                    OBJECT => inner.decode_object(index, aux, out).map(|_| ()),
                    LOWER => inner.read_lower(index, st, aux, out),
                    PENDING => {
                        // SAFETY: a PENDING slot owns one strong count of the Arc<Pending>
                        // whose pointer is in aux, and we hold the slot's lock.
                        let p = unsafe { &*(aux as *const Pending) };
                        out.copy_from_slice(&p.input[st.pos() * PAGE_SIZE..][..PAGE_SIZE]);
                        Ok(())
                    }
                    BLOCK => {
                        let decoded = matches!(held, Some((_, _, h)) if h == aux);
                        let r = if decoded {
                            Ok(())
                        } else {
                            inner.decode_block(index, st, aux, &mut scratch)
                        };
                        r.map(|()| {
                            out.copy_from_slice(&scratch[st.pos() * PAGE_SIZE..][..PAGE_SIZE]);
                            keep = !decoded;
                        })
                    }
                    _ => {
                        out.fill(0);
                        Ok(())
                    }
                };
                if keep {
                    if let Some((j, sj, _)) = held.replace((index as usize, st, aux)) {
                        inner.slots[j].unlock_keep(sj, IDLE);
                    }
                } else {
                    slot.unlock_keep(st, IDLE);
                }
                if res.is_err() {
                    result = res;
                    break;
                }
            }
            if let Some((j, sj, _)) = held {
                inner.slots[j].unlock_keep(sj, IDLE);
            }
            result
        })
    }
}

impl Inner {
    pub(crate) fn decode_object(
        &self,
        index: u64,
        handle: u64,
        out: &mut [u8],
    ) -> Result<usize, StoreError> {
        let h = Handle::from_raw(handle).ok_or(StoreError::Pool(PoolError::InvalidHandle(0)))?;
        let t = Instant::now();
        self.counters.decodes.fetch_add(1, Ordering::Relaxed);
        let r = self
            .pool
            .with_object(h, |obj| zmem_codec::decode(obj, self.dict_of(obj), out))?
            .map_err(|source| StoreError::Corrupt { index, source });
        self.counters
            .decompress_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// Decodes the block of member `index` (state `st`, locked by the caller) into `scratch`.
    pub(crate) fn decode_block(
        &self,
        index: u64,
        st: State,
        handle: u64,
        scratch: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        let need = st.pages() * PAGE_SIZE;
        if st.pos() >= st.pages() {
            return Err(StoreError::Corrupt {
                index,
                source: CodecError::LengthMismatch {
                    expected: (st.pos() + 1) * PAGE_SIZE,
                    got: need,
                },
            });
        }
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let got = self.decode_object(index, handle, &mut scratch[..need])?;
        if got != need {
            return Err(StoreError::Corrupt {
                index,
                source: CodecError::LengthMismatch {
                    expected: need,
                    got,
                },
            });
        }
        Ok(())
    }
}
