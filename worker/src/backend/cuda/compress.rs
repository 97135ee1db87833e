//! Gradient compression on the device: the codec runs where the gradient is, and only the
//! encoded payload crosses to the host. The payloads are ps-codec's wire layouts (the same
//! bytes a host [`ps_codec::Encoder`] writes, up to the rounding of a block's mean for sign and
//! the ties of top-k), so shards decode them like any other.
//!
//! - fp16 / bf16: one cast kernel.
//! - int8 / sign: a per-block scale kernel (max or mean magnitude), then the quantizer.
//! - top-k: the k-th largest magnitude by two 4096-bin histogram passes over the magnitude
//!   bits (the host walks the 16 KiB of counts), then an ordered compaction (tile counts, one
//!   scan, a ballot-ordered write) of every entry at or above it: indices come out ascending,
//!   as the wire wants them, with no sort.
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

/// Sender-side compression state of one dense tensor on the device.
pub struct DeviceCompressor {
    cuda: Cuda,
    len: usize,
    /// What earlier payloads did not carry (error feedback), when kept.
    residual: Option<CudaSlice<f32>>,
    /// The gradient plus the residual, encoded this step.
    acc: CudaSlice<f32>,
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
        stream
            .memcpy_dtod(grad, &mut self.acc)
            .map_err(|e| dev_err("copy", e))?;
        if let Some(r) = &self.residual {
            self.cuda.add(&mut self.acc, r)?;
        }
        let n = self.len;
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
                let (idx, vals) = self.top_k(k, f16)?;
                let encoding = if f16 {
                    Encoding::SparseF16
                } else {
                    Encoding::SparseF32
                };
                let mut data = Vec::new();
                ps_codec::sparse::encode_entries(&idx, &vals, encoding, &mut data);
                Encoded {
                    header: header(encoding, 0, idx.len() as u64),
                    data: Bytes::from(data),
                }
            }
            _ => unreachable!("on_device was checked"),
        };
        Ok(encoded)
    }

    /// A histogram pass over the magnitude keys: the top 12 bits, or with `prefix` the next
    /// 12 bits of the keys whose top 12 bits are `prefix`.
    fn histogram(&self, prefix: i32) -> Result<Vec<u32>> {
        let stream = self.cuda.stream();
        let mut hist = self.cuda.zeros_any::<u32>(HIST_BINS)?;
        let count = self.len as i64;
        let f = self.cuda.function("magnitude_histogram")?;
        let mut b = stream.launch_builder(f);
        b.arg(&self.acc).arg(&count).arg(&prefix).arg(&mut hist);
        let cfg = LaunchConfig {
            grid_dim: (self.len.div_ceil(256 * 16).clamp(1, 1024) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads acc[0..n) and adds into hist[0..4096) (a 12-bit bin).
        unsafe { b.launch(cfg) }.map_err(|e| dev_err("histogram", e))?;
        self.cuda.download_any(&hist, HIST_BINS)
    }

    /// The ascending indices and values of the entries at or above the k-th largest
    /// magnitude; the residual keeps the rest.
    fn top_k(&mut self, k: usize, f16: bool) -> Result<(Vec<u32>, Vec<f32>)> {
        let n = self.len;
        if k == 0 || n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        // Walk the bins down from the largest until k keys are covered.
        let find = |hist: &[u32], mut need: usize| -> (usize, usize) {
            for bin in (0..HIST_BINS).rev() {
                let c = hist[bin] as usize;
                if c >= need {
                    return (bin, need);
                }
                need -= c;
            }
            (0, need)
        };
        let threshold = if k >= n {
            0
        } else {
            let (top, need) = find(&self.histogram(-1)?, k);
            let (low, _) = find(&self.histogram(top as i32)?, need);
            ((top as u32) << 19) | ((low as u32) << 7)
        };
        let stream = self.cuda.stream().clone();
        let tiles = n.div_ceil(TILE);
        let count = n as i64;
        let mut counts = self.cuda.zeros_any::<u32>(tiles)?;
        let mut offsets = self.cuda.zeros_any::<u32>(tiles + 1)?;
        let tiles_cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(tiles).map_err(|_| dev_err("top-k", "too many tiles"))?,
                1,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = self.cuda.function("count_above")?;
        let mut b = stream.launch_builder(f);
        b.arg(&self.acc)
            .arg(&count)
            .arg(&threshold)
            .arg(&mut counts);
        // SAFETY: tile t reads acc[t*TILE..min((t+1)*TILE, n)) and writes counts[t].
        unsafe { b.launch(tiles_cfg) }.map_err(|e| dev_err("count_above", e))?;
        let tiles_i = to_i32("top-k", tiles)?;
        let f = self.cuda.function("exclusive_scan")?;
        let mut b = stream.launch_builder(f);
        b.arg(&counts).arg(&tiles_i).arg(&mut offsets);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (SCAN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block reads counts[0..tiles) and writes offsets[0..=tiles).
        unsafe { b.launch(one) }.map_err(|e| dev_err("exclusive_scan", e))?;
        let total = self.cuda.download_any(&offsets, tiles + 1)?[tiles] as usize;
        // Ties in the last bin can pass a few more than k; send them too (up to 2k).
        let cap = total.min(2 * k).max(1);
        let mut idx = self.cuda.zeros_any::<u32>(cap)?;
        let mut vals = self.cuda.zeros_any::<f32>(cap)?;
        let cap_u = cap as u32;
        let f16_i = i32::from(f16);
        let null = 0u64;
        let f = self.cuda.function("compact_above")?;
        let mut b = stream.launch_builder(f);
        b.arg(&self.acc)
            .arg(&count)
            .arg(&threshold)
            .arg(&offsets)
            .arg(&cap_u)
            .arg(&f16_i)
            .arg(&mut idx)
            .arg(&mut vals);
        match &mut self.residual {
            Some(r) => b.arg(r),
            None => b.arg(&null),
        };
        // SAFETY: tile t reads acc over its range and offsets[t]; kept entries go to slots
        // offsets[t] + rank < cap, the size of idx and vals; residual (when not null) is
        // written at the tile's own indices < n.
        unsafe { b.launch(tiles_cfg) }.map_err(|e| dev_err("compact_above", e))?;
        let kept = total.min(cap);
        Ok((
            self.cuda.download_any(&idx, kept)?,
            self.cuda.download_any(&vals, kept)?,
        ))
    }
}
