//! Codecs for zmem: lz4, zstd, raw deflate and raw, behind one small object format.
//!
//! Every compressed object starts with zmem's own header (not a library's frame):
//!
//! ```text
//! byte 0      low 4 bits: codec id (0 raw, 1 lz4, 2 zstd, 3 deflate); bit 4: dictionary used
//! bytes 1..4  original length, u24 little endian (objects are at most 16 MiB - 1)
//! byte 4      dictionary id, only when bit 4 of byte 0 is set
//! ```
//!
//! Output always goes into a caller-provided, capped buffer: a codec is given at most the room
//! that the rejection rule allows (QZFS: an output above `reject_ratio` of the input is not worth
//! keeping), so it fails fast instead of overflowing, and the data is then stored raw.
//! Contexts are per thread (lz4 state with the fastReset entry point, zstd CCtx/DCtx, libdeflate
//! compressors per level), so encoding never takes a lock.

mod dict;
mod same;

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

pub use dict::{train_dictionary, Dictionary};
pub use same::{fill_same, same_filled};

/// The page size zmem works with (defined once, in zmem-os).
pub use zmem_os::PAGE_SIZE;
/// Bytes of zmem's header without a dictionary id.
pub const HEADER_LEN: usize = 4;
/// Largest original length an object header can describe.
pub const MAX_INPUT_LEN: usize = (1 << 24) - 1;
/// Default rejection threshold (QZFS): keep compressed output only below 90% of the input.
pub const DEFAULT_REJECT_RATIO: f32 = 0.9;

const DICT_FLAG: u8 = 0x10;

/// Errors of the codec layer. Corrupt or truncated input is always reported, never trusted.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum CodecError {
    #[error("unknown codec id {0}")]
    UnknownCodecId(u8),
    #[error("unknown codec name {0:?} (expected raw, lz4, zstd[-LEVEL] or deflate[-LEVEL])")]
    UnknownCodecName(String),
    #[error("invalid level {level} for {codec} (allowed {min}..={max})")]
    InvalidLevel {
        codec: &'static str,
        level: i32,
        min: i32,
        max: i32,
    },
    #[error("compressed object truncated: {0}")]
    Truncated(&'static str),
    #[error("corrupt {codec} data: {reason}")]
    Corrupt { codec: &'static str, reason: String },
    #[error("decoded length {got} differs from the header's {expected}")]
    LengthMismatch { expected: usize, got: usize },
    #[error("output buffer too small: need {need} bytes, have {have}")]
    OutputTooSmall { need: usize, have: usize },
    #[error("input of {0} bytes is too large for one object (max {MAX_INPUT_LEN})")]
    InputTooLarge(usize),
    #[error("empty input")]
    EmptyInput,
    #[error("object needs dictionary {needed}, but {given}")]
    DictionaryMismatch { needed: u8, given: String },
    #[error("dictionary error: {0}")]
    Dictionary(String),
    #[error("invalid reject ratio {0} (must be in (0, 1])")]
    InvalidRejectRatio(f32),
    #[error("{0} objects cannot be built from another compressor's output (lz4 and deflate can)")]
    NotWrappable(&'static str),
}

/// Codec identifier as stored in the object header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CodecId {
    Raw = 0,
    Lz4 = 1,
    Zstd = 2,
    Deflate = 3,
}

impl CodecId {
    pub const ALL: [CodecId; 4] = [CodecId::Raw, CodecId::Lz4, CodecId::Zstd, CodecId::Deflate];

    pub fn from_u8(v: u8) -> Result<CodecId, CodecError> {
        match v {
            0 => Ok(CodecId::Raw),
            1 => Ok(CodecId::Lz4),
            2 => Ok(CodecId::Zstd),
            3 => Ok(CodecId::Deflate),
            other => Err(CodecError::UnknownCodecId(other)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CodecId::Raw => "raw",
            CodecId::Lz4 => "lz4",
            CodecId::Zstd => "zstd",
            CodecId::Deflate => "deflate",
        }
    }
}

/// A codec with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    Raw,
    /// liblz4 `LZ4_compress_fast`; acceleration 1 is the default speed/ratio point.
    Lz4 {
        acceleration: i32,
    },
    /// zstd, magicless frames without checksum, content size or dictionary id.
    Zstd {
        level: i32,
    },
    /// libdeflate raw deflate (RFC 1951), the format accelerators share.
    Deflate {
        level: i32,
    },
}

impl Codec {
    pub const LZ4: Codec = Codec::Lz4 { acceleration: 1 };

    pub fn id(self) -> CodecId {
        match self {
            Codec::Raw => CodecId::Raw,
            Codec::Lz4 { .. } => CodecId::Lz4,
            Codec::Zstd { .. } => CodecId::Zstd,
            Codec::Deflate { .. } => CodecId::Deflate,
        }
    }

    /// Checks the parameters against what the library accepts.
    pub fn validate(self) -> Result<Codec, CodecError> {
        let check = |codec, level, min, max| {
            if (min..=max).contains(&level) {
                Ok(())
            } else {
                Err(CodecError::InvalidLevel {
                    codec,
                    level,
                    min,
                    max,
                })
            }
        };
        match self {
            Codec::Raw => {}
            Codec::Lz4 { acceleration } => check("lz4", acceleration, 1, 65537)?,
            Codec::Zstd { level } => check("zstd", level, -7, 19)?,
            Codec::Deflate { level } => check("deflate", level, 0, 12)?,
        }
        Ok(self)
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::Raw => write!(f, "raw"),
            Codec::Lz4 { acceleration: 1 } => write!(f, "lz4"),
            Codec::Lz4 { acceleration } => write!(f, "lz4-{acceleration}"),
            Codec::Zstd { level } => write!(f, "zstd-{level}"),
            Codec::Deflate { level } => write!(f, "deflate-{level}"),
        }
    }
}

impl FromStr for Codec {
    type Err = CodecError;

    /// `raw`, `lz4`, `lz4-ACCEL`, `zstd` (level 1), `zstd-LEVEL`, `deflate` (level 1), `deflate-LEVEL`.
    fn from_str(s: &str) -> Result<Codec, CodecError> {
        let unknown = || CodecError::UnknownCodecName(s.to_string());
        let (name, param) = match s.split_once('-') {
            Some((n, p)) => {
                // zstd negative levels: "zstd--1"
                let v: i32 = p.parse().map_err(|_| unknown())?;
                (n, Some(v))
            }
            None => (s, None),
        };
        let codec = match (name, param) {
            ("raw", None) => Codec::Raw,
            ("lz4", p) => Codec::Lz4 {
                acceleration: p.unwrap_or(1),
            },
            ("zstd", p) => Codec::Zstd {
                level: p.unwrap_or(1),
            },
            ("deflate", p) => Codec::Deflate {
                level: p.unwrap_or(1),
            },
            _ => return Err(unknown()),
        };
        codec.validate()
    }
}

/// What `encode` produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// Bytes written to the output, header included.
    pub len: usize,
    /// The codec actually stored (`Raw` when the output was rejected).
    pub codec: CodecId,
    /// True when the codec's output was above the rejection threshold and the data went raw.
    pub rejected: bool,
}

/// A parsed object header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub codec: CodecId,
    pub orig_len: usize,
    pub dict_id: Option<u8>,
    /// Bytes the header takes.
    pub len: usize,
}

/// Worst-case size of an encoded object for an input of `input_len` bytes (raw plus header).
pub const fn max_encoded_len(input_len: usize) -> usize {
    input_len + HEADER_LEN + 1
}

/// Reads and checks an object's header.
pub fn peek_header(obj: &[u8]) -> Result<Header, CodecError> {
    if obj.len() < HEADER_LEN {
        return Err(CodecError::Truncated("shorter than the header"));
    }
    let codec = CodecId::from_u8(obj[0] & 0x0f)?;
    if obj[0] & !(0x0f | DICT_FLAG) != 0 {
        return Err(CodecError::Corrupt {
            codec: codec.name(),
            reason: format!("unknown header flags {:#04x}", obj[0]),
        });
    }
    let orig_len = u32::from_le_bytes([obj[1], obj[2], obj[3], 0]) as usize;
    let (dict_id, len) = if obj[0] & DICT_FLAG != 0 {
        if codec != CodecId::Zstd {
            return Err(CodecError::Corrupt {
                codec: codec.name(),
                reason: "dictionary flag on a codec without dictionaries".into(),
            });
        }
        let id = *obj
            .get(HEADER_LEN)
            .ok_or(CodecError::Truncated("missing dictionary id"))?;
        (Some(id), HEADER_LEN + 1)
    } else {
        (None, HEADER_LEN)
    };
    if orig_len == 0 {
        return Err(CodecError::Corrupt {
            codec: codec.name(),
            reason: "zero original length".into(),
        });
    }
    Ok(Header {
        codec,
        orig_len,
        dict_id,
        len,
    })
}

fn write_header(out: &mut [u8], codec: CodecId, orig_len: usize, dict: Option<u8>) -> usize {
    let l = (orig_len as u32).to_le_bytes();
    out[0] = codec as u8 | if dict.is_some() { DICT_FLAG } else { 0 };
    out[1..4].copy_from_slice(&l[..3]);
    match dict {
        Some(id) => {
            out[HEADER_LEN] = id;
            HEADER_LEN + 1
        }
        None => HEADER_LEN,
    }
}

/// What every object's input and rejection rule must be (`encode`, `wrap_payload`).
fn check_input(input: &[u8], reject_ratio: f32) -> Result<(), CodecError> {
    if input.is_empty() {
        return Err(CodecError::EmptyInput);
    }
    if input.len() > MAX_INPUT_LEN {
        return Err(CodecError::InputTooLarge(input.len()));
    }
    if !(reject_ratio > 0.0 && reject_ratio <= 1.0) {
        return Err(CodecError::InvalidRejectRatio(reject_ratio));
    }
    Ok(())
}

/// Compresses `input` into `out` as one object.
///
/// `out` must hold at least [`max_encoded_len`]`(input.len())` bytes, so the raw fallback always
/// fits. The codec is given room for at most `reject_ratio * input.len()` bytes (header
/// included); if it needs more, the object is stored raw and `rejected` is set. `dict` is used by
/// zstd only.
pub fn encode(
    codec: Codec,
    dict: Option<&Dictionary>,
    input: &[u8],
    out: &mut [u8],
    reject_ratio: f32,
) -> Result<Encoded, CodecError> {
    check_input(input, reject_ratio)?;
    let need = max_encoded_len(input.len());
    if out.len() < need {
        return Err(CodecError::OutputTooSmall {
            need,
            have: out.len(),
        });
    }
    let dict = match codec {
        Codec::Zstd { .. } => dict,
        _ => None,
    };
    if codec != Codec::Raw {
        let hdr = write_header(out, codec.id(), input.len(), dict.map(|d| d.id()));
        // Room the rejection rule leaves for the payload: fail fast above it.
        let budget = ((input.len() as f64) * f64::from(reject_ratio)) as usize;
        let room = budget.saturating_sub(hdr).min(out.len() - hdr);
        if room > 0 {
            let dst = &mut out[hdr..hdr + room];
            let produced = match codec {
                Codec::Lz4 { acceleration } => lz4_compress(input, dst, acceleration),
                Codec::Zstd { level } => zstd_compress(input, dst, level, dict)?,
                Codec::Deflate { level } => deflate_compress(input, dst, level)?,
                Codec::Raw => None,
            };
            if let Some(n) = produced {
                return Ok(Encoded {
                    len: hdr + n,
                    codec: codec.id(),
                    rejected: false,
                });
            }
        }
    }
    let hdr = write_header(out, CodecId::Raw, input.len(), None);
    out[hdr..hdr + input.len()].copy_from_slice(input);
    Ok(Encoded {
        len: hdr + input.len(),
        codec: CodecId::Raw,
        rejected: codec != Codec::Raw,
    })
}

/// Builds zmem's object for `input` from a payload another compressor produced (an
/// accelerator's raw deflate stream or LZ4 block), under the same rule as [`encode`]: if the
/// header and payload pass `reject_ratio`, the object is header + payload, otherwise the input
/// is stored raw (`rejected`). The payload is not checked here: decode it before trusting it
/// (the engine's verify step does). `codec` must be `Lz4` or `Deflate`, the formats an
/// accelerator shares with the CPU codecs; `out` is cleared first.
pub fn wrap_payload(
    codec: CodecId,
    input: &[u8],
    payload: &[u8],
    out: &mut Vec<u8>,
    reject_ratio: f32,
) -> Result<Encoded, CodecError> {
    check_input(input, reject_ratio)?;
    if !matches!(codec, CodecId::Lz4 | CodecId::Deflate) {
        return Err(CodecError::NotWrappable(codec.name()));
    }
    let budget = ((input.len() as f64) * f64::from(reject_ratio)) as usize;
    let (id, body, rejected) = match HEADER_LEN + payload.len() <= budget && !payload.is_empty() {
        true => (codec, payload, false),
        false => (CodecId::Raw, input, true),
    };
    out.clear();
    out.resize(HEADER_LEN + body.len(), 0);
    let hdr = write_header(out, id, input.len(), None);
    out[hdr..].copy_from_slice(body);
    Ok(Encoded {
        len: out.len(),
        codec: id,
        rejected,
    })
}

/// Decompresses one object into `out`, which must hold the header's original length; returns
/// that length. Every byte of `out[..len]` is written, or an error is returned.
pub fn decode(obj: &[u8], dict: Option<&Dictionary>, out: &mut [u8]) -> Result<usize, CodecError> {
    let h = peek_header(obj)?;
    if out.len() < h.orig_len {
        return Err(CodecError::OutputTooSmall {
            need: h.orig_len,
            have: out.len(),
        });
    }
    let payload = &obj[h.len..];
    let dst = &mut out[..h.orig_len];
    let got = match h.codec {
        CodecId::Raw => {
            if payload.len() != h.orig_len {
                return Err(CodecError::LengthMismatch {
                    expected: h.orig_len,
                    got: payload.len(),
                });
            }
            dst.copy_from_slice(payload);
            h.orig_len
        }
        CodecId::Lz4 => lz4_decompress(payload, dst)?,
        CodecId::Zstd => {
            let d = match (h.dict_id, dict) {
                (None, _) => None,
                (Some(id), Some(d)) if d.id() == id => Some(d),
                (Some(id), other) => {
                    return Err(CodecError::DictionaryMismatch {
                        needed: id,
                        given: match other {
                            Some(d) => format!("dictionary {} was given", d.id()),
                            None => "none was given".into(),
                        },
                    })
                }
            };
            zstd_decompress(payload, dst, d)?
        }
        CodecId::Deflate => deflate_decompress(payload, dst)?,
    };
    if got != h.orig_len {
        return Err(CodecError::LengthMismatch {
            expected: h.orig_len,
            got,
        });
    }
    Ok(got)
}

// ---------------------------------------------------------------- lz4

mod lz4_ffi {
    use std::os::raw::{c_char, c_int, c_void};
    // These are compiled into lz4-sys's static liblz4 (lz4.c, LZ4_STATIC_LINKING_ONLY part of
    // the API); lz4-sys does not declare them.
    extern "C" {
        pub fn LZ4_sizeofState() -> c_int;
        pub fn LZ4_initStream(buffer: *mut c_void, size: usize) -> *mut c_void;
        pub fn LZ4_compress_fast_extState_fastReset(
            state: *mut c_void,
            src: *const c_char,
            dst: *mut c_char,
            src_size: c_int,
            dst_capacity: c_int,
            acceleration: c_int,
        ) -> c_int;
    }
}

struct Lz4State {
    // u64 storage keeps the state 8-byte aligned, as liblz4 requires.
    mem: Vec<u64>,
}

impl Lz4State {
    fn new() -> Lz4State {
        // SAFETY: a pure function of the library.
        let size = unsafe { lz4_ffi::LZ4_sizeofState() } as usize;
        let mut mem = vec![0u64; size.div_ceil(8)];
        // SAFETY: mem is a writable, aligned buffer of at least `size` bytes.
        unsafe { lz4_ffi::LZ4_initStream(mem.as_mut_ptr().cast(), size) };
        Lz4State { mem }
    }
}

thread_local! {
    static LZ4_STATE: RefCell<Option<Lz4State>> = const { RefCell::new(None) };
}

/// Whether this thread's codec contexts can still be used (not while its thread-locals are
/// being destroyed at its exit).
pub fn thread_state_alive() -> bool {
    LZ4_STATE.try_with(|_| ()).is_ok()
        && ZSTD_CTX.try_with(|_| ()).is_ok()
        && DEFLATE.try_with(|_| ()).is_ok()
}

/// Registers this thread's codec contexts now (they are still made at first use).
pub fn prepare_thread() {
    LZ4_STATE.with(|_| ());
    ZSTD_CTX.with(|_| ());
    DEFLATE.with(|_| ());
}

/// Returns the compressed length, or None if it did not fit in `dst`.
fn lz4_compress(input: &[u8], dst: &mut [u8], acceleration: i32) -> Option<usize> {
    LZ4_STATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let state = slot.get_or_insert_with(Lz4State::new);
        let cap = dst.len().min(i32::MAX as usize) as i32;
        // SAFETY: the state was initialised by LZ4_initStream and is only used by this thread;
        // src/dst lengths are the slices' own, and liblz4 never writes past dst_capacity.
        let n = unsafe {
            lz4_ffi::LZ4_compress_fast_extState_fastReset(
                state.mem.as_mut_ptr().cast(),
                input.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                input.len() as i32,
                cap,
                acceleration,
            )
        };
        (n > 0).then_some(n as usize)
    })
}

fn lz4_decompress(src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
    if src.is_empty() {
        return Err(CodecError::Truncated("empty lz4 payload"));
    }
    // SAFETY: LZ4_decompress_safe never reads past src_size nor writes past dst_capacity,
    // whatever the input bytes are.
    let n = unsafe {
        lz4_sys::LZ4_decompress_safe(
            src.as_ptr().cast(),
            dst.as_mut_ptr().cast(),
            src.len().min(i32::MAX as usize) as i32,
            dst.len().min(i32::MAX as usize) as i32,
        )
    };
    if n < 0 {
        return Err(CodecError::Corrupt {
            codec: "lz4",
            reason: format!("LZ4_decompress_safe returned {n}"),
        });
    }
    Ok(n as usize)
}

// ---------------------------------------------------------------- zstd

struct ZstdCtx {
    cctx: zstd_safe::CCtx<'static>,
    dctx: zstd_safe::DCtx<'static>,
    level: Option<i32>,
}

impl ZstdCtx {
    fn new() -> Result<ZstdCtx, CodecError> {
        let mut cctx = zstd_safe::CCtx::create();
        let mut dctx = zstd_safe::DCtx::create();
        zstd_base_params(&mut cctx)?;
        dctx.set_parameter(zstd_safe::DParameter::Format(
            zstd_safe::FrameFormat::Magicless,
        ))
        .map_err(zstd_err)?;
        Ok(ZstdCtx {
            cctx,
            dctx,
            level: None,
        })
    }
}

fn zstd_base_params(cctx: &mut zstd_safe::CCtx<'static>) -> Result<(), CodecError> {
    use zstd_safe::CParameter as P;
    for p in [
        P::Format(zstd_safe::FrameFormat::Magicless),
        P::ContentSizeFlag(false),
        P::ChecksumFlag(false),
        P::DictIdFlag(false),
    ] {
        cctx.set_parameter(p).map_err(zstd_err)?;
    }
    Ok(())
}

fn zstd_err(code: usize) -> CodecError {
    CodecError::Corrupt {
        codec: "zstd",
        reason: zstd_safe::get_error_name(code).to_string(),
    }
}

thread_local! {
    static ZSTD_CTX: RefCell<Option<ZstdCtx>> = const { RefCell::new(None) };
}

fn with_zstd<R>(f: impl FnOnce(&mut ZstdCtx) -> Result<R, CodecError>) -> Result<R, CodecError> {
    ZSTD_CTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(ZstdCtx::new()?);
        }
        f(slot.as_mut().expect("initialised above"))
    })
}

fn zstd_compress(
    input: &[u8],
    dst: &mut [u8],
    level: i32,
    dict: Option<&Dictionary>,
) -> Result<Option<usize>, CodecError> {
    with_zstd(|z| {
        if z.level != Some(level) {
            z.cctx
                .set_parameter(zstd_safe::CParameter::CompressionLevel(level))
                .map_err(zstd_err)?;
            z.level = Some(level);
        }
        let res = match dict {
            Some(d) => {
                let cdict = d.cdict(level)?;
                z.cctx.ref_cdict(&cdict).map_err(zstd_err)?;
                let r = z.cctx.compress2(dst, input);
                if r.is_err() {
                    // A failed compression leaves the session mid-frame, where zstd refuses
                    // any parameter change, the dictionary's removal included ("Operation not
                    // authorized at current processing stage"): end it first. Before this,
                    // the first page that did not fit left the context refusing every later
                    // dictionary compression on this thread.
                    let _ = z.cctx.reset(zstd_safe::ResetDirective::SessionOnly);
                }
                // Drop the reference before `cdict` can go away: the context must never
                // point at a dictionary it does not own. Should zstd still refuse, a full
                // reset drops it with every parameter, and the base ones are set again.
                if z.cctx.disable_dictionary().is_err() {
                    z.cctx
                        .reset(zstd_safe::ResetDirective::SessionAndParameters)
                        .map_err(zstd_err)?;
                    zstd_base_params(&mut z.cctx)?;
                    z.level = None;
                }
                r
            }
            None => z.cctx.compress2(dst, input),
        };
        match res {
            Ok(n) => Ok(Some(n)),
            Err(code) => {
                // Output did not fit (or any other failure): leave a clean session behind and
                // let the caller store the data raw.
                let _ = z
                    .cctx
                    .reset(zstd_safe::ResetDirective::SessionOnly)
                    .map_err(zstd_err);
                if zstd_safe::get_error_name(code).contains("too small") {
                    Ok(None)
                } else {
                    Err(zstd_err(code))
                }
            }
        }
    })
}

fn zstd_decompress(
    src: &[u8],
    dst: &mut [u8],
    dict: Option<&Dictionary>,
) -> Result<usize, CodecError> {
    if src.is_empty() {
        return Err(CodecError::Truncated("empty zstd payload"));
    }
    with_zstd(|z| {
        let r = match dict {
            Some(d) => z.dctx.decompress_using_ddict(dst, src, d.ddict()),
            None => z.dctx.decompress(dst, src),
        };
        r.map_err(zstd_err)
    })
}

// ---------------------------------------------------------------- deflate

thread_local! {
    static DEFLATE: RefCell<DeflateCtx> = RefCell::new(DeflateCtx::default());
}

#[derive(Default)]
struct DeflateCtx {
    compressors: Vec<(i32, libdeflater::Compressor)>,
    decompressor: Option<libdeflater::Decompressor>,
}

fn deflate_compress(input: &[u8], dst: &mut [u8], level: i32) -> Result<Option<usize>, CodecError> {
    DEFLATE.with(|cell| {
        let mut ctx = cell.borrow_mut();
        let idx = match ctx.compressors.iter().position(|(l, _)| *l == level) {
            Some(i) => i,
            None => {
                let lvl = libdeflater::CompressionLvl::new(level).map_err(|_| {
                    CodecError::InvalidLevel {
                        codec: "deflate",
                        level,
                        min: 0,
                        max: 12,
                    }
                })?;
                ctx.compressors
                    .push((level, libdeflater::Compressor::new(lvl)));
                ctx.compressors.len() - 1
            }
        };
        match ctx.compressors[idx].1.deflate_compress(input, dst) {
            Ok(n) => Ok(Some(n)),
            Err(libdeflater::CompressionError::InsufficientSpace) => Ok(None),
        }
    })
}

fn deflate_decompress(src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
    DEFLATE.with(|cell| {
        let mut ctx = cell.borrow_mut();
        let d = ctx
            .decompressor
            .get_or_insert_with(libdeflater::Decompressor::new);
        d.deflate_decompress(src, dst)
            .map_err(|e| CodecError::Corrupt {
                codec: "deflate",
                reason: format!("{e:?}"),
            })
    })
}

#[cfg(test)]
mod tests;
