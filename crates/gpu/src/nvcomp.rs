//! nvCOMP's batched compression API (6.x; nvcomp/deflate.h, nvcomp/lz4.h), loaded at run time.
//! Found as `ZMEM_NVCOMP_LIB` (a file or a wheel's `lib64` folder), then by the dynamic
//! loader's search, then in the site-packages of `pip install nvidia-libnvcomp-cu13`.

use std::ffi::{c_int, c_void};

use crate::cuda::CuStream;
use crate::loader::{self, Loaded};
use crate::GpuError;

type Status = c_int;

/// `nvcompBatchedDeflateCompressOpts_t`: 64 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DeflateOpts {
    /// 0 entropy only, 1 high throughput (nvCOMP's default), 2 beats zlib-1, 4 beats zlib-6,
    /// 5 highest ratio.
    algorithm: c_int,
    reserved: [u8; 60],
}

/// `nvcompBatchedLZ4CompressOpts_t`: data type CHAR (0), no bitshuffle (0).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Lz4Opts {
    data_type: c_int,
    bitshuffle_mode: c_int,
    reserved: [u8; 56],
}

const _: () = assert!(std::mem::size_of::<DeflateOpts>() == 64);
const _: () = assert!(std::mem::size_of::<Lz4Opts>() == 64);

#[repr(C)]
#[derive(Default)]
struct Properties {
    version: u32,
    cudart_version: u32,
}

/// `nvcompAlignmentRequirements_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Alignments {
    pub(crate) input: usize,
    pub(crate) output: usize,
    pub(crate) temp: usize,
}

type AlignFn<O> = unsafe extern "C" fn(O, *mut Alignments) -> Status;
type TempFn<O> = unsafe extern "C" fn(usize, usize, O, *mut usize, usize, CuStream) -> Status;
type MaxOutFn<O> = unsafe extern "C" fn(usize, O, *mut usize) -> Status;
type CompressFn<O> = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    *mut usize,
    O,
    *mut Status,
    CuStream,
) -> Status;

/// One format's four calls.
struct Format<O> {
    alignments: AlignFn<O>,
    temp_size: TempFn<O>,
    max_output: MaxOutFn<O>,
    compress: CompressFn<O>,
}

impl<O> Format<O> {
    /// # Safety
    /// The four symbols of `prefix` must have these signatures (nvCOMP 6.x).
    unsafe fn load(lib: &Loaded, prefix: &str) -> Result<Format<O>, GpuError> {
        // SAFETY: the caller's promise.
        unsafe {
            Ok(Format {
                alignments: lib.func(&format!("{prefix}CompressGetRequiredAlignments"))?,
                temp_size: lib.func(&format!("{prefix}CompressGetTempSize"))?,
                max_output: lib.func(&format!("{prefix}CompressGetMaxOutputChunkSize"))?,
                compress: lib.func(&format!("{prefix}CompressAsync"))?,
            })
        }
    }
}

/// The codec a batch is compressed with on the device, with its nvCOMP option.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuCodec {
    /// Raw deflate (RFC 1951): decodes with libdeflate on the CPU.
    Deflate { algorithm: i32 },
    /// LZ4 blocks: decode with liblz4 on the CPU.
    Lz4,
}

impl GpuCodec {
    /// The device codec for zmem's codec, or None for codecs the device does not produce in
    /// a format the CPU decodes as zmem's (raw, zstd). Deflate levels map to nvCOMP's
    /// algorithms by the ratio they aim at: 0 -> 0 (entropy only), 1-5 -> 2 ("beats zlib
    /// level 1"), 6-9 -> 4 ("beats zlib level 6"), 10-12 -> 5.
    pub fn for_codec(codec: zmem_codec::Codec) -> Option<GpuCodec> {
        match codec {
            zmem_codec::Codec::Lz4 { .. } => Some(GpuCodec::Lz4),
            zmem_codec::Codec::Deflate { level } => Some(GpuCodec::Deflate {
                algorithm: match level {
                    ..=0 => 0,
                    1..=5 => 2,
                    6..=9 => 4,
                    _ => 5,
                },
            }),
            _ => None,
        }
    }

    pub fn id(self) -> zmem_codec::CodecId {
        match self {
            GpuCodec::Deflate { .. } => zmem_codec::CodecId::Deflate,
            GpuCodec::Lz4 => zmem_codec::CodecId::Lz4,
        }
    }

    fn deflate_opts(algorithm: i32) -> DeflateOpts {
        DeflateOpts {
            algorithm,
            reserved: [0; 60],
        }
    }

    fn lz4_opts() -> Lz4Opts {
        Lz4Opts {
            data_type: 0,
            bitshuffle_mode: 0,
            reserved: [0; 56],
        }
    }
}

/// The device-side arguments of one batched compression call.
pub(crate) struct CompressArgs {
    pub(crate) in_ptrs: u64,
    pub(crate) in_sizes: u64,
    pub(crate) max_chunk: usize,
    pub(crate) chunks: usize,
    pub(crate) temp: u64,
    pub(crate) temp_bytes: usize,
    pub(crate) out_ptrs: u64,
    pub(crate) out_sizes: u64,
    pub(crate) statuses: u64,
}

pub(crate) struct Nvcomp {
    lib: Loaded,
    version: u32,
    deflate: Format<DeflateOpts>,
    lz4: Format<Lz4Opts>,
}

// SAFETY: nvCOMP's batched calls are thread-safe on distinct streams; the pointers are code.
unsafe impl Send for Nvcomp {}
unsafe impl Sync for Nvcomp {}

impl Nvcomp {
    pub(crate) fn load() -> Result<Nvcomp, GpuError> {
        let lib = loader::open(
            "nvCOMP",
            "ZMEM_NVCOMP_LIB",
            &["libnvcomp.so.6", "libnvcomp.so"],
            &loader::nvcomp_wheel_dirs(),
            "install it with `pip install nvidia-libnvcomp-cu13` (CUDA 13; -cu12 for CUDA 12) \
             or point ZMEM_NVCOMP_LIB at libnvcomp.so.6 or its folder",
        )?;
        // SAFETY: nvcomp.h: nvcompStatus_t nvcompGetProperties(nvcompProperties_t*).
        let props: unsafe extern "C" fn(*mut Properties) -> Status =
            unsafe { lib.func("nvcompGetProperties")? };
        let mut p = Properties::default();
        // SAFETY: an out-parameter of the declared layout.
        let st = unsafe { props(&mut p) };
        if st != 0 {
            return Err(GpuError::Nvcomp {
                call: "nvcompGetProperties",
                status: st,
            });
        }
        if p.version / 1000 != 6 {
            return Err(GpuError::UnsupportedVersion {
                path: lib.path.clone(),
                found: version_string(p.version),
            });
        }
        // SAFETY: the 6.x signatures declared above (nvcomp/deflate.h, nvcomp/lz4.h).
        let (deflate, lz4) = unsafe {
            (
                Format::load(&lib, "nvcompBatchedDeflate")?,
                Format::load(&lib, "nvcompBatchedLZ4")?,
            )
        };
        Ok(Nvcomp {
            lib,
            version: p.version,
            deflate,
            lz4,
        })
    }

    pub(crate) fn version(&self) -> String {
        version_string(self.version)
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.lib.path
    }

    fn status(call: &'static str, st: Status) -> Result<(), GpuError> {
        match st {
            0 => Ok(()),
            status => Err(GpuError::Nvcomp { call, status }),
        }
    }

    pub(crate) fn alignments(&self, codec: GpuCodec) -> Result<Alignments, GpuError> {
        let mut a = Alignments::default();
        // SAFETY: an out-parameter of the declared layout; options by value.
        let st = unsafe {
            match codec {
                GpuCodec::Deflate { algorithm } => {
                    (self.deflate.alignments)(GpuCodec::deflate_opts(algorithm), &mut a)
                }
                GpuCodec::Lz4 => (self.lz4.alignments)(GpuCodec::lz4_opts(), &mut a),
            }
        };
        Self::status("CompressGetRequiredAlignments", st)?;
        Ok(a)
    }

    /// Device scratch for `chunks` chunks of at most `max_chunk` bytes, `total` bytes in all.
    pub(crate) fn temp_bytes(
        &self,
        codec: GpuCodec,
        chunks: usize,
        max_chunk: usize,
        total: usize,
        stream: CuStream,
    ) -> Result<usize, GpuError> {
        let mut t = 0usize;
        // SAFETY: host-side query; the stream is live.
        let st = unsafe {
            match codec {
                GpuCodec::Deflate { algorithm } => (self.deflate.temp_size)(
                    chunks,
                    max_chunk,
                    GpuCodec::deflate_opts(algorithm),
                    &mut t,
                    total,
                    stream,
                ),
                GpuCodec::Lz4 => (self.lz4.temp_size)(
                    chunks,
                    max_chunk,
                    GpuCodec::lz4_opts(),
                    &mut t,
                    total,
                    stream,
                ),
            }
        };
        Self::status("CompressGetTempSize", st)?;
        Ok(t)
    }

    /// The largest output of one chunk of `max_chunk` bytes.
    pub(crate) fn max_output(&self, codec: GpuCodec, max_chunk: usize) -> Result<usize, GpuError> {
        let mut n = 0usize;
        // SAFETY: host-side query with an out-parameter.
        let st = unsafe {
            match codec {
                GpuCodec::Deflate { algorithm } => {
                    (self.deflate.max_output)(max_chunk, GpuCodec::deflate_opts(algorithm), &mut n)
                }
                GpuCodec::Lz4 => (self.lz4.max_output)(max_chunk, GpuCodec::lz4_opts(), &mut n),
            }
        };
        Self::status("CompressGetMaxOutputChunkSize", st)?;
        Ok(n)
    }

    /// Queues one batched compression on `stream`.
    ///
    /// # Safety
    /// Every address in `a` is device memory of the sizes nvCOMP requires (pointer and size
    /// arrays of `a.chunks` entries, each output of `max_output` bytes, `temp_bytes` of
    /// scratch), aligned as `alignments` says, and stays allocated until the stream is
    /// synchronised.
    pub(crate) unsafe fn compress(
        &self,
        codec: GpuCodec,
        a: &CompressArgs,
        stream: CuStream,
    ) -> Result<(), GpuError> {
        macro_rules! call {
            ($f:expr, $opts:expr) => {
                $f(
                    a.in_ptrs as *const *const c_void,
                    a.in_sizes as *const usize,
                    a.max_chunk,
                    a.chunks,
                    a.temp as *mut c_void,
                    a.temp_bytes,
                    a.out_ptrs as *const *mut c_void,
                    a.out_sizes as *mut usize,
                    $opts,
                    a.statuses as *mut Status,
                    stream,
                )
            };
        }
        // SAFETY: the caller's promise about every buffer.
        let st = unsafe {
            match codec {
                GpuCodec::Deflate { algorithm } => {
                    call!(self.deflate.compress, GpuCodec::deflate_opts(algorithm))
                }
                GpuCodec::Lz4 => call!(self.lz4.compress, GpuCodec::lz4_opts()),
            }
        };
        Self::status("CompressAsync", st)
    }
}

fn version_string(v: u32) -> String {
    format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zmem_codecs_map_to_device_codecs_by_the_ratio_they_aim_at() {
        use zmem_codec::Codec;
        assert_eq!(GpuCodec::for_codec(Codec::LZ4), Some(GpuCodec::Lz4));
        let alg = |level| match GpuCodec::for_codec(Codec::Deflate { level }) {
            Some(GpuCodec::Deflate { algorithm }) => algorithm,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            [alg(0), alg(1), alg(5), alg(6), alg(9), alg(12)],
            [0, 2, 2, 4, 4, 5]
        );
        assert_eq!(GpuCodec::for_codec(Codec::Zstd { level: 1 }), None);
        assert_eq!(GpuCodec::for_codec(Codec::Raw), None);
        assert_eq!(version_string(6012), "6.0.12");
    }
}

/// nvCOMP's host-side queries need no GPU: where the library is installed (ZMEM_NVCOMP_LIB or
/// a pip wheel), these check the signatures zmem declares against the real library.
#[cfg(test)]
mod with_the_library {
    use super::*;

    #[test]
    fn nvcomp_answers_its_host_side_queries() {
        let nv = match Nvcomp::load() {
            Ok(nv) => nv,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        assert!(nv.version().starts_with("6."), "{}", nv.version());
        for codec in [GpuCodec::Lz4, GpuCodec::Deflate { algorithm: 2 }] {
            let page = nv.max_output(codec, 4096).unwrap();
            let block = nv.max_output(codec, 65536).unwrap();
            // Deflate's worst case for a page is ~2.3x (9296 bytes in 6.0).
            assert!((4096..3 * 4096).contains(&page), "{codec:?}: {page}");
            assert!(block >= 65536 && block > page, "{codec:?}: {block}");
            let a = nv.alignments(codec).unwrap();
            assert!(
                a.input >= 1 && a.input <= 8 && a.output <= 8 && a.temp <= 8,
                "{a:?}"
            );
        }
        // The scratch query takes the options by value among six arguments; without a GPU
        // it may answer or refuse with a status, never crash.
        for codec in [GpuCodec::Lz4, GpuCodec::Deflate { algorithm: 2 }] {
            // (1024 pages; the default configuration's worst case: 1024 chunks of up to
            // 64 KiB, 8 MiB in all.)
            for (chunk, total) in [(4096, 4 << 20), (65536, 8 << 20)] {
                match nv.temp_bytes(codec, 1024, chunk, total, std::ptr::null_mut()) {
                    Ok(t) => eprintln!("{codec:?}: {t} bytes of scratch for 1024 x {chunk}"),
                    Err(e) => assert!(matches!(e, GpuError::Nvcomp { .. }), "{e}"),
                }
            }
        }
        // A chunk over nvCOMP's limit is refused with a status, not a crash.
        let e = nv.max_output(GpuCodec::Lz4, 1 << 30).unwrap_err();
        assert!(matches!(e, GpuError::Nvcomp { .. }), "{e}");
    }
}
