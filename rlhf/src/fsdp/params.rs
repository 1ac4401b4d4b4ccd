//! [`ShardedParams`]: one replica's share of a model's parameters (the f32 master shards the
//! optimizer updates) and the model's full `Var`s, which it fills by all-gather just before
//! the model is used and frees right after.
//!
//! Gathering and reduce-scattering go unit by unit (one decoder layer at a time), so the
//! collective's staging buffers hold one layer. candle's autograd keeps every layer's weights
//! in the graph until `backward` returns, so during a step all layers are gathered at once;
//! between steps none is.

use super::layout::ShardLayout;
use super::storage::{held_bytes, releasable, release, restore};
use crate::{Result, RlhfError};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use oxalign_kernels::collective::Collective;

/// One replica's parameter shards and the model `Var`s they fill.
pub struct ShardedParams {
    layout: ShardLayout,
    /// The model's parameters, in layout order.
    full: Vec<Var>,
    /// This rank's f32 master shard of each parameter, `[shard_len]`.
    shards: Vec<Var>,
    gathered: bool,
    device: Device,
}

fn fsdp_error(what: impl std::fmt::Display) -> RlhfError {
    RlhfError::Sharding(what.to_string())
}

impl ShardedParams {
    /// Rank `rank`'s shards of `named` (the model's parameters, sorted by name, f32 on the
    /// CPU), cut from their current values. The model stays gathered until [`Self::release`].
    pub fn new(named: Vec<(String, Var)>, rank: usize, world: usize) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(RlhfError::invalid(
                "fsdp rank",
                rank,
                format!("must be < world {world}"),
            ));
        }
        if let Some((name, _)) = named.iter().find(|(_, v)| !releasable(v.as_tensor())) {
            return Err(fsdp_error(format!(
                "parameter `{name}` is not a whole f32 CPU tensor; sharding needs f32 weights on the CPU"
            )));
        }
        let shapes: Vec<(String, Vec<usize>)> = named
            .iter()
            .map(|(n, v)| (n.clone(), v.dims().to_vec()))
            .collect();
        let layout = ShardLayout::new(&shapes, rank, world);
        let device = named
            .first()
            .map_or(Device::Cpu, |(_, v)| v.device().clone());
        let mut shards = Vec::with_capacity(named.len());
        for ((_, var), p) in named.iter().zip(&layout.params) {
            let flat = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            let mut shard = flat[p.owned(rank)].to_vec();
            shard.resize(p.shard_len, 0.0);
            shards.push(Var::from_tensor(&Tensor::from_vec(
                shard,
                p.shard_len,
                &device,
            )?)?);
        }
        Ok(Self {
            layout,
            full: named.into_iter().map(|(_, v)| v).collect(),
            shards,
            gathered: true,
            device,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// `(name, shard)` of every parameter: what the sharded optimizer updates.
    pub fn named_shards(&self) -> Vec<(String, Var)> {
        self.layout
            .params
            .iter()
            .map(|p| p.name.clone())
            .zip(self.shards.iter().cloned())
            .collect()
    }

    /// True while the model's full weights are present.
    pub fn is_gathered(&self) -> bool {
        self.gathered
    }

    /// Errors unless the model's full weights are present (call before reading the model).
    pub fn ensure_gathered(&self) -> Result<()> {
        match self.gathered {
            true => Ok(()),
            false => Err(fsdp_error(
                "the model's weights are released (sharded); gather them first",
            )),
        }
    }

    fn group<'a>(&self, c: Option<&'a dyn Collective>) -> Result<Option<&'a dyn Collective>> {
        match c {
            _ if self.layout.world == 1 => Ok(None),
            Some(c) if c.world_size() == self.layout.world && c.rank() == self.layout.rank => {
                Ok(Some(c))
            }
            Some(c) => Err(fsdp_error(format!(
                "collective is rank {} of {}, the shards are rank {} of {}",
                c.rank(),
                c.world_size(),
                self.layout.rank,
                self.layout.world
            ))),
            None => Err(fsdp_error(format!(
                "a group of {} shards needs a collective",
                self.layout.world
            ))),
        }
    }

    /// All-gathers every parameter into the model's `Var`s, one unit at a time. No-op when
    /// already gathered. Every rank of the group must call it.
    pub fn gather(&mut self, collective: Option<&dyn Collective>) -> Result<()> {
        if self.gathered {
            return Ok(());
        }
        let c = self.group(collective)?;
        for unit in self.layout.units() {
            let shards: Vec<Vec<f32>> = unit
                .iter()
                .map(|&i| self.shards[i].as_tensor().to_vec1::<f32>())
                .collect::<candle_core::Result<_>>()?;
            let mut full: Vec<Vec<f32>> = match c {
                None => shards,
                Some(c) => {
                    let world = self.layout.world;
                    let mut out: Vec<Vec<f32>> =
                        shards.iter().map(|s| vec![0.0; s.len() * world]).collect();
                    let ins: Vec<&[f32]> = shards.iter().map(Vec::as_slice).collect();
                    let mut outs: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
                    c.all_gather_f32(&ins, &mut outs).map_err(fsdp_error)?;
                    out
                }
            };
            for (&i, mut data) in unit.iter().zip(full.drain(..)) {
                data.truncate(self.layout.params[i].numel);
                restore(self.full[i].as_tensor(), data)?;
            }
        }
        self.gathered = true;
        Ok(())
    }

    /// Frees the model's full weights (the shards stay). No-op when already released.
    pub fn release(&mut self) -> Result<()> {
        if self.gathered {
            for v in &self.full {
                release(v.as_tensor())?;
            }
            self.gathered = false;
        }
        Ok(())
    }

    /// This rank's shard of the group-mean gradient of every parameter, reduce-scattered
    /// one unit at a time from the full gradients in `grads` (a parameter without one
    /// counts as zeros in a group, and is left out when alone, as replicated training does).
    /// Returns a store keyed by the shard `Var`s, for the sharded optimizer.
    pub fn reduce_scatter(
        &self,
        grads: &GradStore,
        collective: Option<&dyn Collective>,
    ) -> Result<GradStore> {
        let c = self.group(collective)?;
        let mut out = GradStore::default();
        for unit in self.layout.units() {
            let mut flats = Vec::with_capacity(unit.len());
            let mut present = Vec::with_capacity(unit.len());
            for &i in &unit {
                let p = &self.layout.params[i];
                let mut flat = match grads.get(self.full[i].as_tensor()) {
                    Some(g) => g.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?,
                    None if c.is_none() => {
                        present.push(false);
                        flats.push(Vec::new());
                        continue;
                    }
                    None => vec![0.0; p.numel],
                };
                present.push(true);
                flat.resize(p.padded_len(self.layout.world), 0.0);
                flats.push(flat);
            }
            let shard_grads: Vec<Vec<f32>> = match c {
                None => flats,
                Some(c) => {
                    let mut out: Vec<Vec<f32>> = unit
                        .iter()
                        .map(|&i| vec![0.0; self.layout.params[i].shard_len])
                        .collect();
                    let ins: Vec<&[f32]> = flats.iter().map(Vec::as_slice).collect();
                    let mut outs: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
                    c.reduce_scatter_mean_f32(&ins, &mut outs)
                        .map_err(fsdp_error)?;
                    out
                }
            };
            for ((&i, g), present) in unit.iter().zip(shard_grads).zip(present) {
                if present {
                    let n = g.len();
                    out.insert(
                        self.shards[i].as_tensor(),
                        Tensor::from_vec(g, n, &self.device)?,
                    );
                }
            }
        }
        Ok(out)
    }

    /// Global L2 norm of the shard gradients in `grads` over the whole group: each rank's
    /// sum of squares in f64, gathered and added in rank order (the same on every rank).
    pub fn global_grad_norm(
        &self,
        grads: &GradStore,
        collective: Option<&dyn Collective>,
    ) -> Result<f64> {
        let local = crate::optim::global_grad_norm(grads, self.shards.iter())?.powi(2);
        let c = self.group(collective)?;
        Ok(sum_over_group(local, c)?.sqrt())
    }

    /// The first parameter (layout order) with a NaN or infinity in any rank's shard.
    pub fn first_non_finite(&self, collective: Option<&dyn Collective>) -> Result<Option<String>> {
        let mut first = self.shards.len();
        for (i, s) in self.shards.iter().enumerate() {
            let probe = s
                .as_tensor()
                .affine(0.0, 0.0)?
                .sum_all()?
                .to_scalar::<f32>()?;
            if !probe.is_finite() {
                first = i;
                break;
            }
        }
        let c = self.group(collective)?;
        let firsts = gather_scalars(first as f64, c)?;
        let min = firsts.into_iter().fold(f64::INFINITY, f64::min) as usize;
        Ok(self.layout.params.get(min).map(|p| p.name.clone()))
    }

    /// The model's full `Var`s, in layout order.
    pub fn full_vars(&self) -> &[Var] {
        &self.full
    }

    /// Bytes held now by the master shards and by the model's full `Var`s.
    pub fn held(&self) -> (usize, usize) {
        let shards = self.shards.iter().map(|v| held_bytes(v.as_tensor())).sum();
        let full = self.full.iter().map(|v| held_bytes(v.as_tensor())).sum();
        (shards, full)
    }
}

/// `x` of every rank, in rank order (f64 sent as a high and a low f32: about 48 bits kept).
fn gather_scalars(x: f64, c: Option<&dyn Collective>) -> Result<Vec<f64>> {
    let Some(c) = c else { return Ok(vec![x]) };
    let hi = x as f32;
    let lo = (x - hi as f64) as f32;
    let mut out = vec![0.0f32; 2 * c.world_size()];
    c.all_gather_f32(&[&[hi, lo]], &mut [&mut out])
        .map_err(fsdp_error)?;
    Ok(out.chunks(2).map(|p| p[0] as f64 + p[1] as f64).collect())
}

/// Sum of `x` over the group, added in rank order.
fn sum_over_group(x: f64, c: Option<&dyn Collective>) -> Result<f64> {
    Ok(gather_scalars(x, c)?.into_iter().sum())
}
