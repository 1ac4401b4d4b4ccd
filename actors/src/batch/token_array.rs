//! [`TokenArray`]: a `[rows, cols]` f32 array in host memory, row-major, e.g. per-token
//! log-probs `[B, T-1]`. It is how per-token numbers travel between roles: device-neutral,
//! serializable with serde, and as safetensors bytes for the big arrays. It does no math.

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};

/// Why a batch or array cannot be built or decoded.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The numbers do not fill the shape, or arrays to join disagree.
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        /// Which array.
        what: String,
        /// What was expected.
        expected: String,
        /// What was found.
        got: String,
    },
    /// Safetensors bytes could not be written or read.
    #[error("safetensors: {0}")]
    Safetensors(#[from] safetensors::SafeTensorError),
}

/// `[rows, cols]` f32 values, row-major.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenArray {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl TokenArray {
    /// An array over `data` (row-major); errors when `data` does not hold `rows * cols`.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, BatchError> {
        if data.len() != rows * cols {
            return Err(BatchError::Shape {
                what: "token array".into(),
                expected: format!("[{rows}, {cols}] = {} values", rows * cols),
                got: format!("{} values", data.len()),
            });
        }
        Ok(Self { rows, cols, data })
    }

    /// `[rows, cols]` zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// All values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Row `i`.
    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// The values of a 2-D tensor (any float dtype, any device), as f32 on the host.
    pub fn from_tensor(t: &Tensor) -> candle_core::Result<Self> {
        let (rows, cols) = t.dims2()?;
        let data = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(Self { rows, cols, data })
    }

    /// A `[rows, cols]` f32 tensor of these values on `device`.
    pub fn to_tensor(&self, device: &Device) -> candle_core::Result<Tensor> {
        Tensor::from_slice(&self.data, (self.rows, self.cols), device)
    }

    /// `parts` stacked along rows; all must have the same number of columns.
    pub fn concat_rows(parts: Vec<TokenArray>) -> Result<Self, BatchError> {
        let cols = parts.first().map_or(0, |p| p.cols);
        if let Some(bad) = parts.iter().find(|p| p.cols != cols) {
            return Err(BatchError::Shape {
                what: "row blocks to join".into(),
                expected: format!("{cols} columns"),
                got: format!("{} columns", bad.cols),
            });
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let data = parts.into_iter().flat_map(|p| p.data).collect();
        Ok(Self { rows, cols, data })
    }

    /// Named arrays as one safetensors buffer (F32, little-endian).
    pub fn to_safetensors(named: &[(&str, &TokenArray)]) -> Result<Vec<u8>, BatchError> {
        let bytes: Vec<(&str, [usize; 2], Vec<u8>)> = named
            .iter()
            .map(|(n, a)| {
                let b = a.data.iter().flat_map(|x| x.to_le_bytes()).collect();
                (*n, [a.rows, a.cols], b)
            })
            .collect();
        let views = bytes
            .iter()
            .map(|(n, shape, b)| {
                let v = TensorView::new(Dtype::F32, shape.to_vec(), b);
                v.map(|v| (*n, v))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(safetensors::serialize(views, None)?)
    }

    /// The named arrays of a buffer written by [`TokenArray::to_safetensors`], by name.
    pub fn from_safetensors(bytes: &[u8]) -> Result<Vec<(String, TokenArray)>, BatchError> {
        let st = safetensors::SafeTensors::deserialize(bytes)?;
        let mut out = Vec::new();
        for (name, view) in st.tensors() {
            let (rows, cols) = match (view.dtype(), view.shape()) {
                (Dtype::F32, &[r, c]) => (r, c),
                (dtype, shape) => {
                    return Err(BatchError::Shape {
                        what: name,
                        expected: "a 2-D F32 tensor".into(),
                        got: format!("{dtype:?} {shape:?}"),
                    })
                }
            };
            let data = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            out.push((name, TokenArray::new(rows, cols, data)?));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}
