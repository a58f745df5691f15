//! The GPU context: one stream, the embedded kernels, raw launches, device
//! memory arenas and pinned host buffers.
//!
//! Launches go straight to `cuLaunchKernel` with raw device pointers: the
//! hot path has no per-launch bookkeeping (event tracking is off), which
//! matters for eager prefill steps of several hundred kernels.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::CudaError;

/// A device address.
pub type DevPtr = sys::CUdeviceptr;

/// One kernel argument, passed by value.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    /// A device pointer (0 for null).
    Ptr(DevPtr),
    /// A 32-bit int.
    I32(i32),
    /// A 64-bit int.
    I64(i64),
    /// A float.
    F32(f32),
}

/// The device, its stream and the loaded kernel modules.
#[derive(Clone)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    /// Launch with programmatic stream serialization (sm_90+): each kernel
    /// may start while the previous one drains (the kernels wait in
    /// `pdl_begin` until its writes are visible).
    pdl: bool,
    /// `cuda.check`: synchronize after every launch and name the
    /// kernel that failed (debugging only).
    check_each: bool,
    modules: Vec<(&'static str, Arc<CudaModule>)>,
    /// The shared-memory carveout (percent) set on each kernel loaded
    /// (`cuda.smem_carveout`; `None`: the driver's choice).
    carveout: Option<u8>,
}

impl Gpu {
    /// Opens device `ordinal` and loads the embedded kernels (cubin on
    /// sm_90, PTX elsewhere). `pdl` asks for programmatic dependent launch
    /// (taken on sm_90+ only); `check_each` synchronizes after every launch.
    pub fn open(ordinal: usize, pdl: bool, check_each: bool) -> Result<Self, CudaError> {
        crate::availability()?;
        let ctx = CudaContext::new(ordinal)?;
        // Every buffer lives on one stream; cudarc's per-slice event
        // tracking would only add host work to each launch.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let name = ctx.name()?;
        let cc = ctx.compute_capability()?;
        if cc.0 < 8 {
            return Err(CudaError::Unsupported(format!(
                "{name} has compute capability {}.{}; ingot's kernels need 8.0 or newer",
                cc.0, cc.1
            )));
        }
        let mut modules = Vec::new();
        for m in ingot_kernels_cuda::MODULES {
            let image = if cc == (9, 0) {
                Ptx::from_binary(m.cubin_sm90.to_vec())
            } else {
                Ptx::from_src(m.ptx_compute80)
            };
            modules.push((m.name, ctx.load_module(image)?));
        }
        let pdl = pdl && cc.0 >= 9;
        Ok(Self {
            ctx,
            stream,
            name,
            pdl,
            check_each,
            modules,
            carveout: None,
        })
    }

    /// Sets `percent` of the unified L1 / shared memory as the preferred
    /// shared memory of every kernel loaded from now on (one split for
    /// all, so the SM need not change it between kernels).
    pub fn prefer_shared_memory(&mut self, percent: Option<u8>) {
        self.carveout = percent;
    }

    /// The device's streaming multiprocessors.
    pub fn num_sms(&self) -> Result<usize, CudaError> {
        let n = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(n as usize)
    }

    /// A kernel by name from any loaded module.
    pub fn kernel(&self, name: &str) -> Result<Kernel, CudaError> {
        for (_, m) in &self.modules {
            if let Ok(f) = m.load_function(name) {
                if let Some(percent) = self.carveout {
                    unsafe {
                        result::function::set_function_attribute(
                            f.cu_function(),
                            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                            i32::from(percent),
                        )?
                    };
                }
                return Ok(Kernel {
                    raw: f.cu_function(),
                    name: name.to_string(),
                    _module: m.clone(),
                });
            }
        }
        Err(CudaError::Unsupported(format!(
            "kernel {name} is not in this build"
        )))
    }

    /// Enqueues `kernel` on the stream.
    pub fn launch(
        &self,
        kernel: &Kernel,
        grid: (u32, u32, u32),
        block: u32,
        shared_mem: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let mut values = [0u64; 32];
        let mut params = [std::ptr::null_mut::<c_void>(); 32];
        debug_assert!(args.len() <= values.len());
        for (i, a) in args.iter().enumerate() {
            // Little-endian: a 4-byte argument is read from the first bytes.
            values[i] = match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::I64(v) => v as u64,
                Arg::F32(v) => v.to_bits() as u64,
            };
        }
        for (i, p) in params.iter_mut().enumerate().take(args.len()) {
            *p = &mut values[i] as *mut u64 as *mut c_void;
        }
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: unsafe { std::mem::zeroed() },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared_mem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl),
        };
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                kernel.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()?;
        }
        if self.check_each {
            self.stream.synchronize().map_err(|e| {
                CudaError::Unsupported(format!("kernel {} grid {grid:?} failed: {e}", kernel.name))
            })?;
        }
        Ok(())
    }

    /// The same device, kernels and switches on a new stream of its own.
    pub fn with_own_stream(&self) -> Result<Self, CudaError> {
        Ok(Self {
            stream: self.ctx.new_stream()?,
            ..self.clone()
        })
    }

    /// Waits for all enqueued work.
    pub fn sync(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Enqueues a host-to-device copy. The host memory must stay untouched
    /// until the stream has passed this point (pinned buffers are synced
    /// before reuse by the runner).
    pub fn upload<T>(&self, dst: DevPtr, src: &[T]) -> Result<(), CudaError> {
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream())? };
        Ok(())
    }

    /// Enqueues a device-to-device copy of `bytes` (the ranges must not
    /// overlap).
    pub fn copy_within(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), CudaError> {
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())? };
        Ok(())
    }

    /// Enqueues a device-to-device copy of `rows` rows of `width` bytes,
    /// rows `pitches.0` bytes apart at `dst` and `pitches.1` at `src`
    /// (capturable in a graph).
    pub fn copy_rows(
        &self,
        (dst, src): (DevPtr, DevPtr),
        pitches: (usize, usize),
        width: usize,
        rows: usize,
    ) -> Result<(), CudaError> {
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: pitches.1,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst,
            dstArray: std::ptr::null_mut(),
            dstPitch: pitches.0,
            WidthInBytes: width,
            Height: rows,
        };
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, self.stream.cu_stream()).result()? };
        Ok(())
    }

    /// Enqueues zeroing `bytes` at `dst` (capturable in a graph).
    pub fn zero(&self, dst: DevPtr, bytes: usize) -> Result<(), CudaError> {
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream.cu_stream())? };
        Ok(())
    }

    /// Enqueues a device-to-host copy.
    pub fn download<T>(&self, dst: &mut [T], src: DevPtr) -> Result<(), CudaError> {
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream())? };
        Ok(())
    }
}

/// A loaded kernel; keeps its module alive.
#[derive(Clone)]
pub struct Kernel {
    raw: sys::CUfunction,
    name: String,
    _module: Arc<CudaModule>,
}

impl Kernel {
    /// Allows `bytes` of dynamic shared memory (above the 48 KiB default).
    pub fn allow_shared_memory(&self, bytes: u32) -> Result<(), CudaError> {
        unsafe {
            result::function::set_function_attribute(
                self.raw,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )?
        };
        Ok(())
    }

    /// Blocks of `threads` threads (and its static shared memory) that fit
    /// on one SM at once: grids with grid-wide barriers stay within it.
    pub fn max_resident_blocks(&self, threads: u32) -> Result<usize, CudaError> {
        let mut blocks = 0i32;
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                self.raw,
                threads as i32,
                0,
            )
            .result()?;
        }
        Ok(blocks.max(0) as usize)
    }
}

/// One device allocation handed out in aligned pieces: the weights, the
/// activation workspace and the KV pool each live in one, allocated at
/// start-up, so the hot path never allocates.
///
/// The memory is mapped through the driver's virtual memory API: the
/// address range stays reserved for the arena's life while its physical
/// memory can be given back ([`Arena::unmap`]) and mapped again
/// ([`Arena::remap`]) at the same addresses. That is what lets a sleeping
/// model keep its captured graphs, which hold those addresses.
pub struct Arena {
    base: DevPtr,
    size: usize,
    /// `size` rounded up to the allocation granularity.
    mapped_size: usize,
    /// The physical memory while mapped.
    handle: Option<sys::CUmemGenericAllocationHandle>,
    /// Kept so unmapping works from any thread, and the context outlives
    /// the memory.
    ctx: Arc<CudaContext>,
    device: i32,
    used: usize,
    label: &'static str,
}

const ALIGN: usize = 256;

/// Physical device memory on `device`.
fn device_memory(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; all-zero is its documented default.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop
}

impl Arena {
    /// Reserves and maps `size` bytes on the current context.
    pub fn new(gpu: &Gpu, label: &'static str, size: usize) -> Result<Self, CudaError> {
        gpu.ctx.bind_to_thread()?;
        let device = gpu.ctx.ordinal() as i32;
        let prop = device_memory(device);
        let mut granularity = 0usize;
        // SAFETY: out-pointer to a local; `prop` is initialised above.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
            .result()?;
        }
        let mapped_size = size.max(ALIGN).next_multiple_of(granularity.max(ALIGN));
        let mut base: DevPtr = 0;
        // SAFETY: out-pointer to a local; the range is freed in Drop.
        unsafe { sys::cuMemAddressReserve(&mut base, mapped_size, 0, 0, 0).result()? };
        let mut arena = Self {
            base,
            size,
            mapped_size,
            handle: None,
            ctx: gpu.ctx.clone(),
            device,
            used: 0,
            label,
        };
        arena.remap()?;
        Ok(arena)
    }

    /// Maps physical memory under the arena's addresses again (contents
    /// undefined). A no-op while mapped.
    pub fn remap(&mut self) -> Result<(), CudaError> {
        if self.handle.is_some() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        let prop = device_memory(self.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: out-pointer to a local.
        unsafe { sys::cuMemCreate(&mut handle, self.mapped_size, &prop, 0) }
            .result()
            .map_err(|e| {
                CudaError::OutOfMemory(format!(
                    "cannot allocate {} ({} MiB): {e}",
                    self.label,
                    self.mapped_size >> 20
                ))
            })?;
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was reserved with this size; `handle` is the
        // allocation just made. On failure the handle is released.
        let mapped = unsafe {
            sys::cuMemMap(self.base, self.mapped_size, 0, handle, 0)
                .result()
                .and_then(|()| {
                    sys::cuMemSetAccess(self.base, self.mapped_size, &access, 1).result()
                })
        };
        if let Err(e) = mapped {
            // SAFETY: unmapping a range that may be mapped, then releasing
            // the handle this function created.
            unsafe {
                let _ = sys::cuMemUnmap(self.base, self.mapped_size);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(e.into());
        }
        self.handle = Some(handle);
        Ok(())
    }

    /// Gives the arena's physical memory back to the device, keeping its
    /// addresses reserved. Waits for the device first: unlike `cuMemFree`,
    /// unmapping does not wait for queued kernels that use the memory.
    pub fn unmap(&mut self) -> Result<(), CudaError> {
        let Some(handle) = self.handle.take() else {
            return Ok(());
        };
        self.ctx.bind_to_thread()?;
        // SAFETY: the arena's context is current on this thread; the range
        // is mapped to `handle` (set by `remap`).
        unsafe {
            sys::cuCtxSynchronize().result()?;
            sys::cuMemUnmap(self.base, self.mapped_size).result()?;
            sys::cuMemRelease(handle).result()?;
        }
        Ok(())
    }

    /// Bytes needed for pieces of these sizes (each rounded to the alignment).
    pub fn size_of(pieces: impl IntoIterator<Item = usize>) -> usize {
        pieces.into_iter().map(|b| b.next_multiple_of(ALIGN)).sum()
    }

    /// The next `bytes` of the arena.
    pub fn take(&mut self, bytes: usize) -> Result<DevPtr, CudaError> {
        let bytes = bytes.next_multiple_of(ALIGN);
        if self.used + bytes > self.size {
            return Err(CudaError::OutOfMemory(format!(
                "{} arena of {} bytes is full (asked for {bytes} more after {})",
                self.label, self.size, self.used
            )));
        }
        let p = self.base + self.used as u64;
        self.used += bytes;
        Ok(p)
    }

    /// Bytes reserved.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The first address.
    pub fn base(&self) -> DevPtr {
        self.base
    }

    /// Bytes handed out so far (what a copy of the contents must hold).
    pub fn used(&self) -> usize {
        self.used
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let unmapped = self.ctx.bind_to_thread().map_err(CudaError::from);
        let unmapped = unmapped.and_then(|()| self.unmap());
        // SAFETY: the range was reserved in `new` with this size.
        let freed = unmapped.and_then(|()| {
            unsafe { sys::cuMemAddressFree(self.base, self.mapped_size) }
                .result()
                .map_err(CudaError::from)
        });
        if let Err(e) = freed {
            tracing::warn!(arena = self.label, error = %e, "cannot free device memory");
        }
    }
}

/// Page-locked host memory: copies from it run at full PCIe speed and
/// asynchronously.
pub struct Pinned<T: Copy> {
    ptr: *mut T,
    len: usize,
}

// The buffer is owned memory like a Vec; the runner is used from one thread.
unsafe impl<T: Copy + Send> Send for Pinned<T> {}

impl<T: Copy + Default> Pinned<T> {
    /// `len` zeroed elements.
    pub fn new(gpu: &Gpu, len: usize) -> Result<Self, CudaError> {
        gpu.ctx.bind_to_thread()?;
        let bytes = (len.max(1) * std::mem::size_of::<T>()).max(8);
        let ptr = unsafe { result::malloc_host(bytes, 0)? } as *mut T;
        let mut p = Self { ptr, len };
        p.as_mut_slice().fill(T::default());
        Ok(p)
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[T] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: Copy> Drop for Pinned<T> {
    fn drop(&mut self) {
        if let Err(e) = unsafe { result::free_host(self.ptr as *mut c_void) } {
            tracing::warn!(error = %e, "cannot free pinned host memory");
        }
    }
}
