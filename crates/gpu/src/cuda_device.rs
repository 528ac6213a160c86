//! The nvCOMP device: a batch of pages is packed into page-locked host memory, copied to the
//! GPU with its pointer and size arrays, compressed by nvCOMP's batched API, and copied back,
//! all queued on one stream with one synchronisation per batch.

use std::collections::HashMap;
use std::sync::Arc;

use zmem_os::sync::RwLock;

use crate::cuda::{CuContext, CuDevice, CuDevicePtr, CuStream, DeviceInfo, Driver};
use crate::device::{batch_bytes, Device, Transfer, ALIGN};
use crate::nvcomp::{CompressArgs, Nvcomp};
use crate::{GpuCodec, GpuConfig, GpuError};

/// The smallest input the output side is sized for: a page. Smaller inputs have a larger
/// worst case relative to their size; a batch that would not fit fails (the CPU redoes it).
const SIZED_FOR: usize = 4096;

/// Offsets in the metadata block, one copy each way: `[in_ptrs | out_ptrs | in_sizes]` go to
/// the device, `[out_sizes | statuses]` come back.
#[derive(Clone, Copy)]
struct Meta {
    chunks: usize,
}

impl Meta {
    fn in_ptrs(self) -> usize {
        0
    }
    fn out_ptrs(self) -> usize {
        self.chunks * 8
    }
    fn in_sizes(self) -> usize {
        2 * self.chunks * 8
    }
    /// Bytes sent before each batch.
    fn down(self) -> usize {
        3 * self.chunks * 8
    }
    fn out_sizes(self) -> usize {
        self.down()
    }
    fn statuses(self) -> usize {
        4 * self.chunks * 8
    }
    /// Bytes read back after each batch (from `out_sizes`).
    fn up(self) -> usize {
        self.chunks * 8 + self.chunks * 4
    }
    fn total(self) -> usize {
        self.down() + self.up()
    }
}

/// Everything allocated in the context; freed before the context goes.
struct Buffers {
    h_in: *mut u8,
    h_out: *mut u8,
    h_meta: *mut u8,
    d_in: CuDevicePtr,
    d_out: CuDevicePtr,
    d_meta: CuDevicePtr,
    d_temp: CuDevicePtr,
    temp_bytes: usize,
    /// Capacity of the output side (`h_out`, `d_out`).
    out_bytes: usize,
}

/// Orders a context reset against the batches of the other devices opened with this one: a
/// batch runs under the read side; a reset takes the write side and bumps the epoch, and a
/// device that finds a newer epoch knows its buffers went with the old context.
struct Gate {
    epoch: RwLock<u64>,
}

pub struct CudaDevice {
    gate: Arc<Gate>,
    /// The gate's epoch this device's buffers belong to.
    epoch: u64,
    driver: Arc<Driver>,
    nvcomp: Arc<Nvcomp>,
    info: DeviceInfo,
    dev: CuDevice,
    ctx: CuContext,
    stream: CuStream,
    cfg: GpuConfig,
    meta: Meta,
    bufs: Option<Buffers>,
    /// Codecs whose scratch is allocated.
    prepared: HashMap<GpuCodec, usize>,
    /// The largest output of an input of a given length, per codec, asked of nvCOMP once.
    max_out: HashMap<(GpuCodec, usize), usize>,
}

// SAFETY: the device is used by one thread at a time (the backend's worker); CUDA handles and
// pinned pointers may move between threads (the context is made current before each use).
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    /// Loads the driver and nvCOMP, opens device `cfg.device`, and allocates a batch's buffers.
    pub fn open(cfg: GpuConfig) -> Result<CudaDevice, GpuError> {
        let mut v = Self::open_many(cfg, 1)?;
        Ok(v.remove(0))
    }

    /// `n` devices on the same GPU and context, each with its own stream and buffers, so that
    /// `n` batches can be in flight (one per backend thread).
    pub fn open_many(cfg: GpuConfig, n: usize) -> Result<Vec<CudaDevice>, GpuError> {
        cfg.validate()?;
        let driver = Arc::new(Driver::load()?);
        let nvcomp = Arc::new(Nvcomp::load()?);
        let (dev, info) = driver.device(cfg.device)?;
        let gate = Arc::new(Gate {
            epoch: RwLock::new(0),
        });
        let mut out = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            let mut d = CudaDevice {
                gate: gate.clone(),
                epoch: 0,
                driver: driver.clone(),
                nvcomp: nvcomp.clone(),
                info: info.clone(),
                dev,
                ctx: std::ptr::null_mut(),
                stream: std::ptr::null_mut(),
                meta: Meta {
                    chunks: cfg.max_chunks,
                },
                cfg: cfg.clone(),
                bufs: None,
                prepared: HashMap::new(),
                max_out: HashMap::new(),
            };
            d.setup()?;
            out.push(d);
        }
        Ok(out)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Takes the context, a stream and the buffers; on any failure gives back what it took,
    /// so that the next batch starts from nothing again (never from half a set-up).
    fn setup(&mut self) -> Result<(), GpuError> {
        let r = self.try_setup();
        if r.is_err() {
            self.teardown(true);
        }
        r
    }

    fn try_setup(&mut self) -> Result<(), GpuError> {
        let drv = self.driver.clone();
        self.ctx = drv.retain_primary(self.dev)?;
        drv.set_current(self.ctx)?;
        self.stream = drv.stream()?;
        // Output room for a full staging area of pages in the format with the larger worst
        // case (deflate: ~2.3x a page), so one set of buffers serves every codec.
        let staging = self.cfg.staging_bytes;
        let mut worst = 0;
        for codec in [GpuCodec::Lz4, GpuCodec::Deflate { algorithm: 2 }] {
            worst = worst.max(
                self.nvcomp
                    .max_output(codec, SIZED_FOR)?
                    .next_multiple_of(ALIGN),
            );
            let a = self.nvcomp.alignments(codec)?;
            if [a.input, a.output, a.temp].iter().any(|&x| x > ALIGN) {
                return Err(GpuError::Config(format!(
                    "{codec:?} asks for alignments {a:?}; zmem aligns to {ALIGN}"
                )));
            }
        }
        let out_bytes = staging.div_ceil(SIZED_FOR) * worst;
        let mut b = Buffers {
            h_in: std::ptr::null_mut(),
            h_out: std::ptr::null_mut(),
            h_meta: std::ptr::null_mut(),
            d_in: 0,
            d_out: 0,
            d_meta: 0,
            d_temp: 0,
            temp_bytes: 0,
            out_bytes,
        };
        // Kept even on failure, so that `teardown` frees what was allocated.
        let r = (|| {
            b.h_in = drv.alloc_host(staging)?;
            b.h_out = drv.alloc_host(out_bytes)?;
            b.h_meta = drv.alloc_host(self.meta.total())?;
            b.d_in = drv.alloc(staging)?;
            b.d_out = drv.alloc(out_bytes)?;
            b.d_meta = drv.alloc(self.meta.total())?;
            Ok(())
        })();
        self.bufs = Some(b);
        r
    }

    /// Frees what this device allocated and releases its hold on the context. `free: false`
    /// after another device reset the context: the buffers and the stream went with it.
    fn teardown(&mut self, free: bool) {
        let drv = &self.driver;
        if !self.ctx.is_null() {
            let _ = drv.set_current(self.ctx);
        }
        if !free {
            self.bufs = None;
            self.stream = std::ptr::null_mut();
        }
        if let Some(b) = self.bufs.take() {
            for p in [b.h_in, b.h_out, b.h_meta] {
                if !p.is_null() {
                    drv.free_host(p);
                }
            }
            for p in [b.d_in, b.d_out, b.d_meta, b.d_temp] {
                if p != 0 {
                    drv.free(p);
                }
            }
        }
        if !self.stream.is_null() {
            drv.destroy_stream(self.stream);
            self.stream = std::ptr::null_mut();
        }
        if !self.ctx.is_null() {
            drv.release_primary(self.dev);
            self.ctx = std::ptr::null_mut();
        }
        self.prepared.clear();
    }

    /// The device scratch for `codec`, grown to fit a full batch.
    fn prepare(&mut self, codec: GpuCodec) -> Result<(), GpuError> {
        if self.prepared.contains_key(&codec) {
            return Ok(());
        }
        let temp = self.nvcomp.temp_bytes(
            codec,
            self.cfg.max_chunks,
            self.cfg.max_chunk_bytes,
            self.cfg.staging_bytes,
            self.stream,
        )?;
        let b = self.bufs.as_mut().expect("set up");
        if temp > b.temp_bytes {
            if b.d_temp != 0 {
                self.driver.free(b.d_temp);
                b.d_temp = 0;
                b.temp_bytes = 0;
            }
            b.d_temp = self.driver.alloc(temp.max(1))?;
            b.temp_bytes = temp;
        }
        self.prepared.insert(codec, temp);
        Ok(())
    }

    /// Bytes reserved for one output of an input of at most `len` bytes.
    fn out_stride(&mut self, codec: GpuCodec, len: usize) -> Result<usize, GpuError> {
        if let Some(&n) = self.max_out.get(&(codec, len)) {
            return Ok(n);
        }
        let n = self.nvcomp.max_output(codec, len)?.next_multiple_of(ALIGN);
        self.max_out.insert((codec, len), n);
        Ok(n)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let current = *self.gate.epoch.read() == self.epoch;
        self.teardown(current);
    }
}

impl Device for CudaDevice {
    fn describe(&self) -> String {
        format!(
            "{} (device {}, {} MiB, CUDA driver {}.{} at {}), nvCOMP {} ({})",
            self.info.name,
            self.info.ordinal,
            self.info.memory_bytes >> 20,
            self.info.driver_version / 1000,
            (self.info.driver_version % 1000) / 10,
            self.driver.path().display(),
            self.nvcomp.version(),
            self.nvcomp.path().display()
        )
    }

    fn max_chunks(&self) -> usize {
        self.cfg.max_chunks
    }

    fn max_chunk_bytes(&self) -> usize {
        self.cfg.max_chunk_bytes
    }

    fn max_batch_bytes(&self) -> usize {
        self.cfg.staging_bytes
    }

    fn compress(
        &mut self,
        codec: GpuCodec,
        inputs: &[&[u8]],
        out: &mut Vec<Result<Vec<u8>, GpuError>>,
    ) -> Result<Transfer, GpuError> {
        let n = inputs.len();
        let max_chunk = inputs.iter().map(|i| i.len()).max().unwrap_or(0);
        if n == 0 || n > self.cfg.max_chunks {
            return Err(GpuError::Config(format!(
                "a batch of {n} pages (1..={} allowed)",
                self.cfg.max_chunks
            )));
        }
        if inputs.iter().any(|i| i.is_empty()) || max_chunk > self.cfg.max_chunk_bytes {
            return Err(GpuError::Config(format!(
                "inputs of up to {max_chunk} bytes (1..={} allowed)",
                self.cfg.max_chunk_bytes
            )));
        }
        if batch_bytes(n, max_chunk) > self.cfg.staging_bytes {
            return Err(GpuError::Config(format!(
                "{n} inputs of up to {max_chunk} bytes exceed the {}-byte staging area",
                self.cfg.staging_bytes
            )));
        }
        let gate = self.gate.clone();
        let epoch = gate.epoch.read();
        if *epoch != self.epoch {
            // Another device reset the context since this one last ran.
            self.teardown(false);
            self.epoch = *epoch;
        }
        if self.bufs.is_none() || self.stream.is_null() {
            self.setup()?;
        }
        self.driver.set_current(self.ctx)?;
        self.prepare(codec)?;
        let stride = self.out_stride(codec, max_chunk)?;
        let c = max_chunk.next_multiple_of(ALIGN);
        let drv = self.driver.clone();
        let meta = self.meta;
        let b = self.bufs.as_ref().expect("set up");
        if n * stride > b.out_bytes {
            return Err(GpuError::Config(format!(
                "{n} outputs of up to {stride} bytes exceed the {}-byte output area",
                b.out_bytes
            )));
        }
        // SAFETY: n inputs of at most c bytes fit the staging area, n outputs of stride bytes
        // the output area, n <= max_chunks entries each array (all checked above); nothing
        // else uses the buffers while this batch runs (one thread).
        unsafe {
            let words = |off: usize| b.h_meta.add(off).cast::<u64>();
            for (i, input) in inputs.iter().enumerate() {
                std::ptr::copy_nonoverlapping(input.as_ptr(), b.h_in.add(i * c), input.len());
                *words(meta.in_ptrs()).add(i) = b.d_in + (i * c) as u64;
                *words(meta.out_ptrs()).add(i) = b.d_out + (i * stride) as u64;
                *words(meta.in_sizes()).add(i) = input.len() as u64;
            }
            let s = self.stream;
            let nvcomp = &self.nvcomp;
            let queued = || -> Result<(), GpuError> {
                drv.to_device(b.d_meta, b.h_meta, meta.down(), s)?;
                drv.to_device(b.d_in, b.h_in, n * c, s)?;
                let args = CompressArgs {
                    in_ptrs: b.d_meta + meta.in_ptrs() as u64,
                    in_sizes: b.d_meta + meta.in_sizes() as u64,
                    max_chunk,
                    chunks: n,
                    temp: b.d_temp,
                    temp_bytes: b.temp_bytes,
                    out_ptrs: b.d_meta + meta.out_ptrs() as u64,
                    out_sizes: b.d_meta + meta.out_sizes() as u64,
                    statuses: b.d_meta + meta.statuses() as u64,
                };
                nvcomp.compress(codec, &args, s)?;
                drv.to_host(
                    b.h_meta.add(meta.out_sizes()),
                    b.d_meta + meta.out_sizes() as u64,
                    meta.up(),
                    s,
                )?;
                drv.to_host(b.h_out, b.d_out, n * stride, s)?;
                drv.sync(s)
            };
            if let Err(e) = queued() {
                // Copies queued before the failure may still read or write the staging
                // buffers: the next batch must not touch them until the stream is idle.
                let _ = drv.sync(s);
                return Err(e);
            }
            out.clear();
            for i in 0..n {
                let size = *words(meta.out_sizes()).add(i) as usize;
                let status = *b.h_meta.add(meta.statuses()).cast::<i32>().add(i);
                out.push(if status != 0 {
                    Err(GpuError::Chunk { index: i, status })
                } else if size == 0 || size > stride {
                    // Nothing the device could mean: treat as that page's failure.
                    Err(GpuError::BadOutput { index: i, size })
                } else {
                    Ok(std::slice::from_raw_parts(b.h_out.add(i * stride), size).to_vec())
                });
            }
        }
        Ok(Transfer {
            to_device: (meta.down() + n * c) as u64,
            to_host: (meta.up() + n * stride) as u64,
        })
    }

    fn reset(&mut self) -> Result<(), GpuError> {
        let gate = self.gate.clone();
        let mut epoch = gate.epoch.write();
        if *epoch != self.epoch {
            // Another device reset the context after this one's failure: set up again.
            self.teardown(false);
        } else {
            self.teardown(true);
            // A sticky error poisons the whole context: only a reset of it gives a usable one.
            self.driver.reset_primary(self.dev)?;
            *epoch += 1;
        }
        self.epoch = *epoch;
        self.setup()
    }
}
