//! What the log's tests share: an owner that keeps a model of its pages (page index ->
//! location and bytes) and records the collector's relocations, and logs over MemIo.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use rand::{Rng, SeedableRng};
use zmem_os::sync::Mutex;
use zmem_tier::{Location, Log, LogConfig, MemIo, Owner, OwnerId, SegmentIo};

pub const SEG: usize = 64 << 10;

/// A page of the model: where the log has it and what it holds.
#[derive(Clone, Debug)]
pub struct Page {
    pub loc: Location,
    pub bytes: Vec<u8>,
}

/// An owner whose pages are a HashMap under one lock (the "page lock" of every page).
#[derive(Default)]
pub struct Model {
    pub pages: Mutex<HashMap<u64, Page>>,
    pub relocations: Mutex<Vec<(u64, Location, Location, bool)>>,
}

impl Owner for Model {
    fn relocate(&self, index: u64, old: Location, new: Location) -> bool {
        let mut pages = self.pages.lock();
        let ok = match pages.get_mut(&index) {
            Some(p) if p.loc == old => {
                p.loc = new;
                true
            }
            _ => false,
        };
        self.relocations.lock().push((index, old, new, ok));
        ok
    }
}

/// A registered model owner.
pub struct Client {
    pub log: Arc<Log>,
    pub model: Arc<Model>,
    pub id: OwnerId,
}

impl Client {
    pub fn new(log: &Arc<Log>) -> Client {
        let model = Arc::new(Model::default());
        let weak: Weak<dyn Owner> = Arc::downgrade(&(model.clone() as Arc<dyn Owner>));
        let id = log.register(weak);
        Client {
            log: log.clone(),
            model,
            id,
        }
    }

    /// Writes pages (overwriting: the old copies are freed once the new ones are in).
    pub fn write(&self, pages: &[(u64, Vec<u8>)]) -> Result<(), zmem_tier::TierError> {
        let objs: Vec<(u64, &[u8])> = pages.iter().map(|(i, b)| (*i, &b[..])).collect();
        let locs = self.log.write(self.id, &objs)?;
        let mut m = self.model.pages.lock();
        for ((i, b), loc) in pages.iter().zip(locs) {
            if let Some(old) = m.insert(
                *i,
                Page {
                    loc,
                    bytes: b.clone(),
                },
            ) {
                self.log.free(old.loc);
            }
        }
        Ok(())
    }

    /// Drops a page (frees its object).
    pub fn discard(&self, index: u64) -> bool {
        let mut m = self.model.pages.lock();
        match m.remove(&index) {
            Some(p) => {
                self.log.free(p.loc);
                true
            }
            None => false,
        }
    }

    /// Reads a page back under the model's lock (as a store reads under the page lock).
    pub fn read(&self, index: u64) -> Result<Vec<u8>, zmem_tier::TierError> {
        let m = self.model.pages.lock();
        let p = m.get(&index).expect("a page of the model");
        let mut out = vec![0u8; p.bytes.len()];
        self.log.read(self.id, index, p.loc, &mut out)?;
        Ok(out)
    }

    /// Every page reads back exactly.
    pub fn check_all(&self) {
        let m = self.model.pages.lock();
        for (i, p) in m.iter() {
            let mut out = vec![0u8; p.bytes.len()];
            self.log
                .read(self.id, *i, p.loc, &mut out)
                .unwrap_or_else(|e| panic!("page {i} at {:?}: {e}", p.loc));
            assert!(out == p.bytes, "page {i} reads back what was written");
        }
    }

    pub fn loc(&self, index: u64) -> Location {
        self.model.pages.lock()[&index].loc
    }
}

pub fn cfg(segment_size: usize, encrypt: bool) -> LogConfig {
    let mut c = LogConfig::new("/nonexistent", 0);
    c.segment_size = segment_size;
    c.encrypt = encrypt;
    c.reserve_segments = 2;
    c
}

/// A log over a fresh MemIo of `segments` 64 KiB segments.
pub fn mem_log(segments: u32, encrypt: bool) -> (Arc<Log>, MemIo) {
    let io = MemIo::new(segments, SEG);
    let log = Log::with_io(cfg(SEG, encrypt), Box::new(io.clone())).unwrap();
    (log, io)
}

pub fn mem_log_cfg(c: LogConfig, segments: u32) -> (Arc<Log>, MemIo) {
    let io = MemIo::new(segments, c.segment_size);
    assert_eq!(io.segment_size(), c.segment_size);
    let log = Log::with_io(c, Box::new(io.clone())).unwrap();
    (log, io)
}

/// Page contents: deterministic from (index, version), compressible-ish, `len` bytes.
pub fn page(index: u64, version: u64, len: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(index.wrapping_mul(0x9e37_79b9) ^ version);
    (0..len).map(|_| r.random::<u8>() & 0x3f).collect()
}
