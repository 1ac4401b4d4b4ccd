//! Expert-parallel token dispatch in the engine's sparse block: each rank routes its own
//! tokens, sends every (token, choice) row to the rank that owns the chosen expert (one
//! all-to-all), each owner runs its experts over the rows that arrived from every rank, and
//! sends the outputs back (a second all-to-all); each rank then sums its tokens' outputs
//! with its routing weights, expert by expert in ascending order, the order the one-device
//! block adds them in. Host buffers only; the exchange is `Collective::all_to_all_f32`.
//!
//! Every rank must run the same number of sparse-layer calls in the same order: a rank with
//! no tokens left still calls with `n = 0` (it has nothing to send, but serves its experts to
//! the others). The engine's generation loop keeps the ranks in step (`engine.rs`).

use super::expert::ExpertWeights;
use crate::moe::expert_parallel::ExpertParallel;
use candle_core::Result;

/// What one rank sends an owner: for each of its rows, the expert it is for, and the rows.
/// Wire form: `[m, expert ids (m), rows (m · H)]`, all f32 (ids are exact below 2^24).
struct Outbox {
    experts: Vec<f32>,
    rows: Vec<f32>,
    /// The slots (token · k + choice) of these rows, in order.
    slots: Vec<usize>,
}

/// Routed experts' output `[n, H]` for tokens `h` `[n, H]` whose slot `s` (token `s / k`)
/// goes to expert `chosen[s]` with weight `weights[s]`, the experts spread over `ep`
/// (`experts[e]` is `Some` on its owner).
pub(crate) fn dispatch_experts(
    ep: &ExpertParallel,
    experts: &[Option<ExpertWeights>],
    h: &[f32],
    (n, hidden, k): (usize, usize, usize),
    chosen: &[u32],
    weights: &[f32],
) -> Result<Vec<f32>> {
    let world = ep.world();
    let mut outboxes: Vec<Outbox> = (0..world)
        .map(|_| Outbox {
            experts: Vec::new(),
            rows: Vec::new(),
            slots: Vec::new(),
        })
        .collect();
    for (s, &e) in chosen.iter().enumerate() {
        let t = s / k;
        let o = &mut outboxes[ep.owner(e as usize)];
        o.experts.push(e as f32);
        o.rows.extend_from_slice(&h[t * hidden..(t + 1) * hidden]);
        o.slots.push(s);
    }
    let send: Vec<Vec<f32>> = outboxes
        .iter()
        .map(|o| {
            let mut block = Vec::with_capacity(1 + o.experts.len() + o.rows.len());
            block.push(o.experts.len() as f32);
            block.extend_from_slice(&o.experts);
            block.extend_from_slice(&o.rows);
            block
        })
        .collect();
    let arrived = exchange(ep, send)?;
    let results = serve(experts, &arrived, hidden)?;
    let returned = exchange(ep, results)?;
    combine(&outboxes, &returned, (n, hidden), chosen, weights)
}

fn exchange(ep: &ExpertParallel, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
    ep.comm()
        .all_to_all_f32(send)
        .map_err(candle_core::Error::wrap)
}

/// The owner's side: every arrived row through its expert, answered per source rank in
/// the order the rows came.
fn serve(
    experts: &[Option<ExpertWeights>],
    arrived: &[Vec<f32>],
    hidden: usize,
) -> Result<Vec<Vec<f32>>> {
    // (source, row) of every arrived row, grouped by expert.
    let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts.len()];
    let mut counts = Vec::with_capacity(arrived.len());
    for (src, block) in arrived.iter().enumerate() {
        let m = block.first().map_or(0, |&m| m as usize);
        if block.len() != 1 + m + m * hidden {
            candle_core::bail!(
                "expert dispatch: rank {src} sent {} values for {m} rows of {hidden}",
                block.len()
            )
        }
        for (row, &e) in block[1..1 + m].iter().enumerate() {
            match by_expert.get_mut(e as usize) {
                Some(list) => list.push((src, row)),
                None => candle_core::bail!("expert dispatch: rank {src} asked for expert {e}"),
            }
        }
        counts.push(m);
    }
    let mut out: Vec<Vec<f32>> = counts.iter().map(|&m| vec![0f32; m * hidden]).collect();
    for (e, rows) in by_expert.iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let Some(expert) = experts[e].as_ref() else {
            candle_core::bail!("expert dispatch: expert {e} arrived at a rank that does not own it")
        };
        let mut x = Vec::with_capacity(rows.len() * hidden);
        for &(src, row) in rows {
            let m = counts[src];
            let at = 1 + m + row * hidden;
            x.extend_from_slice(&arrived[src][at..at + hidden]);
        }
        let y = expert.forward(&x, rows.len())?;
        for (&(src, row), v) in rows.iter().zip(y.chunks(hidden)) {
            out[src][row * hidden..(row + 1) * hidden].copy_from_slice(v);
        }
    }
    Ok(out)
}

/// The sender's side: each slot's expert output, weighted and summed per token, expert by
/// expert in ascending order (then slot order), as the one-device block does.
fn combine(
    outboxes: &[Outbox],
    returned: &[Vec<f32>],
    (n, hidden): (usize, usize),
    chosen: &[u32],
    weights: &[f32],
) -> Result<Vec<f32>> {
    // Where slot s's output row is: (owner, row within what the owner returned).
    let mut at = vec![(0usize, 0usize); chosen.len()];
    for (owner, o) in outboxes.iter().enumerate() {
        if returned[owner].len() != o.slots.len() * hidden {
            candle_core::bail!(
                "expert dispatch: rank {owner} returned {} values for {} rows of {hidden}",
                returned[owner].len(),
                o.slots.len()
            )
        }
        for (row, &s) in o.slots.iter().enumerate() {
            at[s] = (owner, row);
        }
    }
    let k = chosen.len() / n.max(1);
    let mut order: Vec<usize> = (0..chosen.len()).collect();
    order.sort_by_key(|&s| (chosen[s], s));
    let mut out = vec![0f32; n * hidden];
    for s in order {
        let (owner, row) = at[s];
        let y = &returned[owner][row * hidden..(row + 1) * hidden];
        let t = s / k.max(1);
        let w = weights[s];
        for (o, &v) in out[t * hidden..(t + 1) * hidden].iter_mut().zip(y) {
            *o += v * w;
        }
    }
    Ok(out)
}
