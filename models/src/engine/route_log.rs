//! The engine's record of the experts each sequence's tokens were routed to during
//! `generate` (rollout routing replay): one entry per fed position of each sequence, written
//! as the position is computed (recomputation after a preemption overwrites it) and copied to
//! the followers that fork from a leader's shared prompt. Off unless asked for, so dense and
//! non-recording runs pay nothing. The trainer replays it through `routing::RouterTrace`.

use crate::engine::scheduler::Planned;
use crate::moe::routing::{ExpertChoices, FREE};

/// Per sequence, per position, the `layers * k` experts chosen (layer-major).
pub(crate) struct RouteLog {
    top_k: usize,
    layers: usize,
    seqs: Vec<Vec<Vec<u32>>>,
}

impl RouteLog {
    /// An empty log for `n` sequences of a model with `layers` sparse layers of top-`top_k`.
    pub(crate) fn new(n: usize, layers: usize, top_k: usize) -> RouteLog {
        RouteLog {
            top_k,
            layers,
            seqs: vec![Vec::new(); n],
        }
    }

    /// Records one step: `step[l]` holds `tokens * k` choices of sparse layer `l` for the
    /// step's tokens in plan order; `starts[i]` is the first position of plan item `i`.
    pub(crate) fn write(&mut self, plan: &[Planned], starts: &[usize], step: &[Vec<u32>]) {
        let k = self.top_k;
        let mut t = 0;
        for (p, &start) in plan.iter().zip(starts) {
            let seq = &mut self.seqs[p.seq];
            for pos in start..start + p.chunk {
                if seq.len() <= pos {
                    seq.resize(pos + 1, vec![FREE; self.layers * k]);
                }
                let entry = &mut seq[pos];
                for (l, layer) in step.iter().enumerate() {
                    entry[l * k..(l + 1) * k].copy_from_slice(&layer[t * k..(t + 1) * k]);
                }
                t += 1;
            }
        }
    }

    /// Copies the leader's first `upto` positions to a follower that forked from it.
    pub(crate) fn fork(&mut self, leader: usize, follower: usize, upto: usize) {
        let shared: Vec<Vec<u32>> = self.seqs[leader].iter().take(upto).cloned().collect();
        self.seqs[follower] = shared;
    }

    /// The record of every sequence, the first `fed[i]` positions of sequence `i`.
    pub(crate) fn into_choices(self, fed: &[usize]) -> Vec<ExpertChoices> {
        let (k, layers) = (self.top_k, self.layers);
        self.seqs
            .into_iter()
            .zip(fed)
            .map(|(positions, &n)| {
                let mut out = vec![Vec::with_capacity(n * k); layers];
                for pos in 0..n {
                    let entry = positions.get(pos);
                    for (l, layer) in out.iter_mut().enumerate() {
                        match entry {
                            Some(e) => layer.extend_from_slice(&e[l * k..(l + 1) * k]),
                            None => layer.extend(std::iter::repeat_n(FREE, k)),
                        }
                    }
                }
                ExpertChoices {
                    top_k: k,
                    layers: out,
                }
            })
            .collect()
    }
}
