//! Trained zstd dictionaries. A dictionary carries a one-byte id that objects compressed with it
//! record in their header, so decoding with the wrong dictionary is an error, not garbage.

use std::sync::{Arc, Mutex};

use crate::CodecError;

/// A zstd dictionary, pre-digested for decompression and, per level, for compression.
pub struct Dictionary {
    id: u8,
    bytes: Vec<u8>,
    ddict: zstd_safe::DDict<'static>,
    // Few levels are ever used with one dictionary; a short list behind a lock is enough and
    // the lock is held only to clone an Arc.
    cdicts: Mutex<Vec<(i32, Arc<zstd_safe::CDict<'static>>)>>,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("id", &self.id)
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl Dictionary {
    /// Wraps dictionary bytes (trained by [`train_dictionary`] or zstd's own trainer).
    pub fn new(id: u8, bytes: Vec<u8>) -> Result<Dictionary, CodecError> {
        if bytes.len() < 8 {
            return Err(CodecError::Dictionary(format!(
                "dictionary of {} bytes is too small",
                bytes.len()
            )));
        }
        let ddict = zstd_safe::DDict::create(&bytes);
        Ok(Dictionary {
            id,
            bytes,
            ddict,
            cdicts: Mutex::new(Vec::new()),
        })
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub(crate) fn ddict(&self) -> &zstd_safe::DDict<'static> {
        &self.ddict
    }

    /// Frees the prepared compression tables (a dictionary no longer written with, whose objects
    /// are still read); made again if it is written with after all.
    pub fn drop_encoders(&self) {
        if let Ok(mut list) = self.cdicts.lock() {
            list.clear();
        }
    }

    pub(crate) fn cdict(&self, level: i32) -> Result<Arc<zstd_safe::CDict<'static>>, CodecError> {
        let mut list = self
            .cdicts
            .lock()
            .map_err(|_| CodecError::Dictionary("dictionary cache poisoned".into()))?;
        if let Some((_, c)) = list.iter().find(|(l, _)| *l == level) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(zstd_safe::CDict::create(&self.bytes, level));
        list.push((level, Arc::clone(&c)));
        Ok(c)
    }
}

/// Trains a zstd dictionary of at most `max_size` bytes from sample buffers (pages or blocks),
/// with zstd's fastCover trainer over 2^`FASTCOVER_F` frequency buckets (zstd's default, 2^20,
/// takes ~6 MB of tables per training and twice the time). Measured on 256 Calgary or Silesia
/// pages, checked on 128 later ones at zstd-1: within 0.3% of the default's dictionary, in 55%
/// of its time (DESIGN-NOTES, "Session 52").
pub fn train_dictionary(samples: &[&[u8]], max_size: usize) -> Result<Vec<u8>, CodecError> {
    use zstd_safe::zstd_sys as sys;
    if samples.len() < 8 {
        return Err(CodecError::Dictionary(format!(
            "need at least 8 samples to train, got {}",
            samples.len()
        )));
    }
    let sizes: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let joined: Vec<u8> = samples.concat();
    let mut dict = vec![0u8; max_size];
    // SAFETY: a plain C struct of integers and a double; all zero means "zstd's default" for
    // every field not set below.
    let mut params: sys::ZDICT_fastCover_params_t = unsafe { std::mem::zeroed() };
    params.d = 8;
    params.f = FASTCOVER_F;
    params.steps = 4;
    params.accel = 1;
    // SAFETY: `dict` is writable for its length, `joined` holds exactly the bytes `sizes`
    // describe (`sizes.len()` samples), and `params` is a valid parameter block zstd may
    // update with the parameters it chose.
    let n = unsafe {
        sys::ZDICT_optimizeTrainFromBuffer_fastCover(
            dict.as_mut_ptr().cast(),
            dict.len(),
            joined.as_ptr().cast(),
            sizes.as_ptr(),
            sizes.len() as u32,
            &mut params,
        )
    };
    // SAFETY: ZDICT_isError and ZDICT_getErrorName only read the code (the name is static).
    if unsafe { sys::ZDICT_isError(n) } != 0 {
        let name = unsafe { std::ffi::CStr::from_ptr(sys::ZDICT_getErrorName(n)) };
        return Err(CodecError::Dictionary(format!(
            "training failed: {}",
            name.to_string_lossy()
        )));
    }
    dict.truncate(n);
    Ok(dict)
}

/// log2 of fastCover's frequency buckets (see [`train_dictionary`]).
const FASTCOVER_F: u32 = 16;
