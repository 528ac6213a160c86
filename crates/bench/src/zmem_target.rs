//! The zmem page store as a benchmark target: writes go through the asynchronous write path
//! (the caller does not wait for compression; `flush` is timed as part of a write phase),
//! reads through `read_batch`.

use anyhow::Context;
use zmem_engine::Policy;
use zmem_store::{PageStore, StoreConfig};

use crate::target::{MemoryReport, PageTarget};

pub struct ZmemTargetConfig {
    pub size: u64,
    pub policy: String,
    /// Multi-page block bytes.
    pub block: Option<usize>,
    pub mem_limit: Option<u64>,
    /// Where batched writes are compressed (`pages --backend`).
    pub backend: crate::offload::BackendKind,
}

struct ZmemTarget {
    store: PageStore,
    size: u64,
    name: String,
    gpu: Option<std::sync::Arc<zmem_gpu::GpuBackend>>,
}

const PAGE: u64 = zmem_os::PAGE_SIZE as u64;

pub fn open(cfg: &ZmemTargetConfig) -> anyhow::Result<Box<dyn PageTarget>> {
    let policy: Policy = cfg.policy.parse()?;
    if cfg.size == 0 || cfg.size % PAGE != 0 {
        anyhow::bail!("store size {} is not a positive multiple of 4096", cfg.size);
    }
    let block_pages = match cfg.block {
        None => 1,
        Some(b) if b % PAGE as usize == 0 && b > 0 => b / PAGE as usize,
        Some(b) => anyhow::bail!("block size {b} is not a positive multiple of 4096"),
    };
    let mut sc = StoreConfig::new(cfg.size / PAGE, policy);
    sc.block_pages = block_pages;
    sc.mem_limit = cfg.mem_limit;
    if policy == Policy::Auto {
        // Pages untouched for a second are recompressed in the background.
        sc.recompress_interval = Some(std::time::Duration::from_secs(1));
    }
    let gpu = crate::offload::open_backend(cfg.backend, zmem_gpu::GpuConfig::default())?
        .map(std::sync::Arc::new);
    if let Some(g) = &gpu {
        eprintln!("zmem: accelerator: {}", g.describe());
        sc.accelerator = Some(zmem_engine::SharedBackend(g.clone()));
    }
    let store = PageStore::new(sc).context("creating the zmem page store")?;
    let mut name = match block_pages {
        1 => format!("zmem {policy}"),
        n => format!("zmem {policy} {}k-blocks", n * 4),
    };
    if gpu.is_some() {
        name.push_str(&format!(" ({:?})", cfg.backend).to_lowercase());
    }
    Ok(Box::new(ZmemTarget {
        store,
        size: cfg.size,
        name,
        gpu,
    }))
}

impl PageTarget for ZmemTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> anyhow::Result<()> {
        Ok(self.store.write_async(offset / PAGE, buf)?)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        Ok(self.store.read_batch(offset / PAGE, buf)?)
    }

    fn flush(&self) -> anyhow::Result<()> {
        Ok(self.store.flush()?)
    }

    fn memory(&self) -> anyhow::Result<MemoryReport> {
        let s = self.store.stats();
        Ok(MemoryReport {
            orig_data_size: s.orig_data_size,
            compr_data_size: s.compr_data_size,
            mem_used_total: s.mem_used_total,
            same_pages: s.same_pages,
            huge_pages: s.huge_pages,
        })
    }

    fn settle(&self) -> anyhow::Result<bool> {
        let Some(codec) = self.store.policy().cold_codec() else {
            return Ok(false);
        };
        // What the background recompressor does after an interval, without the wait: every
        // stored page is idle (nothing touches the store between phases).
        self.store.flush()?;
        self.store.mark_idle();
        self.store.recompress(codec, true);
        Ok(true)
    }

    fn extra(&self) -> serde_json::Value {
        let s = self.store.stats();
        let e = &s.engine;
        let codecs: serde_json::Map<String, serde_json::Value> = zmem_codec::CodecId::ALL
            .iter()
            .map(|id| {
                let c = e.per_codec[*id as usize];
                (
                    id.name().to_string(),
                    serde_json::json!({
                        "objects": c.objects, "in_bytes": c.in_bytes,
                        "out_bytes": c.out_bytes, "cpu_seconds": c.nanos as f64 / 1e9,
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "policy": self.store.policy().name(),
            "block_pages": s.block_pages,
            "pending_pages": s.pending_pages,
            "write_failures": s.write_failures,
            "recompressed_pages": s.recompressed_pages,
            "rejected": e.rejected,
            "fallbacks": e.fallbacks,
            "jobs_cpu": e.jobs_cpu,
            "jobs_offloaded": e.jobs_offloaded,
            "decompress_seconds": s.decompress_nanos as f64 / 1e9,
            "pool_fragmentation": s.pool.fragmentation(),
            "pool_spans": s.pool.spans,
            "codecs": codecs,
            "accelerator": self.gpu.as_ref().map(|g| {
                let st = g.stats();
                serde_json::json!({
                    "device": g.describe(), "batches": st.batches, "pages": st.pages,
                    "bytes_to_device": st.to_device, "bytes_to_host": st.to_host,
                    "batch_failures": st.batch_failures, "page_failures": st.page_failures,
                    "resets": st.resets, "busy_seconds": st.busy_ns as f64 / 1e9,
                    "last_error": st.last_error,
                })
            }),
        })
    }
}
