//! The CUDA backend, through `cudarc` with the CUDA libraries loaded at run time: the workspace
//! builds, and a worker starts, on machines with no CUDA at all.
//!
//! - [`probe`] looks for the driver, NVRTC and cuBLAS before touching any of them, checks the
//!   driver's version and the device, and turns any failure (a panic inside the loader
//!   included) into an error that says what is missing. [`select`] applies `--device`.
//! - The element-wise kernels are CUDA C in `kernels.cu`, compiled by NVRTC at first use for
//!   the device's compute capability; the PTX is cached in memory per device and on disk
//!   (`$XDG_CACHE_HOME/ps-worker` or `~/.cache/ps-worker`), keyed by the source's hash and the
//!   architecture.
//! - GEMM is cuBLAS (f32). Row-major products are computed as the column-major product of the
//!   transposes: `C^T = op(B)^T op(A)^T`, which is the same memory.
//! - [`compress`] encodes gradients on the device into ps-codec's wire layouts, with the
//!   error-feedback residual kept on the device.
//!
//! Every launch is `unsafe` in cudarc (the kernel's signature is not checked against the
//! arguments); each one says why it is sound next to it. Device errors become
//! [`BackendError::Device`]; nothing here panics on a device failure.

#![allow(unsafe_code)]

pub mod compress;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

use super::{
    Backend, BackendError, Bags, LossSum, Result, Trans, check_bags, check_gemm, check_sigmoid,
    check_softmax, rows_of, same_len, shape_err,
};

/// The kernels' source, compiled at run time.
const KERNELS: &str = include_str!("kernels.cu");

/// Every kernel `kernels.cu` defines.
const KERNEL_NAMES: &[&str] = &[
    "add_row_bias",
    "sum_rows_into",
    "relu",
    "relu_backward",
    "add",
    "scale",
    "softmax_xent",
    "sigmoid_xent",
    "bag_forward",
    "bag_backward",
    "encode_half",
    "block_max_abs",
    "encode_int8",
    "block_mean_abs",
    "encode_sign",
    "magnitude_histogram",
    "count_above",
    "exclusive_scan",
    "compact_above",
    "select_bin",
    "gap_lengths",
    "write_sparse",
    "add_into",
];

/// The oldest driver this backend runs on (CUDA 11.4, the oldest cudarc supports).
const MIN_DRIVER: i32 = 11040;

pub(crate) fn dev_err(what: &str, e: impl std::fmt::Debug) -> BackendError {
    BackendError::Device(format!("{what}: {e:?}"))
}

/// Which compute device a worker uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// CUDA device 0 when one works, else the CPU (with one log line saying why).
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("unknown device `{s}`: auto, cpu, cuda or cuda:N")),
        }
    }
}

/// The backend a [`DeviceChoice`] gives.
#[derive(Debug, Clone)]
pub enum Selected {
    Cpu,
    Cuda(Cuda),
}

/// Applies `--device`: `auto` falls back to the CPU with one log line saying why; asking for
/// CUDA where it does not work is an error with the reason.
pub fn select(choice: DeviceChoice) -> std::result::Result<Selected, String> {
    let cuda = match choice {
        DeviceChoice::Cpu => return Ok(Selected::Cpu),
        DeviceChoice::Cuda(n) => probe(n).map_err(|e| format!("--device cuda:{n}: {e}"))?,
        DeviceChoice::Auto => match probe(0) {
            Ok(c) => c,
            Err(e) => {
                tracing::info!("compute on the CPU: no usable CUDA device ({e})");
                return Ok(Selected::Cpu);
            }
        },
    };
    tracing::info!(device = %cuda.describe(), "compute on CUDA");
    Ok(Selected::Cuda(cuda))
}

/// A CUDA device with its stream, cuBLAS handle and compiled kernels. Cheap to clone.
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
}

struct Inner {
    ordinal: usize,
    name: String,
    capability: (i32, i32),
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    functions: HashMap<&'static str, CudaFunction>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Devices opened so far, by ordinal: a device's kernels are compiled once per process.
fn opened() -> &'static Mutex<HashMap<usize, Cuda>> {
    static OPENED: OnceLock<Mutex<HashMap<usize, Cuda>>> = OnceLock::new();
    OPENED.get_or_init(Default::default)
}

/// Opens CUDA device `ordinal`, or says why it cannot: no driver, a driver too old, no such
/// device, no NVRTC or cuBLAS, kernels that do not compile. Never panics: the loaders' panics
/// (a library or a symbol missing) are caught and reported.
pub fn probe(ordinal: usize) -> std::result::Result<Cuda, String> {
    if let Some(c) = opened().lock().ok().and_then(|m| m.get(&ordinal).cloned()) {
        return Ok(c);
    }
    // SAFETY: these only try to dlopen the libraries by their usual names.
    let present = unsafe {
        [
            (
                cudarc::driver::sys::is_culib_present(),
                "no NVIDIA driver: libcuda.so was not found",
            ),
            (
                cudarc::nvrtc::sys::is_culib_present(),
                "NVRTC (libnvrtc.so) was not found: put the CUDA toolkit's lib64 on LD_LIBRARY_PATH",
            ),
            (
                cudarc::cublas::sys::is_culib_present(),
                "cuBLAS (libcublas.so) was not found: put the CUDA toolkit's lib64 on LD_LIBRARY_PATH",
            ),
        ]
    };
    if let Some((_, why)) = present.iter().find(|(ok, _)| !ok) {
        return Err((*why).to_owned());
    }
    let cuda = catch_quietly(|| open(ordinal))
        .map_err(|msg| format!("the CUDA libraries failed to load: {msg}"))??;
    if let Ok(mut m) = opened().lock() {
        m.insert(ordinal, cuda.clone());
    }
    Ok(cuda)
}

thread_local! {
    /// Set while this thread runs [`catch_quietly`]'s closure.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic inside it (the CUDA loaders panic on a missing library or symbol)
/// into its message, without printing it. Only this thread's panics are silenced: the panic hook
/// is wrapped once, and panics of other threads still reach the hook that was there before.
pub(crate) fn catch_quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static WRAPPED: std::sync::Once = std::sync::Once::new();
    WRAPPED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    outcome.map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown".into())
    })
}

fn open(ordinal: usize) -> std::result::Result<Cuda, String> {
    cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e}"))?;
    let mut version = 0;
    // SAFETY: cuDriverGetVersion writes one int through the pointer it is given.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion failed: {r:?}"));
    }
    if version < MIN_DRIVER {
        return Err(format!(
            "the driver supports CUDA {}.{}, older than the {}.{} this worker needs",
            version / 1000,
            version % 1000 / 10,
            MIN_DRIVER / 1000,
            MIN_DRIVER % 1000 / 10
        ));
    }
    let count = CudaContext::device_count().map_err(|e| format!("counting devices: {e}"))?;
    if ordinal >= count.max(0) as usize {
        return Err(format!("no CUDA device {ordinal}: {count} found"));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("opening device {ordinal}: {e}"))?;
    // SAFETY: every buffer of this context is used on its one stream (`default_stream` below),
    // so the stream's order already separates each buffer's uses and its free; the per-buffer
    // events cudarc would record on every launch are not needed.
    unsafe { ctx.disable_event_tracking() };
    let name = ctx.name().unwrap_or_else(|_| "unknown".into());
    let capability = ctx
        .compute_capability()
        .map_err(|e| format!("reading the compute capability: {e}"))?;
    let stream = ctx.default_stream();
    let ptx = kernels_ptx(capability)?;
    let module = ctx
        .load_module(ptx)
        .map_err(|e| format!("loading the kernels: {e}"))?;
    let mut functions = HashMap::new();
    for &k in KERNEL_NAMES {
        let f = module
            .load_function(k)
            .map_err(|e| format!("kernel `{k}`: {e}"))?;
        functions.insert(k, f);
    }
    let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("creating cuBLAS: {e:?}"))?;
    Ok(Cuda {
        inner: Arc::new(Inner {
            ordinal,
            name,
            capability,
            stream,
            blas,
            functions,
        }),
    })
}

fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("ps-worker"))
}

/// The kernels' PTX for compute capability `cc`: from the disk cache when this source was
/// compiled for it before, else compiled by NVRTC (and cached).
fn kernels_ptx(cc: (i32, i32)) -> std::result::Result<Ptx, String> {
    let hash = ps_core::hash::fnv1a(KERNELS.as_bytes());
    let file = cache_dir().map(|d| d.join(format!("kernels-{hash:016x}-sm{}{}.ptx", cc.0, cc.1)));
    if let Some(src) = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        return Ok(Ptx::from_src(src));
    }
    let ptx = compile_kernels(cc)?;
    if let Some(f) = &file {
        // A cache that cannot be written only costs a compile next time.
        let _ = f
            .parent()
            .map(std::fs::create_dir_all)
            .map(|_| std::fs::write(f, ptx.to_src()));
    }
    Ok(ptx)
}

/// Compiles the kernels with NVRTC for compute capability `cc`. Needs NVRTC, not a GPU.
pub fn compile_kernels(cc: (i32, i32)) -> std::result::Result<Ptx, String> {
    // SAFETY: this only tries to dlopen the library by its usual names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("NVRTC (libnvrtc.so) was not found".into());
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    compile_ptx_with_opts(KERNELS, opts)
        .map_err(|e| format!("NVRTC could not compile the kernels: {e:?}"))
}

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;

/// A grid for `n` independent elements (the kernels stride over the rest).
fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn to_i32(op: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| shape_err(op, format!("{n} is too large for one launch")))
}

impl Cuda {
    /// The device, for logs: its ordinal, name and compute capability.
    pub fn describe(&self) -> String {
        let i = &self.inner;
        format!(
            "cuda:{} ({}, sm_{}{})",
            i.ordinal, i.name, i.capability.0, i.capability.1
        )
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    pub(crate) fn function(&self, name: &'static str) -> Result<&CudaFunction> {
        self.inner
            .functions
            .get(name)
            .ok_or_else(|| BackendError::Device(format!("kernel `{name}` is not loaded")))
    }

    /// Waits for the stream's work; device faults surface here.
    pub fn sync(&self) -> Result<()> {
        self.inner
            .stream
            .synchronize()
            .map_err(|e| dev_err("synchronize", e))
    }

    /// A device copy of a host slice of any plain type.
    pub(crate) fn upload_any<T: cudarc::driver::DeviceRepr>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>> {
        self.inner
            .stream
            .clone_htod(host)
            .map_err(|e| dev_err("upload", e))
    }

    pub(crate) fn download_any<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        src: &CudaSlice<T>,
        len: usize,
    ) -> Result<Vec<T>> {
        let mut host = vec![T::default(); len];
        if len > 0 {
            let view = src.slice(..len);
            self.inner
                .stream
                .memcpy_dtoh(&view, host.as_mut_slice())
                .map_err(|e| dev_err("download", e))?;
            self.sync()?;
        }
        Ok(host)
    }

    pub(crate) fn zeros_any<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>> {
        self.inner
            .stream
            .alloc_zeros(len.max(1))
            .map_err(|e| dev_err("alloc", e))
    }

    /// One launch of an element-wise kernel over `x` with a scalar.
    fn unary(&self, name: &'static str, x: &mut CudaSlice<f32>, alpha: Option<f32>) -> Result<()> {
        let n = x.len() as i64;
        if n == 0 {
            return Ok(());
        }
        let f = self.function(name)?;
        let mut b = self.inner.stream.launch_builder(f);
        b.arg(x);
        if let Some(a) = &alpha {
            b.arg(a);
        }
        b.arg(&n);
        // SAFETY: `relu(float*, long long)` and `scale(float*, float, long long)` read and
        // write x[0..n), n being x's length.
        unsafe { b.launch(grid(n as usize)) }.map_err(|e| dev_err(name, e))?;
        Ok(())
    }

    /// One launch of `x op= y` over equal lengths.
    fn binary(
        &self,
        name: &'static str,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        y_first: bool,
    ) -> Result<()> {
        same_len(name, y.len(), x.len())?;
        let n = x.len() as i64;
        if n == 0 {
            return Ok(());
        }
        let f = self.function(name)?;
        let mut b = self.inner.stream.launch_builder(f);
        if y_first {
            b.arg(y).arg(x);
        } else {
            b.arg(x).arg(y);
        }
        b.arg(&n);
        // SAFETY: `add(float*, const float*, long long)` and `relu_backward(const float*,
        // float*, long long)` touch [0, n) of both buffers, whose lengths were checked equal.
        unsafe { b.launch(grid(n as usize)) }.map_err(|e| dev_err(name, e))?;
        Ok(())
    }
}

/// Host bags uploaded for one launch.
struct DeviceBags {
    offsets: CudaSlice<u32>,
    rows: CudaSlice<u32>,
    weights: CudaSlice<f32>,
}

impl Cuda {
    /// Launches `bag_forward` (table to bags) or `bag_backward` (bags' gradients scattered
    /// into the table): one thread per value of `bags x dim`, over `bags` as checked by
    /// `check_bags` with the table's side and the bags' side.
    fn launch_bags(
        &self,
        kernel: &'static str,
        input: &CudaSlice<f32>,
        dim: usize,
        bags: &Bags,
        output: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if bags.is_empty() {
            return Ok(());
        }
        let d = self.upload_bags(bags)?;
        let (dm, nb) = (to_i32(kernel, dim)?, to_i32(kernel, bags.len())?);
        let f = self.function(kernel)?;
        let mut b = self.inner.stream.launch_builder(f);
        b.arg(input)
            .arg(&dm)
            .arg(&d.offsets)
            .arg(&d.rows)
            .arg(&d.weights)
            .arg(&nb)
            .arg(output);
        // SAFETY: check_bags proved the offsets rise from 0 to rows.len() and every row is
        // < the table's rows, so table[row*dim + d] with d < dim is in bounds, and that the
        // bags' side holds bags*dim values; bag_backward's adds into the table are atomic.
        unsafe { b.launch(grid(bags.len() * dim)) }.map_err(|e| dev_err(kernel, e))?;
        Ok(())
    }

    fn upload_bags(&self, bags: &Bags) -> Result<DeviceBags> {
        Ok(DeviceBags {
            offsets: self.upload_any(&bags.offsets)?,
            rows: self.upload_any(if bags.rows.is_empty() {
                &[0]
            } else {
                &bags.rows
            })?,
            weights: self.upload_any(if bags.weights.is_empty() {
                &[0.0]
            } else {
                &bags.weights
            })?,
        })
    }
}

impl Backend for Cuda {
    type Buf = CudaSlice<f32>;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn zeros(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.inner
            .stream
            .alloc_zeros(len)
            .map_err(|e| dev_err("alloc", e))
    }

    fn upload(&self, host: &[f32]) -> Result<CudaSlice<f32>> {
        if host.is_empty() {
            return self.zeros(0);
        }
        self.upload_any(host)
    }

    fn write(&self, dst: &mut CudaSlice<f32>, host: &[f32]) -> Result<()> {
        same_len("write", host.len(), dst.len())?;
        if host.is_empty() {
            return Ok(());
        }
        self.inner
            .stream
            .memcpy_htod(host, dst)
            .map_err(|e| dev_err("write", e))
    }

    fn download(&self, src: &CudaSlice<f32>, host: &mut [f32]) -> Result<()> {
        same_len("download", host.len(), src.len())?;
        if host.is_empty() {
            return Ok(());
        }
        self.inner
            .stream
            .memcpy_dtoh(src, host)
            .map_err(|e| dev_err("download", e))?;
        self.sync()
    }

    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }

    fn gemm(
        &self,
        ta: Trans,
        tb: Trans,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        beta: f32,
        c: &mut CudaSlice<f32>,
    ) -> Result<()> {
        check_gemm(m, n, k, a.len(), b.len(), c.len())?;
        if m * n == 0 {
            return Ok(());
        }
        if k == 0 {
            return self.scale(c, beta);
        }
        let op = |t: Trans| match t {
            Trans::N => blas_sys::cublasOperation_t::CUBLAS_OP_N,
            Trans::T => blas_sys::cublasOperation_t::CUBLAS_OP_T,
        };
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS sees B's
        // storage as its first operand (n x k after its op) and A's as the second.
        let cfg = GemmConfig {
            transa: op(tb),
            transb: op(ta),
            m: to_i32("gemm", n)?,
            n: to_i32("gemm", m)?,
            k: to_i32("gemm", k)?,
            alpha,
            lda: to_i32("gemm", if tb == Trans::N { n } else { k })?,
            ldb: to_i32("gemm", if ta == Trans::N { k } else { m })?,
            beta,
            ldc: to_i32("gemm", n)?,
        };
        // SAFETY: the lengths were checked against m, n and k above, and the leading
        // dimensions are those of the row-major storage, so cuBLAS reads a[0..m*k),
        // b[0..k*n) and writes c[0..m*n); c is a unique borrow, so it aliases neither input.
        unsafe { self.inner.blas.gemm(cfg, b, a, c) }.map_err(|e| dev_err("gemm", e))
    }

    fn add_row_bias(
        &self,
        x: &mut CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        cols: usize,
    ) -> Result<()> {
        let rows = rows_of("add_row_bias", x.len(), cols)?;
        same_len("add_row_bias", bias.len(), cols)?;
        let (r, c) = (to_i32("add_row_bias", rows)?, to_i32("add_row_bias", cols)?);
        let f = self.function("add_row_bias")?;
        let mut b = self.inner.stream.launch_builder(f);
        b.arg(x).arg(bias).arg(&r).arg(&c);
        // SAFETY: the kernel touches x[0..rows*cols) and bias[0..cols), the checked lengths.
        unsafe { b.launch(grid(rows * cols)) }.map_err(|e| dev_err("add_row_bias", e))?;
        Ok(())
    }

    fn sum_rows_into(
        &self,
        x: &CudaSlice<f32>,
        cols: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let rows = rows_of("sum_rows_into", x.len(), cols)?;
        same_len("sum_rows_into", out.len(), cols)?;
        let (r, c) = (
            to_i32("sum_rows_into", rows)?,
            to_i32("sum_rows_into", cols)?,
        );
        let f = self.function("sum_rows_into")?;
        let mut b = self.inner.stream.launch_builder(f);
        b.arg(x).arg(out).arg(&r).arg(&c);
        // SAFETY: the kernel reads x[0..rows*cols) and updates out[0..cols), the checked
        // lengths.
        unsafe { b.launch(grid(cols)) }.map_err(|e| dev_err("sum_rows_into", e))?;
        Ok(())
    }

    fn relu(&self, x: &mut CudaSlice<f32>) -> Result<()> {
        self.unary("relu", x, None)
    }

    fn relu_backward(&self, y: &CudaSlice<f32>, dy: &mut CudaSlice<f32>) -> Result<()> {
        self.binary("relu_backward", dy, y, true)
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
        self.binary("add", x, y, false)
    }

    fn scale(&self, x: &mut CudaSlice<f32>, alpha: f32) -> Result<()> {
        self.unary("scale", x, Some(alpha))
    }

    fn softmax_xent(
        &self,
        logits: &CudaSlice<f32>,
        labels: &[u32],
        classes: usize,
        scale: f32,
        grad: Option<&mut CudaSlice<f32>>,
    ) -> Result<LossSum> {
        let rows = check_softmax(
            logits.len(),
            labels,
            classes,
            grad.as_deref().map(|g| g.len()),
        )?;
        if rows == 0 {
            return Ok(LossSum::default());
        }
        let d_labels = self.upload_any(labels)?;
        let mut loss = self.zeros_any::<f32>(rows)?;
        let mut correct = self.zeros_any::<u32>(rows)?;
        let (r, c) = (
            to_i32("softmax_xent", rows)?,
            to_i32("softmax_xent", classes)?,
        );
        let null = 0u64;
        let f = self.function("softmax_xent")?;
        let mut b = self.inner.stream.launch_builder(f);
        b.arg(logits).arg(&d_labels).arg(&r).arg(&c).arg(&scale);
        match grad {
            Some(g) => b.arg(g),
            None => b.arg(&null),
        };
        b.arg(&mut loss).arg(&mut correct);
        // SAFETY: one thread per row r < rows reads logits[r*classes..][..classes] and
        // labels[r] (every label checked < classes), and writes loss[r], correct[r] and, when
        // grad is not null, grad[r*classes..][..classes]; all lengths were checked above.
        unsafe { b.launch(grid(rows)) }.map_err(|e| dev_err("softmax_xent", e))?;
        let loss = self.download_any(&loss, rows)?;
        let correct = self.download_any(&correct, rows)?;
        Ok(LossSum {
            loss: loss.iter().map(|&l| f64::from(l)).sum(),
            correct: correct.iter().map(|&c| c as usize).sum(),
        })
    }

    fn sigmoid_xent(
        &self,
        logits: &CudaSlice<f32>,
        labels: &[u32],
        scale: f32,
        grad: Option<&mut CudaSlice<f32>>,
        probs: &mut Vec<f32>,
    ) -> Result<LossSum> {
        let n = logits.len();
        check_sigmoid(n, labels, grad.as_deref().map(|g| g.len()))?;
        probs.clear();
        if n == 0 {
            return Ok(LossSum::default());
        }
        let d_labels = self.upload_any(labels)?;
        let mut loss = self.zeros_any::<f32>(n)?;
        let mut d_probs = self.zeros_any::<f32>(n)?;
        let count = to_i32("sigmoid_xent", n)?;
        let null = 0u64;
        let f = self.function("sigmoid_xent")?;
        let mut b = self.inner.stream.launch_builder(f);
        b.arg(logits).arg(&d_labels).arg(&count).arg(&scale);
        match grad {
            Some(g) => b.arg(g),
            None => b.arg(&null),
        };
        b.arg(&mut loss).arg(&mut d_probs);
        // SAFETY: element i < n reads logits[i], labels[i] and writes loss[i], probs[i] and,
        // when not null, grad[i]; every buffer holds n values (checked above).
        unsafe { b.launch(grid(n)) }.map_err(|e| dev_err("sigmoid_xent", e))?;
        let loss = self.download_any(&loss, n)?;
        *probs = self.download_any(&d_probs, n)?;
        let correct = probs
            .iter()
            .zip(labels)
            .filter(|&(&p, &y)| (p >= 0.5) == (y == 1))
            .count();
        Ok(LossSum {
            loss: loss.iter().map(|&l| f64::from(l)).sum(),
            correct,
        })
    }

    fn bag_forward(
        &self,
        table: &CudaSlice<f32>,
        dim: usize,
        bags: &Bags,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        check_bags("bag_forward", table.len(), dim, bags, out.len())?;
        self.launch_bags("bag_forward", table, dim, bags, out)
    }

    fn bag_backward(
        &self,
        dout: &CudaSlice<f32>,
        dim: usize,
        bags: &Bags,
        dtable: &mut CudaSlice<f32>,
    ) -> Result<()> {
        check_bags("bag_backward", dtable.len(), dim, bags, dout.len())?;
        self.launch_bags("bag_backward", dout, dim, bags, dtable)
    }
}
