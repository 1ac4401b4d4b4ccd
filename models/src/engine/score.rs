//! Batched scoring: the log-prob of every next token of many sequences, as prefill-style
//! forwards over the paged pool. Sequences are packed into steps of up to
//! `max_batched_tokens` tokens (one item per sequence), and the LM head returns only the
//! target tokens' log-probs, a few rows of logits at a time, so `[tokens, V]` logits never
//! exist at once. A sequence longer than the budget is scored alone in chunks. Each
//! sequence may skip its first positions (a rollout's prompt): they still feed the forward,
//! but the head, with a large vocabulary most of a small model's arithmetic, skips them.

use crate::engine::block_pool::BlockPool;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::forward::{paged_forward, Head, StepRouting};
use crate::engine::step_item::{AttnDims, StepItem, WantLogits};
use crate::engine::weights::EngineWeights;
use crate::moe::routing::{ExpertChoices, FREE};
use oxalign_kernels::ops::TokenDistribution;

/// What scoring needs from the engine.
pub(crate) struct Scorer<'a> {
    pub weights: &'a EngineWeights,
    pub dims: AttnDims,
    pub inv_freq: &'a [f32],
    pub vocab: usize,
    pub max_batched_tokens: usize,
    /// The distribution the log-probs are taken under.
    pub dist: TokenDistribution,
    /// Per sequence, experts to route its tokens to (positions from 0; see
    /// [`ExpertChoices`]) instead of the routers' own top-k. None: the routers choose.
    pub replay: Option<&'a [ExpertChoices]>,
}

/// Sequences to score, and per sequence the first next-token position scored (`seq[t+1]`
/// given `seq[..=t]` for `t >= from[i]`).
#[derive(Clone, Copy)]
pub(crate) struct ScoreRequest<'a> {
    pub sequences: &'a [Vec<u32>],
    pub from: &'a [usize],
}

impl ScoreRequest<'_> {
    /// Next-token positions of sequence `i` that are scored.
    fn scored(&self, i: usize) -> std::ops::Range<usize> {
        let n = self.sequences[i].len() - 1;
        self.from[i].min(n)..n
    }
}

impl Scorer<'_> {
    /// `len - 1 - from[i]` log-probs per sequence (`seq[t+1]` given `seq[..=t]`, for `t` from
    /// `from[i]`), in input order.
    pub(crate) fn score(
        &self,
        pool: &mut BlockPool,
        req: ScoreRequest<'_>,
    ) -> EngineResult<Vec<Vec<f32>>> {
        self.validate(pool, req)?;
        let bs = pool.block_size();
        let mut out: Vec<Vec<f32>> = Vec::with_capacity(req.sequences.len());
        let mut batch: Vec<usize> = Vec::new();
        let (mut tokens, mut blocks) = (0, 0);
        for (i, seq) in req.sequences.iter().enumerate() {
            let (t, b) = (seq.len() - 1, seq.len().div_ceil(bs));
            if t > self.max_batched_tokens {
                out.extend(self.run_batch(pool, req, &batch)?);
                batch.clear();
                (tokens, blocks) = (0, 0);
                out.push(self.score_long(pool, req, i)?);
                continue;
            }
            if !batch.is_empty()
                && (tokens + t > self.max_batched_tokens || blocks + b > pool.num_free())
            {
                out.extend(self.run_batch(pool, req, &batch)?);
                batch.clear();
                (tokens, blocks) = (0, 0);
            }
            batch.push(i);
            tokens += t;
            blocks += b;
        }
        out.extend(self.run_batch(pool, req, &batch)?);
        Ok(out)
    }

    fn validate(&self, pool: &BlockPool, req: ScoreRequest<'_>) -> EngineResult<()> {
        let bs = pool.block_size();
        if req.from.len() != req.sequences.len() {
            return Err(EngineError::InvalidRequest {
                index: req.from.len().min(req.sequences.len()),
                message: format!(
                    "{} scoring starts for {} sequences",
                    req.from.len(),
                    req.sequences.len()
                ),
            });
        }
        for (index, seq) in req.sequences.iter().enumerate() {
            let bad = |message: String| EngineError::InvalidRequest { index, message };
            if seq.len() < 2 {
                return Err(bad(format!(
                    "scoring needs at least 2 tokens, got {}",
                    seq.len()
                )));
            }
            if let Some(t) = seq.iter().find(|&&t| t as usize >= self.vocab) {
                return Err(bad(format!(
                    "token {t} is not below vocab_size {}",
                    self.vocab
                )));
            }
            let needed = seq.len().div_ceil(bs);
            if needed > pool.num_free() {
                return Err(EngineError::Capacity {
                    index,
                    tokens: seq.len(),
                    needed,
                    block_size: bs,
                    num_blocks: pool.num_free(),
                });
            }
        }
        Ok(())
    }

    /// One forward over whole sequences `batch` (all fit the token budget and the pool).
    fn run_batch(
        &self,
        pool: &mut BlockPool,
        req: ScoreRequest<'_>,
        batch: &[usize],
    ) -> EngineResult<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let seqs = req.sequences;
        let tables = allocate(pool, batch.iter().map(|&i| seqs[i].len()))?;
        let items: Vec<StepItem<'_>> = batch
            .iter()
            .zip(&tables)
            .map(|(&i, table)| StepItem {
                table,
                start: 0,
                tokens: &seqs[i][..seqs[i].len() - 1],
                want: WantLogits::From(req.scored(i).start),
            })
            .collect();
        let targets: Vec<u32> = batch
            .iter()
            .flat_map(|&i| seqs[i][req.scored(i).start + 1..].iter().copied())
            .collect();
        let spans: Vec<(usize, std::ops::Range<usize>)> =
            batch.iter().map(|&i| (i, 0..seqs[i].len() - 1)).collect();
        let result = self.forward(pool, &items, &targets, &spans);
        release(pool, tables);
        let flat = result?;
        let mut at = 0;
        Ok(batch
            .iter()
            .map(|&i| {
                let n = req.scored(i).len();
                at += n;
                flat[at - n..at].to_vec()
            })
            .collect())
    }

    /// A sequence longer than the token budget, in chunks over its own blocks.
    fn score_long(
        &self,
        pool: &mut BlockPool,
        req: ScoreRequest<'_>,
        index: usize,
    ) -> EngineResult<Vec<f32>> {
        let seq = &req.sequences[index];
        let from = req.scored(index).start;
        let mut tables = allocate(pool, std::iter::once(seq.len()))?;
        let table = tables.pop().unwrap_or_default();
        let mut lps = Vec::with_capacity(seq.len() - 1 - from);
        let mut start = 0;
        let mut result = Ok(());
        while start < seq.len() - 1 {
            let end = (start + self.max_batched_tokens).min(seq.len() - 1);
            let item = StepItem {
                table: &table,
                start,
                tokens: &seq[start..end],
                want: WantLogits::From(from.saturating_sub(start)),
            };
            let spans = [(index, start..end)];
            let targets = &seq[from.max(start).min(end) + 1..end + 1];
            match self.forward(pool, &[item], targets, &spans) {
                Ok(v) => lps.extend(v),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            start = end;
        }
        release(pool, vec![table]);
        result.map(|()| lps)
    }

    /// One step over `items`; `spans[i]` names item `i`'s sequence and the positions it
    /// feeds (for the replay).
    fn forward(
        &self,
        pool: &mut BlockPool,
        items: &[StepItem<'_>],
        targets: &[u32],
        spans: &[(usize, std::ops::Range<usize>)],
    ) -> EngineResult<Vec<f32>> {
        let replay = self.replay.map(|r| step_replay(r, spans));
        let scored = paged_forward(
            self.weights,
            self.dims,
            self.inv_freq,
            pool,
            items,
            Head::TargetLogprobs(targets, self.dist),
            StepRouting {
                record: None,
                replay: replay.as_deref(),
            },
        )?;
        match scored {
            Some(lps) => Ok(lps),
            // A chunk wholly before the scored positions feeds the cache and wants no rows.
            None if targets.is_empty() => Ok(Vec::new()),
            None => Err(EngineError::Stalled("scoring returned no log-probs".into())),
        }
    }
}

/// The replayed choices of one step, per sparse layer, token-major in item order: for each
/// `(sequence, positions)` span, the records' choices at those positions ([`FREE`] past a
/// record's end).
fn step_replay(
    records: &[ExpertChoices],
    spans: &[(usize, std::ops::Range<usize>)],
) -> Vec<Vec<u32>> {
    let k = records.iter().map(|r| r.top_k).max().unwrap_or(0);
    let layers = records.iter().map(|r| r.layers.len()).max().unwrap_or(0);
    let mut out = vec![Vec::new(); layers];
    for (l, layer) in out.iter_mut().enumerate() {
        for (seq, positions) in spans {
            let record = records.get(*seq);
            let n = record.map_or(0, ExpertChoices::num_tokens);
            let choices = record.and_then(|r| r.layers.get(l));
            for pos in positions.clone() {
                match choices.filter(|_| pos < n) {
                    Some(c) => layer.extend_from_slice(&c[pos * k..(pos + 1) * k]),
                    None => layer.extend(std::iter::repeat_n(FREE, k)),
                }
            }
        }
    }
    out
}

/// Block tables for sequences of the given lengths (all or nothing).
fn allocate(
    pool: &mut BlockPool,
    lens: impl Iterator<Item = usize>,
) -> EngineResult<Vec<Vec<usize>>> {
    let bs = pool.block_size();
    let mut tables: Vec<Vec<usize>> = Vec::new();
    for len in lens {
        let mut table = Vec::with_capacity(len.div_ceil(bs));
        for _ in 0..len.div_ceil(bs) {
            match pool.allocate() {
                Some(b) => table.push(b),
                None => {
                    tables.push(table);
                    release(pool, tables);
                    return Err(EngineError::Stalled(
                        "the KV pool ran out while scoring".into(),
                    ));
                }
            }
        }
        tables.push(table);
    }
    Ok(tables)
}

fn release(pool: &mut BlockPool, tables: Vec<Vec<usize>>) {
    for b in tables.into_iter().flatten() {
        pool.release(b);
    }
}
