//! The numeric payload of one call message as one safetensors buffer. [`Blob`] gathers named
//! arrays — `f32` numbers and `u32` token ids, little-endian, the ids in the narrowest of
//! `U8`, `U16`, `U32` that holds their largest value (a byte tokenizer's ids take one byte,
//! a 50k vocabulary's two) — and [`Tensors`] reads them back, checking each tensor's dtype
//! and shape against what the field needs and refusing a missing or an extra one. Rows of different lengths (prompts, responses) travel as one
//! 1-D tensor `NAME` of all values and `NAME.lens` (`U32 [rows]`). A message without arrays
//! has an empty buffer. Not here: which fields are arrays (`arrays.rs`).

use super::error::TensorError;
use crate::batch::TokenArray;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::BTreeSet;

/// Named arrays on their way into a safetensors buffer.
#[derive(Default)]
pub(crate) struct Blob {
    entries: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
}

impl Blob {
    /// Adds `f32` values of `shape`.
    pub(crate) fn f32(&mut self, name: String, shape: Vec<usize>, data: &[f32]) {
        let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.entries.push((name, Dtype::F32, shape, bytes));
    }

    /// Adds `u32` values of `shape`, in the narrowest unsigned dtype that holds them.
    pub(crate) fn u32(&mut self, name: String, shape: Vec<usize>, data: &[u32]) {
        let max = data.iter().copied().max().unwrap_or(0);
        let (dtype, bytes) = if max <= u32::from(u8::MAX) {
            (Dtype::U8, data.iter().map(|&x| x as u8).collect())
        } else if max <= u32::from(u16::MAX) {
            let b = data
                .iter()
                .flat_map(|&x| (x as u16).to_le_bytes())
                .collect();
            (Dtype::U16, b)
        } else {
            (
                Dtype::U32,
                data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        };
        self.entries.push((name, dtype, shape, bytes));
    }

    /// Adds rows of `u32` as `name` (all values) and `name.lens`.
    pub(crate) fn ragged_u32<'a>(&mut self, name: &str, rows: impl Iterator<Item = &'a [u32]>) {
        let (values, lens) = flatten(rows);
        self.u32(format!("{name}.lens"), vec![lens.len()], &lens);
        self.u32(name.to_string(), vec![values.len()], &values);
    }

    /// Adds rows of `f32` as `name` (all values) and `name.lens`.
    pub(crate) fn ragged_f32<'a>(&mut self, name: &str, rows: impl Iterator<Item = &'a [f32]>) {
        let (values, lens) = flatten(rows);
        self.u32(format!("{name}.lens"), vec![lens.len()], &lens);
        self.f32(name.to_string(), vec![values.len()], &values);
    }

    /// The safetensors buffer (empty without arrays).
    pub(crate) fn into_bytes(self) -> Result<Vec<u8>, TensorError> {
        if self.entries.is_empty() {
            return Ok(Vec::new());
        }
        let views = self
            .entries
            .iter()
            .map(|(n, dtype, shape, b)| {
                TensorView::new(*dtype, shape.clone(), b).map(|v| (n.as_str(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(TensorError::Write)?;
        safetensors::serialize(views, None).map_err(TensorError::Write)
    }
}

fn flatten<'a, T: Copy + 'a>(rows: impl Iterator<Item = &'a [T]>) -> (Vec<T>, Vec<u32>) {
    let mut values = Vec::new();
    let mut lens = Vec::new();
    for r in rows {
        values.extend_from_slice(r);
        lens.push(r.len() as u32);
    }
    (values, lens)
}

/// What a field holds.
#[derive(Clone, Copy)]
enum Kind {
    /// `F32` numbers.
    F32,
    /// Unsigned ids or lengths (`U8`, `U16` or `U32`).
    Ids,
}

/// The tensors of a received buffer, taken one field at a time.
pub(crate) struct Tensors<'a> {
    st: Option<SafeTensors<'a>>,
    taken: BTreeSet<String>,
}

/// `[n]`, or any length when `n` is `None`.
fn dims(n: Option<usize>) -> String {
    n.map_or_else(|| "[n]".into(), |n| format!("[{n}]"))
}

impl<'a> Tensors<'a> {
    /// Parses `bytes` (empty = no tensors).
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self, TensorError> {
        let st = match bytes.is_empty() {
            true => None,
            false => Some(SafeTensors::deserialize(bytes).map_err(TensorError::Malformed)?),
        };
        Ok(Self {
            st,
            taken: BTreeSet::new(),
        })
    }

    /// The view of `name` after checking its dtype is one of `kind`'s.
    fn view(&mut self, name: &str, kind: Kind) -> Result<TensorView<'a>, TensorError> {
        let missing = || TensorError::Missing { name: name.into() };
        let view = self.st.as_ref().ok_or_else(missing)?;
        let view = view.tensor(name).map_err(|_| missing())?;
        let fits = match kind {
            Kind::F32 => view.dtype() == Dtype::F32,
            Kind::Ids => matches!(view.dtype(), Dtype::U8 | Dtype::U16 | Dtype::U32),
        };
        if !fits {
            return Err(TensorError::Dtype {
                name: name.into(),
                expected: match kind {
                    Kind::F32 => "F32",
                    Kind::Ids => "U8, U16 or U32",
                },
                got: format!("{:?}", view.dtype()),
            });
        }
        self.taken.insert(name.to_string());
        Ok(view)
    }

    /// A 1-D view of `name`, of `len` values when given.
    fn vector(
        &mut self,
        name: &str,
        kind: Kind,
        len: Option<usize>,
    ) -> Result<TensorView<'a>, TensorError> {
        let view = self.view(name, kind)?;
        match view.shape() {
            [n] if len.is_none_or(|l| l == *n) => Ok(view),
            got => Err(TensorError::Shape {
                name: name.into(),
                expected: dims(len),
                got: got.to_vec(),
            }),
        }
    }

    /// `[rows, cols]` f32 values.
    pub(crate) fn array(&mut self, name: &str) -> Result<TokenArray, TensorError> {
        let view = self.view(name, Kind::F32)?;
        let &[rows, cols] = view.shape() else {
            return Err(TensorError::Shape {
                name: name.into(),
                expected: "[rows, cols]".into(),
                got: view.shape().to_vec(),
            });
        };
        TokenArray::new(rows, cols, f32s(view.data())).map_err(|_| TensorError::Shape {
            name: name.into(),
            expected: format!("[{rows}, {cols}] values"),
            got: vec![view.data().len() / 4],
        })
    }

    /// 1-D f32 values, `len` of them when given.
    pub(crate) fn vec_f32(
        &mut self,
        name: &str,
        len: Option<usize>,
    ) -> Result<Vec<f32>, TensorError> {
        Ok(f32s(self.vector(name, Kind::F32, len)?.data()))
    }

    /// The row lengths `name.lens` (`rows` of them when given), checked against `values`.
    fn lens(
        &mut self,
        name: &str,
        rows: Option<usize>,
        values: usize,
    ) -> Result<Vec<usize>, TensorError> {
        let lens = u32s(&self.vector(&format!("{name}.lens"), Kind::Ids, rows)?);
        let sum: u64 = lens.iter().map(|&l| u64::from(l)).sum();
        if sum != values as u64 {
            return Err(TensorError::Lengths {
                name: name.into(),
                sum,
                len: values,
            });
        }
        Ok(lens.into_iter().map(|l| l as usize).collect())
    }

    /// Rows of u32 written by [`Blob::ragged_u32`] (`rows` of them when given).
    pub(crate) fn ragged_u32(
        &mut self,
        name: &str,
        rows: Option<usize>,
    ) -> Result<Vec<Vec<u32>>, TensorError> {
        let values = u32s(&self.vector(name, Kind::Ids, None)?);
        let lens = self.lens(name, rows, values.len())?;
        Ok(split(values, &lens))
    }

    /// Rows of f32 written by [`Blob::ragged_f32`] (`rows` of them when given).
    pub(crate) fn ragged_f32(
        &mut self,
        name: &str,
        rows: Option<usize>,
    ) -> Result<Vec<Vec<f32>>, TensorError> {
        let values = f32s(self.vector(name, Kind::F32, None)?.data());
        let lens = self.lens(name, rows, values.len())?;
        Ok(split(values, &lens))
    }

    /// Refuses a tensor no field took.
    pub(crate) fn finish(self) -> Result<(), TensorError> {
        let Some(st) = &self.st else { return Ok(()) };
        let mut names = st.names();
        names.sort();
        match names.into_iter().find(|n| !self.taken.contains(*n)) {
            Some(n) => Err(TensorError::Unexpected { name: n.into() }),
            None => Ok(()),
        }
    }
}

fn split<T: Copy>(values: Vec<T>, lens: &[usize]) -> Vec<Vec<T>> {
    let mut at = 0;
    lens.iter()
        .map(|&l| {
            at += l;
            values[at - l..at].to_vec()
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The values of a `U8`, `U16` or `U32` view, widened.
fn u32s(view: &TensorView<'_>) -> Vec<u32> {
    let bytes = view.data();
    match view.dtype() {
        Dtype::U8 => bytes.iter().map(|&b| u32::from(b)).collect(),
        Dtype::U16 => bytes
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}
