//! The AMD runtime: HIP and hipRTC, opened at run time with `libloading` (or, with the opt-in
//! `rocm-link` feature, HIP linked at build time through `hip-runtime-sys`). It runs the same
//! plan, parameter block and kernel source as the NVIDIA runtime.
//!
//! No AMD GPU is reachable from this project's machines: this path is compile-checked (the
//! kernel with hipcc for gfx90a in CI, this file in every `gpu` build) but has never run.

use super::plan::{KernelParams, Target, Variant};
use super::runtime::{Dims, Entry, KernelCache, Runtime, StatusFlag};
use super::source;
use super::tensor_map::TensorMap;
use super::workspace::Workspace;
use crate::error::Error;
use core::ffi::{c_char, c_int, c_uint, c_void};
use std::ffi::CString;
use std::sync::Arc;

type HipError = c_int;
type Stream = *mut c_void;
type Module = *mut c_void;
type Function = *mut c_void;
type Event = *mut c_void;
type Program = *mut c_void;

/// `hipDeviceAttributeMultiprocessorCount` in ROCm 5 and 6 (`hip/hip_runtime_api.h`).
const ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 63;
/// `hipFuncAttributeMaxDynamicSharedMemorySize`.
const FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED: c_int = 8;

/// The HIP and hipRTC entry points the runtime uses.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> HipError,
    device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    device_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    memcpy_htod: unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> HipError,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> HipError,
    stream_create: unsafe extern "C" fn(*mut Stream) -> HipError,
    stream_synchronize: unsafe extern "C" fn(Stream) -> HipError,
    module_load_data: unsafe extern "C" fn(*mut Module, *const c_void) -> HipError,
    module_get_function: unsafe extern "C" fn(*mut Function, Module, *const c_char) -> HipError,
    func_set_attribute: unsafe extern "C" fn(*const c_void, c_int, c_int) -> HipError,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        Function,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Stream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    event_create: unsafe extern "C" fn(*mut Event) -> HipError,
    event_record: unsafe extern "C" fn(Event, Stream) -> HipError,
    event_synchronize: unsafe extern "C" fn(Event) -> HipError,
    event_elapsed: unsafe extern "C" fn(*mut f32, Event, Event) -> HipError,
    rtc_create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    rtc_compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    rtc_log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    rtc_log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    rtc_code_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    rtc_code: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    rtc_destroy: unsafe extern "C" fn(*mut Program) -> c_int,
    _libraries: Vec<libloading::Library>,
}

/// With `rocm-link`, HIP itself is linked at build time (hip-runtime-sys's build script adds
/// libamdhip64); the entry points are declared here with plain integer statuses, so a status
/// HIP adds in a later release is a number rather than an invalid enum value.
#[cfg(feature = "rocm-link")]
mod linked {
    use super::{c_char, c_int, c_uint, c_void, Event, Function, HipError, Module, Stream};
    extern "C" {
        pub fn hipInit(flags: c_uint) -> HipError;
        pub fn hipGetDeviceCount(count: *mut c_int) -> HipError;
        pub fn hipSetDevice(device: c_int) -> HipError;
        pub fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> HipError;
        pub fn hipDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> HipError;
        pub fn hipMalloc(pointer: *mut *mut c_void, bytes: usize) -> HipError;
        pub fn hipFree(pointer: *mut c_void) -> HipError;
        pub fn hipMemcpyHtoD(dst: *mut c_void, src: *const c_void, bytes: usize) -> HipError;
        pub fn hipMemcpyDtoH(dst: *mut c_void, src: *const c_void, bytes: usize) -> HipError;
        pub fn hipStreamCreate(stream: *mut Stream) -> HipError;
        pub fn hipStreamSynchronize(stream: Stream) -> HipError;
        pub fn hipModuleLoadData(module: *mut Module, image: *const c_void) -> HipError;
        pub fn hipModuleGetFunction(function: *mut Function, module: Module, name: *const c_char) -> HipError;
        pub fn hipFuncSetAttribute(function: *const c_void, attribute: c_int, value: c_int) -> HipError;
        #[allow(clippy::too_many_arguments)]
        pub fn hipModuleLaunchKernel(
            f: Function,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: Stream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> HipError;
        pub fn hipEventCreate(event: *mut Event) -> HipError;
        pub fn hipEventRecord(event: Event, stream: Stream) -> HipError;
        pub fn hipEventSynchronize(event: Event) -> HipError;
        pub fn hipEventElapsedTime(ms: *mut f32, start: Event, end: Event) -> HipError;
    }

    // The constants this runtime uses, checked against the linked ROCm's own bindings.
    const _: () = assert!(
        hip_runtime_sys::hipDeviceAttribute_t::hipDeviceAttributeMultiprocessorCount as i32
            == super::ATTRIBUTE_MULTIPROCESSOR_COUNT
    );
    const _: () = assert!(
        hip_runtime_sys::hipFuncAttribute::hipFuncAttributeMaxDynamicSharedMemorySize as i32
            == super::FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED
    );
}

impl Api {
    /// Opens libamdhip64 and libhiprtc (which ROCm 5.2 folds into libamdhip64); with
    /// `rocm-link`, HIP is the linked library and only hipRTC is opened.
    fn load() -> Result<Api, String> {
        let open = |names: &[&str]| -> Result<libloading::Library, String> {
            let mut last = String::new();
            for name in names {
                // SAFETY: loading a shared library runs its initialisers; these are ROCm's own
                // libraries, loaded the way the HIP runtime documents.
                match unsafe { libloading::Library::new(*name) } {
                    Ok(lib) => return Ok(lib),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(format!("none of {names:?} could be opened ({last})"))
        };
        let hip = open(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])?;
        let rtc = open(&["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"]).ok();
        macro_rules! symbol {
            ($lib:expr, $name:expr) => {{
                let name: &[u8] = $name;
                // SAFETY: the symbol is HIP's documented C entry point with the signature of the
                // field it is stored in.
                let s = unsafe { $lib.get(name) }.map_err(|e| format!("{}: {e}", String::from_utf8_lossy(name)))?;
                *s
            }};
        }
        // HIP's own entry points: the linked ones with `rocm-link`, else looked up.
        #[cfg(feature = "rocm-link")]
        macro_rules! hip_fn {
            ($name:ident) => {
                linked::$name
            };
        }
        #[cfg(not(feature = "rocm-link"))]
        macro_rules! hip_fn {
            ($name:ident) => {
                symbol!(hip, concat!(stringify!($name), "\0").as_bytes())
            };
        }
        let rtc_lib = rtc.as_ref().unwrap_or(&hip);
        let api = Api {
            init: hip_fn!(hipInit),
            device_count: hip_fn!(hipGetDeviceCount),
            set_device: hip_fn!(hipSetDevice),
            device_name: hip_fn!(hipDeviceGetName),
            device_attribute: hip_fn!(hipDeviceGetAttribute),
            malloc: hip_fn!(hipMalloc),
            free: hip_fn!(hipFree),
            memcpy_htod: hip_fn!(hipMemcpyHtoD),
            memcpy_dtoh: hip_fn!(hipMemcpyDtoH),
            stream_create: hip_fn!(hipStreamCreate),
            stream_synchronize: hip_fn!(hipStreamSynchronize),
            module_load_data: hip_fn!(hipModuleLoadData),
            module_get_function: hip_fn!(hipModuleGetFunction),
            func_set_attribute: hip_fn!(hipFuncSetAttribute),
            launch: hip_fn!(hipModuleLaunchKernel),
            event_create: hip_fn!(hipEventCreate),
            event_record: hip_fn!(hipEventRecord),
            event_synchronize: hip_fn!(hipEventSynchronize),
            event_elapsed: hip_fn!(hipEventElapsedTime),
            rtc_create: symbol!(rtc_lib, b"hiprtcCreateProgram\0"),
            rtc_compile: symbol!(rtc_lib, b"hiprtcCompileProgram\0"),
            rtc_log_size: symbol!(rtc_lib, b"hiprtcGetProgramLogSize\0"),
            rtc_log: symbol!(rtc_lib, b"hiprtcGetProgramLog\0"),
            rtc_code_size: symbol!(rtc_lib, b"hiprtcGetCodeSize\0"),
            rtc_code: symbol!(rtc_lib, b"hiprtcGetCode\0"),
            rtc_destroy: symbol!(rtc_lib, b"hiprtcDestroyProgram\0"),
            _libraries: [Some(hip), rtc].into_iter().flatten().collect(),
        };
        Ok(api)
    }
}

/// Turns a HIP status into an error naming what failed.
fn check(what: &str, status: HipError) -> Result<(), Error> {
    match status {
        0 => Ok(()),
        2 => Err(Error::Gpu(format!("{what}: out of device memory (hipErrorOutOfMemory)"))),
        code => Err(Error::Gpu(format!("{what}: HIP error {code}"))),
    }
}

/// Device memory; freed on drop.
pub(crate) struct HipBuffer {
    pointer: *mut c_void,
    bytes: usize,
    api: Arc<Api>,
}

impl HipBuffer {
    /// Bytes of the allocation.
    pub fn len(&self) -> usize {
        self.bytes
    }
}

// SAFETY: a device address is a plain number usable from any host thread; HIP's allocation
// functions are thread-safe.
unsafe impl Send for HipBuffer {}
// SAFETY: as above; shared references only read the address.
unsafe impl Sync for HipBuffer {}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from hipMalloc and is freed once. hipFree waits for the
        // device, so queued kernels finish first.
        unsafe { (self.api.free)(self.pointer) };
    }
}

pub(crate) struct Kernels {
    attention: Function,
    merge: Function,
    plan_tiles: Function,
}

// SAFETY: HIP function handles may be launched from any thread.
unsafe impl Send for Kernels {}
// SAFETY: as above.
unsafe impl Sync for Kernels {}

/// One AMD GPU with its stream and compiled kernels.
pub(crate) struct HipDevice {
    api: Arc<Api>,
    stream: Stream,
    name: String,
    multiprocessors: usize,
    kernels: KernelCache<Kernels>,
    /// The workspace, kept between calls.
    workspace: Workspace<HipBuffer>,
    /// The key splits' counters, zeroed when allocated, kept between calls (unused on AMD,
    /// whose splits the merge kernel combines).
    split_counters: Workspace<HipBuffer>,
    status: StatusFlag<HipBuffer>,
}

// SAFETY: the stream handle is used through HIP's thread-safe API only.
unsafe impl Send for HipDevice {}
// SAFETY: as above.
unsafe impl Sync for HipDevice {}

impl HipDevice {
    /// Opens AMD GPU `ordinal`, or says why there is none.
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        let api = Arc::new(Api::load().map_err(|e| Error::NoDevice(format!("the HIP runtime was not found: {e}")))?);
        let mut count: c_int = 0;
        // SAFETY: HIP's documented initialisation and query calls with valid out-pointers.
        let status = unsafe { (api.init)(0) };
        if status != 0 {
            return Err(Error::NoDevice(format!("the HIP runtime found no AMD GPU (hipInit returned {status})")));
        }
        // SAFETY: as above.
        unsafe {
            check("hipGetDeviceCount", (api.device_count)(&mut count)).map_err(|e| Error::NoDevice(e.to_string()))?;
        }
        if count <= ordinal as c_int {
            return Err(Error::NoDevice(format!("AMD GPU {ordinal} was asked for but HIP sees {count}")));
        }
        let mut name = [0 as c_char; 256];
        let mut multiprocessors: c_int = 0;
        let mut stream: Stream = core::ptr::null_mut();
        // SAFETY: valid out-pointers and buffer length; the device ordinal exists.
        unsafe {
            check("hipSetDevice", (api.set_device)(ordinal as c_int))?;
            check("hipDeviceGetName", (api.device_name)(name.as_mut_ptr(), name.len() as c_int, ordinal as c_int))?;
            if (api.device_attribute)(&mut multiprocessors, ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal as c_int) != 0 {
                multiprocessors = 1;
            }
            check("hipStreamCreate", (api.stream_create)(&mut stream))?;
        }
        // SAFETY: hipDeviceGetName wrote a NUL-terminated string into the buffer.
        let name = unsafe { core::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        Ok(HipDevice {
            api,
            stream,
            name,
            multiprocessors: multiprocessors.max(1) as usize,
            kernels: KernelCache::new(),
            workspace: Workspace::new(),
            split_counters: Workspace::new(),
            status: StatusFlag::new(),
        })
    }

    fn compile(&self, variant: &Variant) -> Result<Vec<u8>, Error> {
        let source =
            CString::new(source::kernel_source()).map_err(|_| Error::Gpu("kernel source has a NUL byte".into()))?;
        // No --offload-arch: hipRTC compiles for the current device.
        let options: Vec<CString> = source::hiprtc_options(variant, "")
            .into_iter()
            .filter(|o| !o.starts_with("--offload-arch="))
            .map(|o| CString::new(o).expect("options have no NUL"))
            .collect();
        let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = core::ptr::null_mut();
        // SAFETY: hipRTC's documented program lifecycle with live, NUL-terminated strings and
        // buffers of the sizes it reports.
        unsafe {
            if (self.api.rtc_create)(
                &mut program,
                source.as_ptr(),
                c"attention.hip".as_ptr(),
                0,
                core::ptr::null(),
                core::ptr::null(),
            ) != 0
            {
                return Err(Error::Gpu("hipRTC could not create the program".into()));
            }
            let status = (self.api.rtc_compile)(program, pointers.len() as c_int, pointers.as_ptr());
            let mut result = Ok(());
            if status != 0 {
                let mut size = 0usize;
                (self.api.rtc_log_size)(program, &mut size);
                let mut log = vec![0u8; size.max(1)];
                (self.api.rtc_log)(program, log.as_mut_ptr().cast());
                result = Err(Error::Gpu(format!(
                    "hipRTC could not compile the kernel for {variant:?}: {}",
                    String::from_utf8_lossy(&log)
                )));
            }
            let mut code = Vec::new();
            if result.is_ok() {
                let mut size = 0usize;
                (self.api.rtc_code_size)(program, &mut size);
                code = vec![0u8; size];
                (self.api.rtc_code)(program, code.as_mut_ptr().cast());
            }
            (self.api.rtc_destroy)(&mut program);
            result.map(|()| code)
        }
    }

    /// Compiles `variant` with hipRTC and loads its kernels.
    fn load(&self, variant: Variant) -> Result<Kernels, Error> {
        let code = self.compile(&variant)?;
        let mut module: Module = core::ptr::null_mut();
        let (mut attention, mut merge, mut plan_tiles): (Function, Function, Function) =
            (core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut());
        let name = |entry: Entry| CString::new(entry.name()).expect("kernel names have no NUL");
        let (attention_name, merge_name, plan_name) =
            (name(Entry::Attention), name(Entry::Merge), name(Entry::PlanTiles));
        // SAFETY: `code` is a code object hipRTC produced; the names are NUL-terminated; the
        // attribute call names a function of the loaded module.
        unsafe {
            check("hipModuleLoadData", (self.api.module_load_data)(&mut module, code.as_ptr().cast()))?;
            check(
                "hipModuleGetFunction",
                (self.api.module_get_function)(&mut attention, module, attention_name.as_ptr()),
            )?;
            check("hipModuleGetFunction", (self.api.module_get_function)(&mut merge, module, merge_name.as_ptr()))?;
            check("hipModuleGetFunction", (self.api.module_get_function)(&mut plan_tiles, module, plan_name.as_ptr()))?;
            check(
                "hipFuncSetAttribute",
                (self.api.func_set_attribute)(
                    attention as *const c_void,
                    FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED,
                    variant.shared_bytes() as c_int,
                ),
            )?;
        }
        Ok(Kernels { attention, merge, plan_tiles })
    }
}

impl Runtime for HipDevice {
    type Buffer = HipBuffer;
    type Kernels = Kernels;

    fn name(&self) -> &str {
        &self.name
    }

    fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    fn target(&self) -> Target {
        Target::Mfma
    }

    fn alloc(&self, bytes: usize) -> Result<HipBuffer, Error> {
        let mut pointer = core::ptr::null_mut();
        // SAFETY: hipMalloc writes the new allocation's address into a valid out-pointer.
        unsafe { check("hipMalloc", (self.api.malloc)(&mut pointer, bytes.max(1)))? };
        Ok(HipBuffer { pointer, bytes: bytes.max(1), api: self.api.clone() })
    }

    fn upload(&self, bytes: &[u8]) -> Result<HipBuffer, Error> {
        let buffer = self.alloc(bytes.len())?;
        // SAFETY: the copy reads `bytes.len()` bytes from a live slice into an allocation at
        // least that large.
        unsafe {
            check("hipMemcpyHtoD", (self.api.memcpy_htod)(buffer.pointer, bytes.as_ptr().cast(), bytes.len()))?;
        }
        Ok(buffer)
    }

    fn download(&self, buffer: &HipBuffer, bytes: &mut [u8]) -> Result<(), Error> {
        self.synchronize()?;
        // SAFETY: copies `bytes.len()` bytes, no more than the buffer holds (the caller's
        // element count), into a live mutable slice.
        unsafe {
            check("hipMemcpyDtoH", (self.api.memcpy_dtoh)(bytes.as_mut_ptr().cast(), buffer.pointer, bytes.len()))
        }
    }

    fn write(&self, buffer: &mut HipBuffer, bytes: &[u8]) -> Result<(), Error> {
        // Stream order: hipMemcpyHtoD is synchronous with the null stream, so wait for ours.
        self.synchronize()?;
        // SAFETY: copies `bytes.len()` bytes, no more than the buffer holds (the caller's
        // count), from a live slice.
        unsafe { check("hipMemcpyHtoD", (self.api.memcpy_htod)(buffer.pointer, bytes.as_ptr().cast(), bytes.len())) }
    }

    fn address(&self, buffer: &HipBuffer) -> u64 {
        buffer.pointer as u64
    }

    fn synchronize(&self) -> Result<(), Error> {
        // SAFETY: the stream handle is live for the device's lifetime.
        unsafe { check("hipStreamSynchronize", (self.api.stream_synchronize)(self.stream)) }
    }

    fn time(&self, work: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error> {
        let (mut start, mut end): (Event, Event) = (core::ptr::null_mut(), core::ptr::null_mut());
        let mut ms = 0f32;
        // SAFETY: HIP's documented event calls on live handles and out-pointers.
        unsafe {
            check("hipEventCreate", (self.api.event_create)(&mut start))?;
            check("hipEventCreate", (self.api.event_create)(&mut end))?;
            check("hipEventRecord", (self.api.event_record)(start, self.stream))?;
            work()?;
            check("hipEventRecord", (self.api.event_record)(end, self.stream))?;
            check("hipEventSynchronize", (self.api.event_synchronize)(end))?;
            check("hipEventElapsedTime", (self.api.event_elapsed)(&mut ms, start, end))?;
        }
        Ok(ms)
    }

    fn kernels(&self, variant: Variant) -> Result<Arc<Kernels>, Error> {
        self.kernels.get_or_compile(variant, || self.load(variant))
    }

    fn workspace(&self) -> &Workspace<HipBuffer> {
        &self.workspace
    }

    fn split_counters(&self) -> &Workspace<HipBuffer> {
        &self.split_counters
    }

    fn status(&self) -> &StatusFlag<HipBuffer> {
        &self.status
    }

    unsafe fn launch(
        &self,
        kernels: &Kernels,
        entry: Entry,
        dims: Dims,
        params: &KernelParams,
        _maps: Option<(&[TensorMap; 2], i32)>,
    ) -> Result<(), Error> {
        let (function, what) = match entry {
            Entry::Attention => (kernels.attention, "launching the attention kernel"),
            Entry::Merge => (kernels.merge, "launching the merge kernel"),
            Entry::PlanTiles => (kernels.plan_tiles, "launching the tile-planning kernel"),
        };
        let mut params = *params;
        let mut argument: *mut c_void = (&mut params as *mut KernelParams).cast();
        let (gx, gy, gz) = dims.grid;
        // SAFETY: one kernel argument, the parameter block, which hipModuleLaunchKernel copies
        // before returning; the caller guarantees the addresses in it.
        unsafe {
            check(
                what,
                (self.api.launch)(
                    function,
                    gx,
                    gy,
                    gz,
                    dims.threads as c_uint,
                    1,
                    1,
                    dims.shared_bytes as c_uint,
                    self.stream,
                    &mut argument,
                    core::ptr::null_mut(),
                ),
            )
        }
    }
}
