//! CUDA side of the fused ops (feature `cuda`): the kernel sources in `src/cuda/*.cu`,
//! compiled once per process with NVRTC, loaded per device through candle's module cache,
//! and launched on candle's stream. f32 only; no nvcc is involved at build time.

use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, Result};

/// Shared reductions, prepended to every module (NVRTC is given no include paths).
const COMMON: &str = include_str!("../cuda/common.cuh");

/// Threads per block for every launch (the block reductions need a multiple of 32).
const BLOCK: u32 = 256;

/// One `.cu` source and its PTX, compiled on first use.
struct KernelModule {
    /// Module name in candle's per-device cache (must be unique across the process).
    name: &'static str,
    source: &'static str,
    ptx: OnceLock<std::result::Result<String, cudarc::nvrtc::CompileError>>,
}

impl KernelModule {
    const fn new(name: &'static str, source: &'static str) -> Self {
        Self {
            name,
            source,
            ptx: OnceLock::new(),
        }
    }

    fn ptx(&self) -> Result<&str> {
        let compiled = self.ptx.get_or_init(|| {
            let src = format!("{COMMON}\n{}", self.source);
            cudarc::nvrtc::compile_ptx(src).map(|ptx| ptx.to_src())
        });
        match compiled {
            Ok(ptx) => Ok(ptx.as_str()),
            Err(e) => Err(candle_core::Error::Cuda(
                format!("NVRTC failed to compile kernel module {}: {e:?}", self.name).into(),
            )),
        }
    }
}

static TOKEN_LOGPROBS: KernelModule = KernelModule::new(
    "oxalign_token_logprobs",
    include_str!("../cuda/token_logprobs.cu"),
);
static ENTROPY: KernelModule =
    KernelModule::new("oxalign_entropy", include_str!("../cuda/entropy.cu"));
static RMS_NORM: KernelModule =
    KernelModule::new("oxalign_rms_norm", include_str!("../cuda/rms_norm.cu"));
static ROPE: KernelModule = KernelModule::new("oxalign_rope", include_str!("../cuda/rope.cu"));

/// Compiles every kernel module with NVRTC now rather than on first use (start-up warm-up;
/// needs libnvrtc but no GPU). Returns each module's name and PTX size in bytes.
pub fn compile_cuda_kernels() -> Result<Vec<(&'static str, usize)>> {
    [&TOKEN_LOGPROBS, &ENTROPY, &RMS_NORM, &ROPE]
        .into_iter()
        .map(|m| Ok((m.name, m.ptx()?.len())))
        .collect()
}

/// The contiguous device view a layout covers.
fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, T>> {
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!("{what} must be contiguous on CUDA (the wrappers call .contiguous())");
    };
    Ok(s.as_cuda_slice::<T>()?.slice(start..end))
}

fn row_config(rows: usize) -> Result<LaunchConfig> {
    let Ok(grid) = u32::try_from(rows) else {
        candle_core::bail!("too many rows ({rows}) for one CUDA launch");
    };
    Ok(LaunchConfig {
        grid_dim: (grid.max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn module_for(fn_name: &str) -> &'static KernelModule {
    if fn_name.starts_with("token_logprobs") {
        &TOKEN_LOGPROBS
    } else {
        &ENTROPY
    }
}

fn wrap(
    dev: &CudaDevice,
    slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
) -> CudaStorage {
    CudaStorage::wrap_cuda_slice(slice, dev.clone())
}

/// Row-wise softmax statistics forward (`token_logprobs_fwd_f32`, `entropy_fwd_f32`):
/// logits `[rows, vocab]` (+ targets `[rows]` u32) -> `[rows]`.
pub(crate) fn softmax_rows_fwd(
    fn_name: &str,
    logits: &CudaStorage,
    l_logits: &Layout,
    targets: Option<(&CudaStorage, &Layout)>,
    vocab: usize,
) -> Result<CudaStorage> {
    let dev = &logits.device;
    let rows = l_logits.shape().elem_count() / vocab.max(1);
    let z = view::<f32>(logits, l_logits, "logits")?;
    let module = module_for(fn_name);
    let func = dev.get_or_load_custom_func(fn_name, module.name, module.ptx()?)?;
    // SAFETY: every element is written by the kernel (one block per row).
    let out = unsafe { dev.alloc::<f32>(rows) }?;
    if rows == 0 {
        return Ok(wrap(dev, out));
    }
    let y = match targets {
        Some((s, l)) => Some(view::<u32>(s, l, "targets")?),
        None => None,
    };
    let mut b = func.builder();
    b.arg(&z);
    if let Some(y) = &y {
        b.arg(y);
    }
    b.arg(&out);
    b.arg(&vocab);
    // SAFETY: argument list matches the kernel signature in cuda/*.cu.
    unsafe { b.launch(row_config(rows)?) }.w()?;
    Ok(wrap(dev, out))
}

/// Row-wise softmax backward (`token_logprobs_bwd_f32`, `entropy_bwd_f32`):
/// logits `[rows, vocab]` (+ targets), grad `[rows]` -> grad_logits `[rows, vocab]`.
pub(crate) fn softmax_rows_bwd(
    fn_name: &str,
    logits: &CudaStorage,
    l_logits: &Layout,
    targets: Option<(&CudaStorage, &Layout)>,
    grad: &CudaStorage,
    l_grad: &Layout,
    vocab: usize,
) -> Result<CudaStorage> {
    let dev = &logits.device;
    let n = l_logits.shape().elem_count();
    let rows = n / vocab.max(1);
    let z = view::<f32>(logits, l_logits, "logits")?;
    let g = view::<f32>(grad, l_grad, "grad")?;
    let module = module_for(fn_name);
    let func = dev.get_or_load_custom_func(fn_name, module.name, module.ptx()?)?;
    // SAFETY: every element is written by the kernel.
    let out = unsafe { dev.alloc::<f32>(n) }?;
    if rows == 0 {
        return Ok(wrap(dev, out));
    }
    let y = match targets {
        Some((s, l)) => Some(view::<u32>(s, l, "targets")?),
        None => None,
    };
    let mut b = func.builder();
    b.arg(&z);
    if let Some(y) = &y {
        b.arg(y);
    }
    b.arg(&g);
    b.arg(&out);
    b.arg(&vocab);
    // SAFETY: argument list matches the kernel signature in cuda/*.cu.
    unsafe { b.launch(row_config(rows)?) }.w()?;
    Ok(wrap(dev, out))
}

/// `rms_norm_fwd_f32`: x `[rows, dim]`, weight `[dim]` -> y `[rows, dim]`.
pub(crate) fn rms_norm_fwd(
    x: &CudaStorage,
    l_x: &Layout,
    w: &CudaStorage,
    l_w: &Layout,
    eps: f64,
) -> Result<CudaStorage> {
    let dev = &x.device;
    let dim = l_w.shape().elem_count();
    let n = l_x.shape().elem_count();
    let rows = n / dim.max(1);
    let xv = view::<f32>(x, l_x, "x")?;
    let wv = view::<f32>(w, l_w, "weight")?;
    let func = dev.get_or_load_custom_func("rms_norm_fwd_f32", RMS_NORM.name, RMS_NORM.ptx()?)?;
    // SAFETY: every element is written by the kernel.
    let out = unsafe { dev.alloc::<f32>(n) }?;
    if rows == 0 {
        return Ok(wrap(dev, out));
    }
    let eps = eps as f32;
    let mut b = func.builder();
    b.arg(&xv);
    b.arg(&wv);
    b.arg(&out);
    b.arg(&dim);
    b.arg(&eps);
    // SAFETY: argument list matches cuda/rms_norm.cu.
    unsafe { b.launch(row_config(rows)?) }.w()?;
    Ok(wrap(dev, out))
}

/// `rms_norm_bwd_x_f32`: x, weight, grad_y -> grad_x `[rows, dim]`.
pub(crate) fn rms_norm_bwd_x(
    x: &CudaStorage,
    l_x: &Layout,
    w: &CudaStorage,
    l_w: &Layout,
    g: &CudaStorage,
    l_g: &Layout,
    eps: f64,
) -> Result<CudaStorage> {
    let dev = &x.device;
    let dim = l_w.shape().elem_count();
    let n = l_x.shape().elem_count();
    let rows = n / dim.max(1);
    let xv = view::<f32>(x, l_x, "x")?;
    let wv = view::<f32>(w, l_w, "weight")?;
    let gv = view::<f32>(g, l_g, "grad")?;
    let func = dev.get_or_load_custom_func("rms_norm_bwd_x_f32", RMS_NORM.name, RMS_NORM.ptx()?)?;
    // SAFETY: every element is written by the kernel.
    let out = unsafe { dev.alloc::<f32>(n) }?;
    if rows == 0 {
        return Ok(wrap(dev, out));
    }
    let eps = eps as f32;
    let mut b = func.builder();
    b.arg(&xv);
    b.arg(&wv);
    b.arg(&gv);
    b.arg(&out);
    b.arg(&dim);
    b.arg(&eps);
    // SAFETY: argument list matches cuda/rms_norm.cu.
    unsafe { b.launch(row_config(rows)?) }.w()?;
    Ok(wrap(dev, out))
}

/// Weight gradient `[dim]` from x and grad_y `[rows, dim]`, in three launches: per-row
/// inverse RMS, per-chunk column sums, then the chunks summed in order (deterministic).
pub(crate) fn rms_norm_bwd_w(
    x: &CudaStorage,
    l_x: &Layout,
    g: &CudaStorage,
    l_g: &Layout,
    eps: f64,
) -> Result<CudaStorage> {
    let dev = &x.device;
    let dim = l_x.dims().last().copied().unwrap_or(1);
    let n = l_x.shape().elem_count();
    let rows = n / dim.max(1);
    if rows == 0 {
        return Ok(wrap(dev, dev.alloc_zeros::<f32>(dim)?));
    }
    let xv = view::<f32>(x, l_x, "x")?;
    let gv = view::<f32>(g, l_g, "grad")?;
    let ptx = RMS_NORM.ptx()?;
    let eps = eps as f32;

    // SAFETY: one value per row, all written.
    let rinv = unsafe { dev.alloc::<f32>(rows) }?;
    let func = dev.get_or_load_custom_func("rms_norm_rinv_f32", RMS_NORM.name, ptx)?;
    let mut b = func.builder();
    b.arg(&xv);
    b.arg(&rinv);
    b.arg(&dim);
    b.arg(&eps);
    // SAFETY: argument list matches cuda/rms_norm.cu.
    unsafe { b.launch(row_config(rows)?) }.w()?;

    let n_chunks = rows.clamp(1, 64);
    let rows_per_chunk = rows.div_ceil(n_chunks);
    let col_blocks = u32::try_from(dim.div_ceil(BLOCK as usize))
        .map_err(|_| candle_core::Error::Msg(format!("dim {dim} too large")))?;
    // SAFETY: every (chunk, column) is written.
    let partial = unsafe { dev.alloc::<f32>(n_chunks * dim) }?;
    let func = dev.get_or_load_custom_func("rms_norm_bwd_w_partial_f32", RMS_NORM.name, ptx)?;
    let mut b = func.builder();
    b.arg(&xv);
    b.arg(&gv);
    b.arg(&rinv);
    b.arg(&partial);
    b.arg(&rows);
    b.arg(&dim);
    b.arg(&rows_per_chunk);
    let cfg = LaunchConfig {
        grid_dim: (col_blocks, n_chunks as u32, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument list matches cuda/rms_norm.cu.
    unsafe { b.launch(cfg) }.w()?;

    // SAFETY: every column is written.
    let dw = unsafe { dev.alloc::<f32>(dim) }?;
    let func = dev.get_or_load_custom_func("rms_norm_bwd_w_reduce_f32", RMS_NORM.name, ptx)?;
    let mut b = func.builder();
    b.arg(&partial);
    b.arg(&dw);
    b.arg(&n_chunks);
    b.arg(&dim);
    let cfg = LaunchConfig {
        grid_dim: (col_blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument list matches cuda/rms_norm.cu.
    unsafe { b.launch(cfg) }.w()?;
    Ok(wrap(dev, dw))
}

/// `rope_f32`: x `[B,H,T,D]`, cos/sin `[T, D/2]` or `[B, T, D/2]` -> `[B,H,T,D]`.
pub(crate) fn rope(
    x: &CudaStorage,
    l_x: &Layout,
    cos: &CudaStorage,
    l_cos: &Layout,
    sin: &CudaStorage,
    l_sin: &Layout,
    inverse: bool,
) -> Result<CudaStorage> {
    let dev = &x.device;
    let (b_sz, h, t, d) = l_x.shape().dims4()?;
    let n = b_sz * h * t * d;
    let xv = view::<f32>(x, l_x, "x")?;
    let cv = view::<f32>(cos, l_cos, "cos")?;
    let sv = view::<f32>(sin, l_sin, "sin")?;
    let func = dev.get_or_load_custom_func("rope_f32", ROPE.name, ROPE.ptx()?)?;
    // SAFETY: every element is written by the kernel.
    let out = unsafe { dev.alloc::<f32>(n) }?;
    let pairs = n / 2;
    if pairs == 0 {
        return Ok(wrap(dev, out));
    }
    let per_batch = i32::from(l_cos.dims().len() == 3);
    let inverse = i32::from(inverse);
    let blocks = pairs.div_ceil(BLOCK as usize).min(65_535 * 8) as u32;
    let mut b = func.builder();
    b.arg(&xv);
    b.arg(&cv);
    b.arg(&sv);
    b.arg(&out);
    b.arg(&b_sz);
    b.arg(&h);
    b.arg(&t);
    b.arg(&d);
    b.arg(&per_batch);
    b.arg(&inverse);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument list matches cuda/rope.cu; the kernel loops grid-stride.
    unsafe { b.launch(cfg) }.w()?;
    Ok(wrap(dev, out))
}
