//! Per-process GPU memory from NVML, loaded at run time (`dlopen("libnvidia-ml.so.1")`), so the
//! binary runs where there is no NVIDIA driver. On GB10 the device totals are `[N/A]` but
//! `nvmlDeviceGetComputeRunningProcesses` works (host PID namespace only; gb10-ops.md §1.2).
//! Buffers are allocated at load; a query allocates nothing.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

type Device = *mut c_void;
type Ret = c_int;
type InitFn = unsafe extern "C" fn() -> Ret;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> Ret;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> Ret;
type ProcsFn = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> Ret;

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// NVML's "value not available".
const NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;
const INSUFFICIENT_SIZE: Ret = 7;
/// Most GPU processes read per device.
const MAX_PROCS: usize = 1024;

/// A loaded, initialised NVML.
pub struct Nvml {
    devices: Vec<Device>,
    get_procs: ProcsFn,
    shutdown: InitFn,
    buf: Vec<ProcessInfo>,
    /// Which entry point answers: `v3` or `v2`.
    pub api: &'static str,
}

// SAFETY: NVML is thread-safe (its documentation: "all NVML functions are thread-safe"); the
// handles are opaque pointers NVML owns, used from one thread at a time through `&mut self`.
unsafe impl Send for Nvml {}

fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> Option<T> {
    // SAFETY: `lib` is a handle from dlopen; dlsym reads a NUL-terminated name.
    let p = unsafe { nix::libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: T is the function-pointer type NVML documents for this symbol (pointer-sized).
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let e = unsafe { nix::libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null dlerror results are NUL-terminated.
        unsafe { CStr::from_ptr(e as *const c_char) }.to_string_lossy().into_owned()
    }
}

/// Why NVML cannot be used (the guard then runs without per-process GPU memory).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    #[error("libnvidia-ml.so.1 not loaded ({0})")]
    NotLoaded(String),
    #[error("libnvidia-ml has no {0}")]
    NoSymbol(&'static str),
    #[error("{call} failed (NVML error {rc})")]
    Call { call: &'static str, rc: Ret },
}

impl Nvml {
    /// Load and initialise NVML; why not, when it cannot be.
    pub fn load() -> Result<Self, NvmlError> {
        // SAFETY: dlopen with a constant, NUL-terminated library name.
        let lib =
            unsafe { nix::libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), nix::libc::RTLD_NOW | nix::libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(NvmlError::NotLoaded(dl_error()));
        }
        let init: InitFn = sym(lib, c"nvmlInit_v2").ok_or(NvmlError::NoSymbol("nvmlInit_v2"))?;
        let shutdown: InitFn = sym(lib, c"nvmlShutdown").ok_or(NvmlError::NoSymbol("nvmlShutdown"))?;
        let count: CountFn = sym(lib, c"nvmlDeviceGetCount_v2").ok_or(NvmlError::NoSymbol("nvmlDeviceGetCount_v2"))?;
        let handle: HandleFn =
            sym(lib, c"nvmlDeviceGetHandleByIndex_v2").ok_or(NvmlError::NoSymbol("nvmlDeviceGetHandleByIndex_v2"))?;
        let (get_procs, api): (ProcsFn, &'static str) = match sym(lib, c"nvmlDeviceGetComputeRunningProcesses_v3") {
            Some(f) => (f, "v3"),
            None => (
                sym(lib, c"nvmlDeviceGetComputeRunningProcesses_v2")
                    .ok_or(NvmlError::NoSymbol("nvmlDeviceGetComputeRunningProcesses_v3/_v2"))?,
                "v2",
            ),
        };
        // SAFETY: documented NVML entry points with the documented signatures.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(NvmlError::Call { call: "nvmlInit_v2", rc });
        }
        let mut n: c_uint = 0;
        // SAFETY: `n` is a valid out-pointer.
        let rc = unsafe { count(&mut n) };
        if rc != 0 {
            // SAFETY: initialised above.
            unsafe { shutdown() };
            return Err(NvmlError::Call { call: "nvmlDeviceGetCount_v2", rc });
        }
        let mut devices = Vec::with_capacity(n as usize);
        for i in 0..n {
            let mut d: Device = std::ptr::null_mut();
            // SAFETY: `d` is a valid out-pointer; `i` < count.
            if unsafe { handle(i, &mut d) } == 0 {
                devices.push(d);
            }
        }
        Ok(Self { devices, get_procs, shutdown, buf: vec![ProcessInfo::default(); MAX_PROCS], api })
    }

    /// Number of devices NVML reports.
    #[must_use]
    pub fn devices(&self) -> usize {
        self.devices.len()
    }

    /// Call `f(pid, bytes)` for every compute process on every device (a process on several
    /// devices is reported once per device). Allocation-free.
    pub fn for_each_process(&mut self, mut f: impl FnMut(i32, u64)) -> Result<(), NvmlError> {
        for &d in &self.devices {
            let mut n = c_uint::try_from(self.buf.len()).unwrap_or(c_uint::MAX);
            // SAFETY: `buf` holds `n` entries of the documented struct; NVML writes at most `n`.
            let rc = unsafe { (self.get_procs)(d, &mut n, self.buf.as_mut_ptr()) };
            if rc != 0 && rc != INSUFFICIENT_SIZE {
                return Err(NvmlError::Call { call: "nvmlDeviceGetComputeRunningProcesses", rc });
            }
            for p in &self.buf[..(n as usize).min(self.buf.len())] {
                let bytes = if p.used_gpu_memory == NOT_AVAILABLE { 0 } else { p.used_gpu_memory };
                f(i32::try_from(p.pid).unwrap_or(0), bytes);
            }
        }
        Ok(())
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: initialised in `load`; the library stays loaded (never dlclosed).
        unsafe { (self.shutdown)() };
    }
}
