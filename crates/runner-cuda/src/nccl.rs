//! NCCL, loaded at run time: the few calls tensor parallelism makes (one
//! communicator per GPU made together, in-place all-reduce, all-gather).
//!
//! cudarc's NCCL bindings look for `libnccl.so` and CUDA-versioned names,
//! not NCCL's soname `libnccl.so.2` that the system and PyTorch packages
//! install, so the library is opened here: `INGOT_NCCL_LIBRARY` (a path)
//! first, then `libnccl.so.2`, then `libnccl.so`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::device::DevPtr;
use crate::CudaError;

type Comm = *mut c_void;
type Stream = *mut c_void;
type Status = c_int;

/// `ncclFloat32` of `ncclDataType_t`.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSum` of `ncclRedOp_t`.
const NCCL_SUM: c_int = 0;

struct Api {
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Status,
    destroy: unsafe extern "C" fn(Comm) -> Status,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Status,
}

const SONAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

fn open() -> Result<Api, String> {
    let mut names: Vec<String> = std::env::var("INGOT_NCCL_LIBRARY").into_iter().collect();
    names.extend(SONAMES.iter().map(|s| s.to_string()));
    let mut tried = Vec::new();
    for name in &names {
        // SAFETY: loading NCCL runs only its (side-effect-free) initialisers.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return symbols(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => tried.push(format!("{name} ({e})")),
        }
    }
    Err(format!(
        "cannot load NCCL (tried {}); install NCCL 2 (Debian/Ubuntu: libnccl2) or set INGOT_NCCL_LIBRARY to libnccl.so.2's path",
        tried.join(", ")
    ))
}

fn symbols(lib: libloading::Library) -> Result<Api, libloading::Error> {
    // SAFETY: the signatures are NCCL 2's (nccl.h), stable since 2.0.
    unsafe {
        Ok(Api {
            version: *lib.get(b"ncclGetVersion\0")?,
            error_string: *lib.get(b"ncclGetErrorString\0")?,
            init_all: *lib.get(b"ncclCommInitAll\0")?,
            destroy: *lib.get(b"ncclCommDestroy\0")?,
            all_reduce: *lib.get(b"ncclAllReduce\0")?,
            all_gather: *lib.get(b"ncclAllGather\0")?,
            _lib: lib,
        })
    }
}

fn api() -> Result<&'static Api, CudaError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(open)
        .as_ref()
        .map_err(|e| CudaError::Nccl(e.clone()))
}

fn check(status: Status, what: &str) -> Result<(), CudaError> {
    if status == 0 {
        return Ok(());
    }
    let text = api()
        .ok()
        .map(|a| unsafe { CStr::from_ptr((a.error_string)(status)) })
        .map_or_else(
            || format!("error {status}"),
            |s| s.to_string_lossy().into_owned(),
        );
    Err(CudaError::Nccl(format!("{what}: {text}")))
}

/// NCCL's version as `major.minor.patch`, or why it cannot be loaded.
pub fn version() -> Result<String, CudaError> {
    let api = api()?;
    let mut v: c_int = 0;
    check(unsafe { (api.version)(&mut v) }, "ncclGetVersion")?;
    // Since 2.9: major * 10000 + minor * 100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

/// One rank's communicator. Each is used by one thread at a time (its
/// rank's); the handle is a pointer NCCL allows to move between threads.
pub struct Communicator {
    comm: Comm,
    /// This rank, `0..` the group's size.
    pub rank: usize,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time.
unsafe impl Send for Communicator {}
unsafe impl Sync for Communicator {}

impl Communicator {
    /// One communicator per GPU of `devices` (ordinals), rank `i` on
    /// `devices[i]`, made together in this thread.
    pub fn for_devices(devices: &[usize]) -> Result<Vec<Self>, CudaError> {
        let api = api()?;
        let list: Vec<c_int> = devices.iter().map(|&d| d as c_int).collect();
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
        let n = devices.len() as c_int;
        check(
            unsafe { (api.init_all)(comms.as_mut_ptr(), n, list.as_ptr()) },
            "ncclCommInitAll",
        )?;
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| Self { comm, rank })
            .collect())
    }

    /// Enqueues the in-place sum over ranks of `count` f32 at `buf` on
    /// `stream` (capturable in a CUDA graph).
    pub fn all_reduce_sum_f32(
        &self,
        buf: DevPtr,
        count: usize,
        stream: Stream,
    ) -> Result<(), CudaError> {
        let api = api()?;
        let p = buf as *mut c_void;
        let status =
            unsafe { (api.all_reduce)(p, p, count, NCCL_FLOAT32, NCCL_SUM, self.comm, stream) };
        check(status, "ncclAllReduce")
    }

    /// Enqueues the all-gather of each rank's `count` f32 at `send` into
    /// `recv` (`size * count`, rank-major) on `stream`.
    pub fn all_gather_f32(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        stream: Stream,
    ) -> Result<(), CudaError> {
        let api = api()?;
        let status = unsafe {
            (api.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                NCCL_FLOAT32,
                self.comm,
                stream,
            )
        };
        check(status, "ncclAllGather")
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // Nothing to report to at drop; a failed destroy leaks its buffers.
            let _ = unsafe { (api.destroy)(self.comm) };
        }
    }
}

#[cfg(test)]
mod tests {
    /// Where NCCL is installed its version loads; where it is not (CI),
    /// the error names the package and the override.
    #[test]
    fn nccl_loads_or_says_how_to_get_it() {
        match super::version() {
            Ok(v) => assert!(v.starts_with("2."), "{v}"),
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("cannot load NCCL") && m.contains("libnccl.so.2 ("),
                    "{m}"
                );
                assert!(
                    m.contains("libnccl2") && m.contains("INGOT_NCCL_LIBRARY"),
                    "{m}"
                );
            }
        }
    }
}
