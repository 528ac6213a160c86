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

/// Trains a zstd dictionary of at most `max_size` bytes from sample buffers (pages or blocks).
pub fn train_dictionary(samples: &[&[u8]], max_size: usize) -> Result<Vec<u8>, CodecError> {
    if samples.len() < 8 {
        return Err(CodecError::Dictionary(format!(
            "need at least 8 samples to train, got {}",
            samples.len()
        )));
    }
    let sizes: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let joined: Vec<u8> = samples.concat();
    let mut dict = vec![0u8; max_size];
    let n = zstd_safe::train_from_buffer(&mut dict[..], &joined, &sizes).map_err(|code| {
        CodecError::Dictionary(format!(
            "training failed: {}",
            zstd_safe::get_error_name(code)
        ))
    })?;
    dict.truncate(n);
    Ok(dict)
}
