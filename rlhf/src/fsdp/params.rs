//! [`ShardedParams`]: one replica's share of a model's parameters (the f32 master shards the
//! optimizer updates) and the model's full `Var`s, which it fills by all-gather just before
//! the model is used and frees right after.
//!
//! Gathering and reduce-scattering go unit by unit (one decoder layer at a time, then the
//! rest: embedding, final norm, head). A unit can be gathered and released on its own
//! ([`ShardedParams::gather_unit`]): that is what a training step does layer by layer through
//! [`super::LayerStream`], so during a step only the rest and one layer are gathered; between
//! steps nothing is. The gathered state is kept per unit behind a lock, so the model's
//! streamed layers can gather from inside candle's forward and backward.

use super::layout::ShardLayout;
use super::storage::{held_bytes, releasable, release, restore};
use crate::{Result, RlhfError};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use oxalign_kernels::collective::Collective;
use std::sync::{Mutex, MutexGuard};

/// One replica's parameter shards and the model `Var`s they fill.
pub(crate) struct ShardedParams {
    layout: ShardLayout,
    /// The units of the layout ([`ShardLayout::units_by_layer`]): the decoder layer each
    /// belongs to, and its parameters.
    units: Vec<(Option<usize>, Vec<usize>)>,
    /// The model's parameters, in layout order.
    full: Vec<Var>,
    /// This rank's f32 master shard of each parameter, `[shard_len]`.
    shards: Vec<Var>,
    /// Per unit: are its full weights present?
    gathered: Mutex<Vec<bool>>,
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
        let units = layout.units_by_layer();
        let gathered = Mutex::new(vec![true; units.len()]);
        Ok(Self {
            layout,
            units,
            full: named.into_iter().map(|(_, v)| v).collect(),
            shards,
            gathered,
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

    fn flags(&self) -> MutexGuard<'_, Vec<bool>> {
        // A panic while holding the lock leaves plain flags behind: still meaningful.
        self.gathered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while every unit's full weights are present.
    pub fn is_gathered(&self) -> bool {
        self.flags().iter().all(|&g| g)
    }

    /// True while the full weights outside the decoder layers (embedding, final norm, head)
    /// are present.
    pub fn is_rest_gathered(&self) -> bool {
        let flags = self.flags();
        self.units
            .iter()
            .zip(flags.iter())
            .all(|((layer, _), &g)| layer.is_some() || g)
    }

    /// Errors unless the model's full weights are present (call before reading the model).
    /// With `streamed` the decoder layers may be absent (the model gathers each as it runs
    /// it), but the rest must be present.
    pub fn ensure_gathered(&self, streamed: bool) -> Result<()> {
        let ok = match streamed {
            true => self.is_rest_gathered(),
            false => self.is_gathered(),
        };
        match ok {
            true => Ok(()),
            false => Err(fsdp_error(
                "the model's weights are released (sharded); gather them first",
            )),
        }
    }

    /// The unit holding decoder layer `layer`'s parameters.
    pub fn unit_of_layer(&self, layer: usize) -> Option<usize> {
        self.units.iter().position(|(l, _)| *l == Some(layer))
    }

    /// True when unit `unit`'s full weights are present.
    pub fn is_unit_gathered(&self, unit: usize) -> bool {
        self.flags().get(unit).copied().unwrap_or(false)
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

    /// All-gathers every parameter into the model's `Var`s, one unit at a time. Units
    /// already gathered are skipped. Every rank of the group must call it.
    pub fn gather(&self, collective: Option<&dyn Collective>) -> Result<()> {
        for u in 0..self.units.len() {
            self.gather_unit(u, collective)?;
        }
        Ok(())
    }

    /// All-gathers the parameters outside the decoder layers (what a streamed forward needs
    /// before its first layer). Every rank of the group must call it.
    pub fn gather_rest(&self, collective: Option<&dyn Collective>) -> Result<()> {
        for (u, (layer, _)) in self.units.iter().enumerate() {
            if layer.is_none() {
                self.gather_unit(u, collective)?;
            }
        }
        Ok(())
    }

    /// All-gathers unit `unit` into the model's `Var`s (no-op when present). Every rank of
    /// the group must call it.
    pub fn gather_unit(&self, unit: usize, collective: Option<&dyn Collective>) -> Result<()> {
        if self.is_unit_gathered(unit) {
            return Ok(());
        }
        let c = self.group(collective)?;
        let params = &self.units[unit].1;
        let shards: Vec<Vec<f32>> = params
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
        for (&i, mut data) in params.iter().zip(full.drain(..)) {
            data.truncate(self.layout.params[i].numel);
            restore(self.full[i].as_tensor(), data)?;
        }
        self.flags()[unit] = true;
        Ok(())
    }

    /// Frees the model's full weights (the shards stay). No-op when already released.
    pub fn release(&self) -> Result<()> {
        for u in 0..self.units.len() {
            self.release_unit(u)?;
        }
        Ok(())
    }

    /// Frees unit `unit`'s full weights (no-op when released).
    pub fn release_unit(&self, unit: usize) -> Result<()> {
        if !self.is_unit_gathered(unit) {
            return Ok(());
        }
        for &i in &self.units[unit].1 {
            release(self.full[i].as_tensor())?;
        }
        self.flags()[unit] = false;
        Ok(())
    }

    /// This rank's shard of the group-mean gradient of every parameter, reduce-scattered
    /// one unit at a time from the full gradients in `grads` (a parameter without one
    /// counts as zeros in a group, and is left out when alone, as replicated training does).
    /// Units whose `skip` flag is set are left out (their shards came another way: a
    /// streamed layer's, [`super::LayerStream`]). Units go in the order a streamed backward
    /// hands them over (the last layer first, the rest at the end), so a rank whose backward
    /// never reached its layers still meets its peers' exchanges in order. Returns a store
    /// keyed by the shard `Var`s, for the sharded optimizer.
    pub fn reduce_scatter(
        &self,
        grads: &GradStore,
        collective: Option<&dyn Collective>,
        skip: &[bool],
    ) -> Result<GradStore> {
        let mut out = GradStore::default();
        let layers = self.units.iter().filter(|(l, _)| l.is_some()).count();
        let order = (0..layers).rev().chain(layers..self.units.len());
        for u in order {
            if skip.get(u).copied().unwrap_or(false) {
                continue;
            }
            for (i, g) in self.reduce_scatter_unit(u, grads, collective)? {
                out.insert(self.shards[i].as_tensor(), g);
            }
        }
        Ok(out)
    }

    /// This rank's shard of the group-mean gradient of unit `unit`'s parameters, from the
    /// full gradients in `grads`, as `(parameter index, shard gradient)`. Every rank of the
    /// group must call it.
    pub fn reduce_scatter_unit(
        &self,
        unit: usize,
        grads: &GradStore,
        collective: Option<&dyn Collective>,
    ) -> Result<Vec<(usize, Tensor)>> {
        let c = self.group(collective)?;
        let params = &self.units[unit].1;
        let mut flats = Vec::with_capacity(params.len());
        let mut present = Vec::with_capacity(params.len());
        for &i in params {
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
                let mut out: Vec<Vec<f32>> = params
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
        let mut out = Vec::with_capacity(params.len());
        for ((&i, g), present) in params.iter().zip(shard_grads).zip(present) {
            if present {
                let n = g.len();
                out.push((i, Tensor::from_vec(g, n, &self.device)?));
            }
        }
        Ok(out)
    }

    /// Bytes of the full gradients in `grads` of unit `unit`'s parameters.
    pub fn unit_grad_bytes(&self, unit: usize, grads: &GradStore) -> usize {
        self.units[unit]
            .1
            .iter()
            .filter_map(|&i| grads.get(self.full[i].as_tensor()))
            .map(held_bytes)
            .sum()
    }

    /// The number of units.
    pub fn num_units(&self) -> usize {
        self.units.len()
    }

    /// This rank's shard `Var` of parameter `index` (layout order).
    pub fn shard_var(&self, index: usize) -> &Var {
        &self.shards[index]
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
