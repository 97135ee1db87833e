//! Gradient compression on the device: the codec runs where the gradient is, and only the
//! encoded payload crosses to the host. The payloads are ps-codec's wire layouts (the same
//! bytes a host [`ps_codec::Encoder`] writes, up to the rounding of a block's mean for sign and
//! the ties of top-k), so shards decode them like any other.
//!
//! - fp16 / bf16: one cast kernel.
//! - int8 / sign: a per-block scale kernel (max or mean magnitude), then the quantizer.
//! - top-k: the k-th largest magnitude by two 4096-bin histogram passes over the magnitude
//!   bits (each walked down from the top by one block on the device), then an ordered
//!   compaction (tile counts, one scan, a ballot-ordered write) of every entry at or above it:
//!   indices come out ascending, as the wire wants them, with no sort. The wire layout (values,
//!   then the index gaps as varints) is written on the device too, so an encode waits for the
//!   device twice: for the payload's length, then for the payload. Every buffer it needs is
//!   kept from one encode to the next.
//!
//! With error feedback the residual lives on the device: each encode adds it to the gradient
//! and the quantizer writes back what the payload did not carry. QSGD and random-k are not
//! device codecs: [`DeviceCompressor::encode`] says so, and the caller encodes on the host.

use bytes::Bytes;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use ps_codec::{Codec, Compression, Encoded, Encoding, Header, SparseValues};

use super::{Cuda, dev_err, grid, to_i32};
use crate::backend::{Backend, BackendError, Result};

const HIST_BINS: usize = 4096;
const TILE: usize = 4096;
const SCAN_THREADS: u32 = 1024;
/// One block of SCAN_THREADS threads: the scans and select_bin.
const ONE_BLOCK: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (SCAN_THREADS, 1, 1),
    shared_mem_bytes: 0,
};
/// The longest LEB128 varint of a u32 index gap.
const MAX_VARINT: usize = 5;

/// Sender-side compression state of one dense tensor on the device.
pub struct DeviceCompressor {
    cuda: Cuda,
    len: usize,
    /// What earlier payloads did not carry (error feedback), when kept.
    residual: Option<CudaSlice<f32>>,
    /// The gradient plus the residual, encoded this step.
    acc: CudaSlice<f32>,
    /// Top-k's buffers, made at its first encode and grown when k grows.
    topk: Option<TopkScratch>,
}

/// The device buffers of one top-k encode, kept across steps (allocations and their frees
/// would otherwise cost more than the kernels at small sizes).
struct TopkScratch {
    /// The two histograms (top 12 bits, next 12 bits).
    hist: [CudaSlice<u32>; 2],
    /// select_bin's results: the top bin, the keys still needed in it, the threshold key.
    sel: CudaSlice<u32>,
    /// Kept entries per tile, and their exclusive prefix sums (plus the total).
    counts: CudaSlice<u32>,
    offsets: CudaSlice<u32>,
    /// At most `cap` kept entries: their indices and values.
    cap: usize,
    idx: CudaSlice<u32>,
    vals: CudaSlice<f32>,
    /// Each kept entry's varint length and their prefix sums (plus the total).
    lens: CudaSlice<u32>,
    var_offsets: CudaSlice<u32>,
    /// The payload (at most cap * (4 + 5) bytes), and [kept, payload bytes].
    out: CudaSlice<u8>,
    meta: CudaSlice<u32>,
}

impl TopkScratch {
    fn new(cuda: &Cuda, tiles: usize, cap: usize) -> Result<Self> {
        Ok(Self {
            hist: [cuda.zeros_any(HIST_BINS)?, cuda.zeros_any(HIST_BINS)?],
            sel: cuda.zeros_any(4)?,
            counts: cuda.zeros_any(tiles)?,
            offsets: cuda.zeros_any(tiles + 1)?,
            cap,
            idx: cuda.zeros_any(cap)?,
            vals: cuda.zeros_any(cap)?,
            lens: cuda.zeros_any(cap)?,
            var_offsets: cuda.zeros_any(cap + 1)?,
            out: cuda.zeros_any(cap * (4 + MAX_VARINT))?,
            meta: cuda.zeros_any(2)?,
        })
    }
}

impl std::fmt::Debug for DeviceCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCompressor")
            .field("len", &self.len)
            .field("error_feedback", &self.residual.is_some())
            .finish()
    }
}

/// Whether `codec` runs on the device.
pub fn on_device(codec: &Codec) -> bool {
    matches!(
        codec,
        Codec::F32
            | Codec::F16
            | Codec::Bf16
            | Codec::Int8 { .. }
            | Codec::Sign { .. }
            | Codec::TopK { .. }
    )
}

impl DeviceCompressor {
    /// State for a tensor of `len` values; `error_feedback` keeps a residual.
    pub fn new(cuda: &Cuda, len: usize, error_feedback: bool) -> Result<Self> {
        Ok(Self {
            cuda: cuda.clone(),
            len,
            residual: if error_feedback {
                Some(cuda.zeros(len)?)
            } else {
                None
            },
            acc: cuda.zeros(len)?,
            topk: None,
        })
    }

    /// The residual as host values (for tests and checkpoints).
    pub fn residual(&self) -> Result<Option<Vec<f32>>> {
        self.residual
            .as_ref()
            .map(|r| self.cuda.download_any(r, self.len))
            .transpose()
    }

    /// Encodes `grad` (plus the residual) with `codec`; updates the residual on the device.
    pub fn encode(&mut self, grad: &CudaSlice<f32>, codec: &Codec) -> Result<Encoded> {
        if grad.len() != self.len {
            return Err(crate::backend::shape_err(
                "device encode",
                format!("{} values for a tensor of {}", grad.len(), self.len),
            ));
        }
        if !on_device(codec) {
            return Err(BackendError::Device(format!(
                "{codec} has no device encoder; encode it on the host"
            )));
        }
        let stream = self.cuda.stream().clone();
        let n = self.len;
        match &self.residual {
            Some(r) if n > 0 => {
                let count = n as i64;
                let f = self.cuda.function("add_into")?;
                let mut b = stream.launch_builder(f);
                b.arg(grad).arg(r).arg(&mut self.acc).arg(&count);
                // SAFETY: element i < n reads grad[i] and residual[i] and writes acc[i]; the
                // three hold n values (grad's length was checked above).
                unsafe { b.launch(grid(n)) }.map_err(|e| dev_err("add_into", e))?;
            }
            _ => stream
                .memcpy_dtod(grad, &mut self.acc)
                .map_err(|e| dev_err("copy", e))?,
        }
        let header = |encoding, block_size, num_entries| Header {
            encoding,
            num_values: n as u64,
            block_size,
            levels: 0,
            num_entries,
            compression: Compression::None,
            raw_len: 0,
        };
        let encoded = match *codec {
            Codec::F32 => {
                let data = self.cuda.download_any(&self.acc, n)?;
                if let Some(r) = &mut self.residual {
                    stream.memset_zeros(r).map_err(|e| dev_err("memset", e))?;
                }
                Encoded {
                    header: header(Encoding::F32, 0, 0),
                    data: Bytes::from(bytemuck::cast_slice::<f32, u8>(&data).to_vec()),
                }
            }
            Codec::F16 | Codec::Bf16 => {
                let kind: i32 = i32::from(*codec == Codec::Bf16);
                let mut out = self.cuda.zeros_any::<u16>(n)?;
                let count = n as i64;
                let null = 0u64;
                let f = self.cuda.function("encode_half")?;
                let mut b = stream.launch_builder(f);
                b.arg(&self.acc).arg(&count).arg(&kind).arg(&mut out);
                match &mut self.residual {
                    Some(r) => b.arg(r),
                    None => b.arg(&null),
                };
                // SAFETY: element i < n reads acc[i] and writes out[i] and residual[i] (when
                // not null); each buffer holds n values.
                unsafe { b.launch(grid(n)) }.map_err(|e| dev_err("encode_half", e))?;
                let bits = self.cuda.download_any(&out, n)?;
                let encoding = if kind == 0 {
                    Encoding::F16
                } else {
                    Encoding::Bf16
                };
                Encoded {
                    header: header(encoding, 0, 0),
                    data: Bytes::from(bytemuck::cast_slice::<u16, u8>(&bits).to_vec()),
                }
            }
            Codec::Int8 { block } | Codec::Sign { block } => {
                let int8 = matches!(codec, Codec::Int8 { .. });
                let bs = block.max(1) as usize;
                let nb = n.div_ceil(bs);
                let mut scales = self.cuda.zeros_any::<f32>(nb)?;
                let count = n as i64;
                let block_i = to_i32("encode", bs)?;
                let f = self.cuda.function(if int8 {
                    "block_max_abs"
                } else {
                    "block_mean_abs"
                })?;
                let mut b = stream.launch_builder(f);
                b.arg(&self.acc).arg(&count).arg(&block_i).arg(&mut scales);
                let per_block = LaunchConfig {
                    grid_dim: (
                        u32::try_from(nb).map_err(|_| dev_err("encode", "too many blocks"))?,
                        1,
                        1,
                    ),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: grid block j reads acc[j*block..min((j+1)*block, n)) and writes
                // scales[j], j < nb = ceil(n / block).
                unsafe { b.launch(per_block) }.map_err(|e| dev_err("block scales", e))?;
                let out_len = if int8 { n } else { n.div_ceil(8) };
                let mut out = self.cuda.zeros_any::<u8>(out_len)?;
                let null = 0u64;
                let f = self
                    .cuda
                    .function(if int8 { "encode_int8" } else { "encode_sign" })?;
                let mut b = stream.launch_builder(f);
                b.arg(&self.acc)
                    .arg(&count)
                    .arg(&block_i)
                    .arg(&scales)
                    .arg(&mut out);
                match &mut self.residual {
                    Some(r) => b.arg(r),
                    None => b.arg(&null),
                };
                // SAFETY: int8: element i < n reads acc[i], scales[i / block] and writes
                // out[i], residual[i]; sign: byte j < ceil(n/8) covers values 8j..8j+8 (< n)
                // and writes out[j]. Every buffer was sized for those ranges.
                unsafe { b.launch(grid(out_len)) }.map_err(|e| dev_err("quantize", e))?;
                let mut data =
                    bytemuck::cast_slice::<f32, u8>(&self.cuda.download_any(&scales, nb)?).to_vec();
                data.extend(self.cuda.download_any(&out, out_len)?);
                Encoded {
                    header: header(
                        if int8 { Encoding::Int8 } else { Encoding::Sign },
                        bs as u32,
                        0,
                    ),
                    data: Bytes::from(data),
                }
            }
            Codec::TopK { ratio, values } => {
                let k = Codec::entries(ratio, n);
                let f16 = values == SparseValues::F16;
                let (kept, data) = self.top_k(k, f16)?;
                let encoding = if f16 {
                    Encoding::SparseF16
                } else {
                    Encoding::SparseF32
                };
                Encoded {
                    header: header(encoding, 0, kept as u64),
                    data: Bytes::from(data),
                }
            }
            _ => unreachable!("on_device was checked"),
        };
        Ok(encoded)
    }

    /// The top-k payload (ps-codec's sparse layout) of the entries at or above the k-th
    /// largest magnitude, and how many it holds; the residual keeps the rest.
    fn top_k(&mut self, k: usize, f16: bool) -> Result<(usize, Vec<u8>)> {
        let n = self.len;
        if k == 0 || n == 0 {
            return Ok((0, Vec::new()));
        }
        let tiles = n.div_ceil(TILE);
        // Ties in the last bin can pass a few more than k; send them too (up to 2k).
        let cap = 2 * k.min(n);
        if self.topk.as_ref().is_none_or(|t| t.cap < cap) {
            self.topk = Some(TopkScratch::new(&self.cuda, tiles, cap)?);
        }
        let (cuda, acc, residual) = (&self.cuda, &self.acc, &mut self.residual);
        let Some(s) = self.topk.as_mut() else {
            return Err(dev_err("top-k", "no scratch buffers"));
        };
        let stream = cuda.stream().clone();
        let count = n as i64;
        let cap_u = u32::try_from(cap).map_err(|_| dev_err("top-k", "k is too large"))?;
        let k_u = cap_u / 2;
        if k >= n {
            // Everything is sent: threshold key 0.
            stream
                .memset_zeros(&mut s.sel)
                .map_err(|e| dev_err("memset", e))?;
        } else {
            let hist_cfg = LaunchConfig {
                grid_dim: (n.div_ceil(256 * 16).clamp(1, 1024) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let null = 0u64;
            for stage in 0..2i32 {
                let hist = &mut s.hist[stage as usize];
                stream
                    .memset_zeros(hist)
                    .map_err(|e| dev_err("memset", e))?;
                let f = cuda.function("magnitude_histogram")?;
                let mut b = stream.launch_builder(f);
                b.arg(acc).arg(&count);
                if stage == 0 {
                    b.arg(&null);
                } else {
                    b.arg(&s.sel);
                }
                b.arg(&mut *hist);
                // SAFETY: the kernel reads acc[0..n) and sel[0] (written by select_bin's
                // stage 0 before this launch on the same stream) and adds into hist[0..4096)
                // (a 12-bit bin).
                unsafe { b.launch(hist_cfg) }.map_err(|e| dev_err("histogram", e))?;
                let f = cuda.function("select_bin")?;
                let mut b = stream.launch_builder(f);
                b.arg(&*hist).arg(&k_u).arg(&stage).arg(&mut s.sel);
                // SAFETY: one block of 1024 threads, each reading four of the 4096 bins;
                // sel holds 4 values, of which stage 0 writes [0] and [1], stage 1 reads [0],
                // [1] and writes [2].
                unsafe { b.launch(ONE_BLOCK) }.map_err(|e| dev_err("select_bin", e))?;
            }
        }
        let tiles_cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(tiles).map_err(|_| dev_err("top-k", "too many tiles"))?,
                1,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = cuda.function("count_above")?;
        let mut b = stream.launch_builder(f);
        b.arg(acc).arg(&count).arg(&s.sel).arg(&mut s.counts);
        // SAFETY: tile t reads acc[t*TILE..min((t+1)*TILE, n)) and sel[2], and writes
        // counts[t], t < tiles.
        unsafe { b.launch(tiles_cfg) }.map_err(|e| dev_err("count_above", e))?;
        let tiles_i = to_i32("top-k", tiles)?;
        scan(cuda, &s.counts, tiles_i, &mut s.offsets)?;
        let f16_i = i32::from(f16);
        let null = 0u64;
        let f = cuda.function("compact_above")?;
        let mut b = stream.launch_builder(f);
        b.arg(acc)
            .arg(&count)
            .arg(&s.sel)
            .arg(&s.offsets)
            .arg(&cap_u)
            .arg(&f16_i)
            .arg(&mut s.idx)
            .arg(&mut s.vals);
        match residual {
            Some(r) => b.arg(r),
            None => b.arg(&null),
        };
        // SAFETY: tile t reads acc over its range, sel[2] and offsets[t]; kept entries go to
        // slots offsets[t] + rank < cap, the size of idx and vals; residual (when not null) is
        // written at the tile's own indices < n.
        unsafe { b.launch(tiles_cfg) }.map_err(|e| dev_err("compact_above", e))?;
        let f = cuda.function("gap_lengths")?;
        let mut b = stream.launch_builder(f);
        b.arg(&s.idx)
            .arg(&s.offsets)
            .arg(&tiles_i)
            .arg(&cap_u)
            .arg(&mut s.lens);
        // SAFETY: entry j < cap reads idx[j] and idx[j - 1] (j < kept <= cap, written by
        // compact_above) and offsets[tiles], and writes lens[j]; lens holds cap values.
        unsafe { b.launch(grid(cap)) }.map_err(|e| dev_err("gap_lengths", e))?;
        let cap_i = to_i32("top-k", cap)?;
        scan(cuda, &s.lens, cap_i, &mut s.var_offsets)?;
        let f = cuda.function("write_sparse")?;
        let mut b = stream.launch_builder(f);
        b.arg(&s.idx)
            .arg(&s.vals)
            .arg(&s.offsets)
            .arg(&tiles_i)
            .arg(&cap_u)
            .arg(&f16_i)
            .arg(&s.var_offsets)
            .arg(&mut s.out)
            .arg(&mut s.meta);
        // SAFETY: entry j < kept <= cap reads idx[j], idx[j - 1], vals[j], var_offsets[j] and
        // writes kept * (2 or 4) value bytes and its varint (<= 5 bytes) after them: at most
        // cap * 9 bytes, out's size; thread 0 writes meta[0..2).
        unsafe { b.launch(grid(cap)) }.map_err(|e| dev_err("write_sparse", e))?;
        let meta = cuda.download_any(&s.meta, 2)?;
        let (kept, bytes) = (meta[0] as usize, meta[1] as usize);
        if kept > cap || bytes > cap * (4 + MAX_VARINT) {
            return Err(dev_err(
                "top-k",
                format!("the device reported {kept} entries in {bytes} bytes"),
            ));
        }
        Ok((kept, cuda.download_any(&s.out, bytes)?))
    }
}

/// Exclusive prefix sums of `counts[0..len)` into `offsets[0..=len]` (the total last), by
/// one block.
fn scan(
    cuda: &Cuda,
    counts: &CudaSlice<u32>,
    len: i32,
    offsets: &mut CudaSlice<u32>,
) -> Result<()> {
    let f = cuda.function("exclusive_scan")?;
    let mut b = cuda.stream().launch_builder(f);
    b.arg(counts).arg(&len).arg(offsets);
    // SAFETY: one block reads counts[0..len) and writes offsets[0..=len); the callers'
    // buffers hold len and len + 1 values.
    unsafe { b.launch(ONE_BLOCK) }.map_err(|e| dev_err("exclusive_scan", e))?;
    Ok(())
}
