//! The CUDA driver API, the few calls zmem makes, loaded from `libcuda.so.1` at run time
//! (`ZMEM_CUDA_LIB` overrides). The driver API, not the runtime: the driver ships with every
//! NVIDIA installation, and nvCOMP's own runtime (linked into libnvcomp) shares the device's
//! primary context that zmem makes current here.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::loader::{self, Loaded};
use crate::GpuError;

pub(crate) type CuResult = c_int;
pub(crate) type CuDevice = c_int;
pub(crate) type CuContext = *mut c_void;
/// The same object as the runtime's `cudaStream_t`, which nvCOMP takes.
pub(crate) type CuStream = *mut c_void;
pub(crate) type CuDevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;

/// Function pointers into the driver, valid while `lib` lives.
pub(crate) struct Driver {
    lib: Loaded,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    device_total_mem: unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    primary_ctx_reset: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    memcpy_htod_async:
        unsafe extern "C" fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult,
    error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

// SAFETY: the driver API is thread-safe; the pointers are plain code addresses.
unsafe impl Send for Driver {}
unsafe impl Sync for Driver {}

/// A device as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub memory_bytes: u64,
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
}

impl Driver {
    /// Loads the driver and initialises it.
    pub(crate) fn load() -> Result<Driver, GpuError> {
        let lib = loader::open(
            "the NVIDIA driver's CUDA library",
            "ZMEM_CUDA_LIB",
            &["libcuda.so.1", "libcuda.so"],
            &[],
            "this machine has no NVIDIA driver",
        )?;
        // SAFETY: each type below is the function's signature in cuda.h (the _v2 names are
        // the ones cuda.h maps the plain names to).
        let d = unsafe {
            Driver {
                init: lib.func("cuInit")?,
                driver_version: lib.func("cuDriverGetVersion")?,
                device_count: lib.func("cuDeviceGetCount")?,
                device_get: lib.func("cuDeviceGet")?,
                device_name: lib.func("cuDeviceGetName")?,
                device_total_mem: lib.func("cuDeviceTotalMem_v2")?,
                primary_ctx_retain: lib.func("cuDevicePrimaryCtxRetain")?,
                primary_ctx_release: lib.func("cuDevicePrimaryCtxRelease_v2")?,
                primary_ctx_reset: lib.func("cuDevicePrimaryCtxReset_v2")?,
                ctx_set_current: lib.func("cuCtxSetCurrent")?,
                stream_create: lib.func("cuStreamCreate")?,
                stream_destroy: lib.func("cuStreamDestroy_v2")?,
                stream_synchronize: lib.func("cuStreamSynchronize")?,
                mem_alloc: lib.func("cuMemAlloc_v2")?,
                mem_free: lib.func("cuMemFree_v2")?,
                mem_host_alloc: lib.func("cuMemHostAlloc")?,
                mem_free_host: lib.func("cuMemFreeHost")?,
                memcpy_htod_async: lib.func("cuMemcpyHtoDAsync_v2")?,
                memcpy_dtoh_async: lib.func("cuMemcpyDtoHAsync_v2")?,
                error_name: lib.func("cuGetErrorName")?,
                lib,
            }
        };
        // SAFETY: cuInit takes flags, 0 is the only defined value.
        d.check("cuInit", unsafe { (d.init)(0) })?;
        Ok(d)
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.lib.path
    }

    /// `Err(Cuda)` with the driver's name for a failed call's result.
    pub(crate) fn check(&self, call: &'static str, r: CuResult) -> Result<(), GpuError> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string or fails.
        let name = if unsafe { (self.error_name)(r, &mut s) } == CUDA_SUCCESS && !s.is_null() {
            // SAFETY: a NUL-terminated static string of the driver.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        } else {
            "unknown".into()
        };
        Err(GpuError::Cuda {
            call,
            code: r,
            name,
        })
    }

    /// The device at `ordinal`, described.
    pub(crate) fn device(&self, ordinal: usize) -> Result<(CuDevice, DeviceInfo), GpuError> {
        let mut count = 0;
        // SAFETY: out-parameters of the right types, here and below.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_count)(&mut count)
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(GpuError::NoDevice {
                ordinal,
                count: count.max(0) as usize,
            });
        }
        let mut dev = 0;
        self.check("cuDeviceGet", unsafe {
            (self.device_get)(&mut dev, ordinal as c_int)
        })?;
        let mut name = [0 as c_char; 256];
        self.check("cuDeviceGetName", unsafe {
            (self.device_name)(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        let mut mem = 0usize;
        self.check("cuDeviceTotalMem", unsafe {
            (self.device_total_mem)(&mut mem, dev)
        })?;
        let mut version = 0;
        self.check("cuDriverGetVersion", unsafe {
            (self.driver_version)(&mut version)
        })?;
        // SAFETY: the driver NUL-terminates within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok((
            dev,
            DeviceInfo {
                ordinal,
                name,
                memory_bytes: mem as u64,
                driver_version: version,
            },
        ))
    }

    pub(crate) fn retain_primary(&self, dev: CuDevice) -> Result<CuContext, GpuError> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: an out-parameter and a device handle from `device`.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.primary_ctx_retain)(&mut ctx, dev)
        })?;
        Ok(ctx)
    }

    pub(crate) fn release_primary(&self, dev: CuDevice) {
        // SAFETY: paired with a successful retain.
        let _ = unsafe { (self.primary_ctx_release)(dev) };
    }

    /// Destroys the primary context and everything in it (after a sticky error, the only way
    /// back); the next retain makes a fresh one.
    pub(crate) fn reset_primary(&self, dev: CuDevice) -> Result<(), GpuError> {
        // SAFETY: a device handle from `device`.
        self.check("cuDevicePrimaryCtxReset", unsafe {
            (self.primary_ctx_reset)(dev)
        })
    }

    pub(crate) fn set_current(&self, ctx: CuContext) -> Result<(), GpuError> {
        // SAFETY: a context this driver returned.
        self.check("cuCtxSetCurrent", unsafe { (self.ctx_set_current)(ctx) })
    }

    pub(crate) fn stream(&self) -> Result<CuStream, GpuError> {
        let mut s = std::ptr::null_mut();
        // SAFETY: flag 1 is CU_STREAM_NON_BLOCKING (no implicit sync with the null stream).
        self.check("cuStreamCreate", unsafe { (self.stream_create)(&mut s, 1) })?;
        Ok(s)
    }

    pub(crate) fn destroy_stream(&self, s: CuStream) {
        // SAFETY: a stream from `stream`, destroyed once.
        let _ = unsafe { (self.stream_destroy)(s) };
    }

    pub(crate) fn sync(&self, s: CuStream) -> Result<(), GpuError> {
        // SAFETY: a live stream.
        self.check("cuStreamSynchronize", unsafe {
            (self.stream_synchronize)(s)
        })
    }

    pub(crate) fn alloc(&self, bytes: usize) -> Result<CuDevicePtr, GpuError> {
        let mut p = 0;
        // SAFETY: an out-parameter.
        self.check("cuMemAlloc", unsafe { (self.mem_alloc)(&mut p, bytes) })?;
        Ok(p)
    }

    pub(crate) fn free(&self, p: CuDevicePtr) {
        // SAFETY: memory from `alloc`, freed once.
        let _ = unsafe { (self.mem_free)(p) };
    }

    /// Page-locked host memory (DMA goes straight to and from it).
    pub(crate) fn alloc_host(&self, bytes: usize) -> Result<*mut u8, GpuError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-parameter; flag 0 = plain pinned memory for the current context.
        self.check("cuMemHostAlloc", unsafe {
            (self.mem_host_alloc)(&mut p, bytes, 0)
        })?;
        Ok(p.cast())
    }

    pub(crate) fn free_host(&self, p: *mut u8) {
        // SAFETY: memory from `alloc_host`, freed once.
        let _ = unsafe { (self.mem_free_host)(p.cast()) };
    }

    /// # Safety
    /// `src..src+bytes` is readable until the stream is synchronised; `dst` is device memory
    /// of at least `bytes`.
    pub(crate) unsafe fn to_device(
        &self,
        dst: CuDevicePtr,
        src: *const u8,
        bytes: usize,
        s: CuStream,
    ) -> Result<(), GpuError> {
        // SAFETY: as the caller promises.
        self.check("cuMemcpyHtoDAsync", unsafe {
            (self.memcpy_htod_async)(dst, src.cast(), bytes, s)
        })
    }

    /// # Safety
    /// `dst..dst+bytes` is writable and not read until the stream is synchronised.
    pub(crate) unsafe fn to_host(
        &self,
        dst: *mut u8,
        src: CuDevicePtr,
        bytes: usize,
        s: CuStream,
    ) -> Result<(), GpuError> {
        // SAFETY: as the caller promises.
        self.check("cuMemcpyDtoHAsync", unsafe {
            (self.memcpy_dtoh_async)(dst.cast(), src, bytes, s)
        })
    }
}
