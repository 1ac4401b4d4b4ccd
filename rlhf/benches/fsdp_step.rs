//! The cost of gathering layers just in time in sharded (FSDP) training: SFT steps of a
//! policy sharded over two CPU ranks (threads over `ThreadCollective`), with the decoder
//! layers streamed (gathered for the forward, freed, gathered again for a recomputed
//! backward) against the whole model gathered for the step, and replicated data parallelism
//! for reference. The three modes alternate round by round. One JSON line per mode: seconds
//! per step (median, min, max over every timed step of every round) and the step's peak
//! bytes on rank 0 (`TrainMemory::step_peak`).
//!
//! Run: `cargo bench -p oxalign-rlhf --bench fsdp_step`; `OXALIGN_BENCH_RUNS=N` sets the
//! rounds (default 5), each of 3 timed steps after one warm-up step.

use candle_core::Device;
use oxalign_kernels::collective::{Collective, ThreadCollective};
use oxalign_models::{CausalLm, Family, ModelConfig, Preset};
use oxalign_rlhf::trainer::{PolicyTrainer, Sharded, TokenBatch};
use std::sync::Arc;
use std::time::Instant;

const WORLD: usize = 2;
const STEPS: usize = 3;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Replicated,
    WholeModel,
    Streamed,
}

fn config() -> ModelConfig {
    let mut c = ModelConfig::preset(Family::Llama, Preset::Tiny, 256);
    c.num_hidden_layers = 8;
    c
}

/// This rank's 4 sequences of 64 tokens (prompt 16, response 48), seeded by rank.
fn batch(rank: usize) -> TokenBatch {
    let rows: Vec<(Vec<u32>, Vec<u32>)> = (0..4)
        .map(|i| {
            let seq: Vec<u32> = (0..64)
                .map(|j| ((rank * 131 + i * 37 + j * 11) % 250 + 1) as u32)
                .collect();
            (seq[..16].to_vec(), seq[16..].to_vec())
        })
        .collect();
    let refs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    TokenBatch::new(&refs, 0, &Device::Cpu).unwrap()
}

/// Seconds of each timed step on rank 0, and its step peak in bytes.
fn round(mode: Mode) -> (Vec<f64>, usize) {
    let handles: Vec<_> = ThreadCollective::group(WORLD)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank();
                let c: Arc<dyn Collective> = Arc::new(c);
                let m = CausalLm::init_random(&config(), 3, &Device::Cpu).unwrap();
                let mut t = PolicyTrainer::new(m, 1e-4, 0.0).unwrap();
                match mode {
                    Mode::Replicated => {}
                    Mode::WholeModel => t.shard(rank, WORLD, None).unwrap(),
                    Mode::Streamed => t.shard(rank, WORLD, Some(c.clone())).unwrap(),
                }
                let b = batch(rank);
                let mut secs = Vec::new();
                for step in 0..=STEPS {
                    let start = Instant::now();
                    t.sft_step(&b, 1e-4, 1.0, 1.0, Some(c.as_ref())).unwrap();
                    if step > 0 {
                        secs.push(start.elapsed().as_secs_f64());
                    }
                }
                (secs, t.memory().step_peak.unwrap_or(0))
            })
        })
        .collect();
    let mut out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    out.swap_remove(0)
}

fn main() {
    let rounds: usize = std::env::var("OXALIGN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let modes = [Mode::Replicated, Mode::WholeModel, Mode::Streamed];
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut peaks = vec![0; modes.len()];
    for _ in 0..rounds {
        for (i, &mode) in modes.iter().enumerate() {
            let (s, peak) = round(mode);
            secs[i].extend(s);
            peaks[i] = peak;
        }
    }
    for (i, mode) in modes.iter().enumerate() {
        let s = &mut secs[i];
        s.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{{\"bench\":\"fsdp_sft_step\",\"mode\":\"{mode:?}\",\"world\":{WORLD},\"layers\":8,\
             \"steps\":{},\"step_s_median\":{:.4},\"step_s_min\":{:.4},\"step_s_max\":{:.4},\
             \"step_peak_bytes\":{}}}",
            s.len(),
            s[s.len() / 2],
            s[0],
            s[s.len() - 1],
            peaks[i]
        );
    }
}
