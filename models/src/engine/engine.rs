//! `Engine`: the rollout engine — owns a copy of the policy weights (f32 or quantized) and a
//! paged KV pool, generates with continuous batching, scores token sequences, and takes
//! verified, versioned refits. It does not train and never shares storage with the trainer.

use crate::config::model_config::ModelConfig;
use crate::engine::block_pool::BlockPool;
use crate::engine::config::EngineConfig;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::forward::{paged_forward, Head, StepRouting};
use crate::engine::refit::{Probe, RefitReport, WeightUpdate};
use crate::engine::request::{hits_stop_string, Detokenize, EngineRequest};
use crate::engine::route_log::RouteLog;
use crate::engine::sampler::Sampler;
use crate::engine::scheduler::{Planned, Scheduler, SeqState, Sequence};
use crate::engine::score::{ScoreRequest, Scorer};
use crate::engine::stats::EngineStats;
use crate::engine::step_item::{AttnDims, StepItem, WantLogits};
use crate::engine::weights::EngineWeights;
use crate::lora::AdapterMerge;
use crate::moe::expert_parallel::ExpertParallel;
use crate::moe::routing::ExpertChoices;
use crate::nn::causal_lm::CausalLm;
use crate::nn::generate::{Completion, FinishReason, GenerationRequest};
use crate::nn::rope::RotaryEmbedding;
use candle_core::{Device, Tensor};
use multiversion::multiversion;
use oxalign_kernels::ops::TokenDistribution;
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

/// The generation engine of one policy replica.
pub struct Engine {
    model: ModelConfig,
    config: EngineConfig,
    weights: EngineWeights,
    /// The checksum of every tensor of `weights` (the engine's f32 copy), by name.
    sums: HashMap<String, u64>,
    inv_freq: Vec<f32>,
    dims: AttnDims,
    pool: BlockPool,
    device: Device,
    stats: EngineStats,
    /// The expert-parallel group, when this engine holds only its rank's experts.
    experts: Option<ExpertParallel>,
}

impl Engine {
    /// An engine serving `weights` (HF names, every `CausalLm` parameter of `model`; copied,
    /// converted to f32 and, with `config.quant`, quantized) on `device`, at version 0.
    /// The KV pool has `config.num_blocks` blocks or as many as `config.kv_memory_bytes` hold.
    pub fn new(
        model: ModelConfig,
        weights: &HashMap<String, Tensor>,
        config: EngineConfig,
        device: &Device,
    ) -> EngineResult<Engine> {
        Self::with_experts(model, weights, config, device, None)
    }

    /// [`Engine::new`] as rank `ep.rank()` of an expert-parallel group: it takes (from
    /// `weights`, and at every refit) only the routed experts this rank owns. Every rank of
    /// the group must call `generate` together, each with its own requests (any number,
    /// none included): the ranks step together until the last one is done, and in every
    /// sparse layer each token row travels to its expert's owner and back
    /// (`moe_dispatch.rs`). Scoring (and a refit's probe) must be called on every rank with
    /// the same sequences.
    pub fn with_experts(
        model: ModelConfig,
        weights: &HashMap<String, Tensor>,
        config: EngineConfig,
        device: &Device,
        experts: Option<ExpertParallel>,
    ) -> EngineResult<Engine> {
        Engine::assemble(model, (weights, None), config, device, experts)
    }

    /// [`Engine::with_experts`] over `weights` with LoRA adapters merged as each is read.
    fn assemble(
        model: ModelConfig,
        weights: (&HashMap<String, Tensor>, Option<&AdapterMerge>),
        config: EngineConfig,
        device: &Device,
        experts: Option<ExpertParallel>,
    ) -> EngineResult<Engine> {
        model.validate()?;
        let num_blocks = config.resolve_num_blocks(&model)?;
        let (w, sums) = EngineWeights::build(
            &model,
            weights,
            config.quant,
            device,
            experts.as_ref(),
            None,
        )?;
        let mut pool = BlockPool::new(
            model.num_hidden_layers,
            num_blocks,
            config.block_size,
            model.num_key_value_heads,
            model.head_dim,
        );
        if config.prefix_cache {
            pool = pool.with_prefix_cache();
        }
        let stats = EngineStats {
            block_size: config.block_size,
            num_blocks,
            blocks_free: num_blocks,
            block_bytes: config.block_bytes(&model),
            weight_bytes: w.linear_bytes(),
            ..EngineStats::default()
        };
        Ok(Engine {
            inv_freq: RotaryEmbedding::new(&model).inv_freq().to_vec(),
            dims: AttnDims {
                heads: model.num_attention_heads,
                kv_heads: model.num_key_value_heads,
                head_dim: model.head_dim,
                softcap: model.style.attn_softcap.map(|c| c as f32),
            },
            model,
            config,
            weights: w,
            sums,
            pool,
            device: device.clone(),
            stats,
            experts,
        })
    }

    /// The expert-parallel group, when this engine holds only its rank's experts.
    pub fn expert_parallel(&self) -> Option<&ExpertParallel> {
        self.experts.as_ref()
    }

    /// An engine over the current weights of `model` (on the model's device).
    pub fn from_model(model: &CausalLm, config: EngineConfig) -> EngineResult<Engine> {
        let (weights, merge) = model.weights_to_merge()?;
        let cfg = model.config().clone();
        Engine::assemble(
            cfg,
            (&weights, merge.as_ref()),
            config,
            model.device(),
            None,
        )
    }

    /// An expert-parallel engine ([`Engine::with_experts`]) over the current weights of
    /// `model`, which holds at least this rank's experts (an expert-parallel trainer of the
    /// same rank, or a whole model). `ep` must be a group of its own: the engine's
    /// exchanges must not interleave with a trainer's.
    pub fn from_model_with_experts(
        model: &CausalLm,
        config: EngineConfig,
        ep: ExpertParallel,
    ) -> EngineResult<Engine> {
        let (weights, merge) = model.weights_to_merge()?;
        let cfg = model.config().clone();
        let on = model.device();
        Engine::assemble(cfg, (&weights, merge.as_ref()), config, on, Some(ep))
    }

    /// The model config.
    pub fn model_config(&self) -> &ModelConfig {
        &self.model
    }

    /// The device the engine's weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The engine settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Weight version served (0 until the first refit).
    pub fn version(&self) -> u64 {
        self.stats.version
    }

    /// Counters for the monitor (pool occupancy, preemptions, sharing, tokens).
    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats.clone();
        s.blocks_used = self.pool.num_used();
        s.blocks_free = self.pool.num_free();
        s.peak_blocks_used = self.pool.peak_used();
        s.cached_blocks = self.pool.num_cached();
        s
    }

    /// Completes every request, like [`CausalLm::generate`] (same per-request seeded
    /// sampling, stop tokens, `max_new_tokens`, and each token's log-prob in nats under the
    /// distribution it was sampled from, see [`Sampler::sample`]), with continuous batching
    /// over the paged KV cache.
    pub fn generate(&mut self, requests: &[GenerationRequest]) -> EngineResult<Vec<Completion>> {
        let reqs: Vec<EngineRequest> = requests.iter().cloned().map(Into::into).collect();
        self.generate_with_stops(&reqs, None)
    }

    /// [`Engine::generate`] that also records, per request, the experts every fed token
    /// (prompt and completion but the last sampled token) was routed to in each sparse layer
    /// (rollout routing replay; positions 0.. of `prompt ++ completion`). The trainer replays
    /// them with `RouterTrace::replaying(ExpertChoices::for_batch(..))`. Dense models get
    /// empty records.
    pub fn generate_with_routing(
        &mut self,
        requests: &[GenerationRequest],
    ) -> EngineResult<Vec<(Completion, ExpertChoices)>> {
        let reqs: Vec<EngineRequest> = requests.iter().cloned().map(Into::into).collect();
        let sparse = self.weights.num_sparse_layers();
        let top_k = self.model.moe.as_ref().map_or(0, |m| m.num_experts_per_tok);
        let mut log = RouteLog::new(reqs.len(), sparse, top_k);
        let out = self.generate_logged(&reqs, None, Some(&mut log))?;
        let fed: Vec<usize> = requests
            .iter()
            .zip(&out)
            .map(|(r, c)| (r.prompt.len() + c.tokens.len()).saturating_sub(1))
            .collect();
        Ok(out.into_iter().zip(log.into_choices(&fed)).collect())
    }

    /// [`Engine::generate`] with stop strings; `detokenize` turns completion ids into text
    /// and is required when any request has stop strings.
    pub fn generate_with_stops(
        &mut self,
        requests: &[EngineRequest],
        detokenize: Option<Detokenize<'_>>,
    ) -> EngineResult<Vec<Completion>> {
        self.generate_logged(requests, detokenize, None)
    }

    /// [`Engine::generate_with_stops`], recording the routing in `log` when given.
    fn generate_logged(
        &mut self,
        requests: &[EngineRequest],
        detokenize: Option<Detokenize<'_>>,
        mut log: Option<&mut RouteLog>,
    ) -> EngineResult<Vec<Completion>> {
        self.validate(requests, detokenize.is_some())?;
        let mut out: Vec<Completion> = requests
            .iter()
            .map(|_| Completion {
                tokens: vec![],
                logprobs: vec![],
                finish_reason: FinishReason::Length,
            })
            .collect();
        let stops: Vec<Vec<u32>> = requests
            .iter()
            .map(|r| {
                let mut s = r.request.stop_token_ids.clone();
                if !r.request.ignore_eos {
                    s.extend_from_slice(&self.model.eos_token_id);
                }
                s
            })
            .collect();
        let rules = StopRules {
            requests,
            stops: &stops,
            detokenize,
        };
        // Routing replay records the experts of every fed token, so nothing is skipped.
        let mut sched = Scheduler::new(
            self.new_sequences(requests),
            self.config.max_batched_tokens,
            self.config.max_running,
            log.is_none(),
        );
        while !self.all_ranks_done(sched.is_done())? {
            if sched.is_done() {
                // Expert-parallel: peers still generate and need this rank's experts.
                self.weights.serve_experts_idle()?;
                continue;
            }
            self.generate_step(&mut sched, &rules, &mut out, log.as_deref_mut())?;
        }
        self.stats.preemptions += sched.preemptions;
        self.stats.cow_copies += sched.cow_copies;
        self.stats.prefix_cache_hit_tokens += sched.cache_hit_tokens;
        Ok(out)
    }

    /// One sequence per request, waiting (finished when `max_new_tokens` is 0); with prefix
    /// sharing, a request whose prompt equals an earlier one's awaits a fork from that
    /// leader instead of prefilling it again.
    fn new_sequences(&self, requests: &[EngineRequest]) -> Vec<Sequence> {
        let mut leaders: HashMap<&[u32], usize> = HashMap::new();
        let mut seqs = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            let req = &r.request;
            let mut state = if req.max_new_tokens == 0 {
                SeqState::Finished
            } else {
                SeqState::Waiting
            };
            if state == SeqState::Waiting && self.config.prefix_sharing {
                match leaders.get(req.prompt.as_slice()) {
                    Some(&l) => {
                        state = SeqState::AwaitFork;
                        let leader: &mut Sequence = &mut seqs[l];
                        leader.followers.push(i);
                    }
                    None => {
                        leaders.insert(req.prompt.as_slice(), i);
                    }
                }
            }
            seqs.push(Sequence::new(
                i,
                &req.prompt,
                Sampler::new(req.sampling.clone()),
                state,
            ));
        }
        seqs
    }

    /// One engine step: schedules a batch, runs it, advances the sequences, samples one token
    /// for each sequence whose tokens are all computed (and its forked followers) and applies
    /// it to `out`, finishing the sequences that stop or reach their length.
    fn generate_step(
        &mut self,
        sched: &mut Scheduler,
        rules: &StopRules<'_>,
        out: &mut [Completion],
        mut log: Option<&mut RouteLog>,
    ) -> EngineResult<()> {
        let vocab = self.model.vocab_size;
        let plan = sched.schedule(&mut self.pool)?;
        if plan.is_empty() {
            return Err(EngineError::Stalled(
                "nothing could be scheduled although sequences are waiting".into(),
            ));
        }
        let logits = self.run_plan(sched, &plan, log.as_deref_mut())?;
        let (draws, rows) = self.advance(sched, &plan, log);
        if logits.len() < rows * vocab {
            return Err(EngineError::Stalled("missing logits row".into()));
        }
        let sampled = sample_rows(&mut sched.seqs, &draws, &logits, vocab);
        self.apply_samples(sched, sampled, rules, out);
        self.stats.steps += 1;
        Ok(())
    }

    /// Marks each planned chunk computed (counting prefill and decode tokens) and, for the
    /// sequences now fully computed, forks their followers (recording the forks in `log`).
    /// Returns which sequence samples from which logits row (followers share their
    /// leader's row) and the number of logits rows the step produced.
    fn advance(
        &mut self,
        sched: &mut Scheduler,
        plan: &[Planned],
        mut log: Option<&mut RouteLog>,
    ) -> (Vec<(usize, usize)>, usize) {
        let mut draws: Vec<(usize, usize)> = Vec::new();
        let mut row = 0;
        for p in plan {
            let s = &mut sched.seqs[p.seq];
            let before = s.computed;
            s.computed += p.chunk;
            if before + 1 == s.tokens.len() && s.tokens.len() > s.prompt_len {
                self.stats.decode_tokens += 1;
            } else {
                self.stats.prefill_tokens += p.chunk as u64;
            }
            let done = s.computed == s.tokens.len();
            sched.cache_full_blocks(p.seq, &mut self.pool);
            if !done {
                continue;
            }
            draws.push((p.seq, row));
            if !sched.seqs[p.seq].followers.is_empty() {
                let (forked, shared) = sched.fork_followers(p.seq, &mut self.pool);
                if let Some(l) = log.as_deref_mut() {
                    for &f in &forked {
                        l.fork(p.seq, f, sched.seqs[p.seq].computed);
                    }
                }
                self.stats.forked_sequences += forked.len() as u64;
                self.stats.prefix_shared_blocks += shared;
                draws.extend(forked.into_iter().map(|f| (f, row)));
            }
            row += 1;
        }
        (draws, row)
    }

    /// Appends each sampled `(sequence, token, log-prob)` to its sequence and completion, in
    /// order, and finishes the sequence on a stop token or stop string (finish reason
    /// `Stop`) or at `max_new_tokens`.
    fn apply_samples(
        &mut self,
        sched: &mut Scheduler,
        sampled: Vec<(usize, u32, f32)>,
        rules: &StopRules<'_>,
        out: &mut [Completion],
    ) {
        for (idx, tok, lp) in sampled {
            let s = &mut sched.seqs[idx];
            let req = &rules.requests[s.req];
            s.tokens.push(tok);
            let c = &mut out[s.req];
            c.tokens.push(tok);
            c.logprobs.push(lp);
            let stop_tok = rules.stops[s.req].contains(&tok);
            let stop_str = match rules.detokenize {
                Some(d) => hits_stop_string(&req.stop_strings, &c.tokens, d),
                None => false,
            };
            if stop_tok || stop_str {
                c.finish_reason = FinishReason::Stop;
                sched.finish(idx, &mut self.pool);
            } else if c.tokens.len() >= req.request.max_new_tokens {
                sched.finish(idx, &mut self.pool);
            }
        }
    }

    /// Whether generation is over: `done` here, and, expert-parallel, on every rank of the
    /// group too (each rank runs its own requests, so the ranks step together until the
    /// last one finishes; one all-reduce per step).
    fn all_ranks_done(&self, done: bool) -> EngineResult<bool> {
        let Some(ep) = &self.experts else {
            return Ok(done);
        };
        let mut flag = [f32::from(u8::from(done))];
        ep.comm()
            .all_reduce_mean_f32(&mut [&mut flag])
            .map_err(candle_core::Error::wrap)?;
        Ok(flag[0] >= 1.0)
    }

    /// Runs one scheduled step and returns the wanted logits, row-major `[rows * V]`.
    fn run_plan(
        &mut self,
        sched: &Scheduler,
        plan: &[Planned],
        log: Option<&mut RouteLog>,
    ) -> EngineResult<Vec<f32>> {
        let items: Vec<StepItem<'_>> = plan
            .iter()
            .map(|p| {
                let s = &sched.seqs[p.seq];
                let end = s.computed + p.chunk;
                StepItem {
                    table: &s.blocks,
                    start: s.computed,
                    tokens: &s.tokens[s.computed..end],
                    want: if end == s.tokens.len() {
                        WantLogits::Last
                    } else {
                        WantLogits::None
                    },
                }
            })
            .collect();
        let mut step = log.is_some().then(Vec::new);
        let logits = paged_forward(
            &self.weights,
            self.dims,
            &self.inv_freq,
            &mut self.pool,
            &items,
            Head::Logits,
            StepRouting {
                record: step.as_mut(),
                replay: None,
            },
        )?;
        if let (Some(log), Some(step)) = (log, step) {
            let starts: Vec<usize> = plan.iter().map(|p| sched.seqs[p.seq].computed).collect();
            log.write(plan, &starts, &step);
        }
        Ok(logits.unwrap_or_default())
    }

    fn validate(&self, requests: &[EngineRequest], has_detok: bool) -> EngineResult<()> {
        let vocab = self.model.vocab_size;
        let bs = self.config.block_size;
        for (index, r) in requests.iter().enumerate() {
            let bad = |message: String| EngineError::InvalidRequest { index, message };
            let req = &r.request;
            if req.prompt.is_empty() {
                return Err(bad("prompt is empty".into()));
            }
            if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
                return Err(bad(format!(
                    "prompt token {t} is not below vocab_size {vocab}"
                )));
            }
            req.sampling.validate().map_err(|e| bad(e.to_string()))?;
            if !r.stop_strings.is_empty() && !has_detok {
                return Err(bad(
                    "stop strings need a detokenizer (generate_with_stops(.., Some(f)))".into(),
                ));
            }
            let tokens = req.prompt.len() + req.max_new_tokens;
            let needed = tokens.div_ceil(bs);
            if needed > self.pool.num_blocks() {
                return Err(EngineError::Capacity {
                    index,
                    tokens,
                    needed,
                    block_size: bs,
                    num_blocks: self.pool.num_blocks(),
                });
            }
        }
        Ok(())
    }

    /// Log-prob (nats) of each next token of each sequence under the served weights:
    /// `seq[t+1]` given `seq[..=t]`, `len - 1` values per sequence (the same quantity as
    /// [`CausalLm::next_token_logprobs`]). Sequences need at least 2 tokens.
    pub fn score(&mut self, sequences: &[Vec<u32>]) -> EngineResult<Vec<Vec<f32>>> {
        self.score_under(sequences, TokenDistribution::MODEL)
    }

    /// [`Engine::score`] under `dist` (tempered, truncated; the kept set widened to reach each
    /// scored token), the same values as the trainer's
    /// [`CausalLm::next_token_outputs`](crate::CausalLm::next_token_outputs) with `dist`.
    pub fn score_under(
        &mut self,
        sequences: &[Vec<u32>],
        dist: TokenDistribution,
    ) -> EngineResult<Vec<Vec<f32>>> {
        self.score_from(sequences, &vec![0; sequences.len()], dist)
    }

    /// [`Engine::score_under`] at the next-token positions from `from[i]` on only (a rollout's
    /// response: `from[i]` = its prompt's length less one): `len - 1 - from[i]` values per
    /// sequence, none where `from[i] >= len - 1`. The earlier tokens still run through the
    /// decoder, since the scored ones attend to them, but the LM head skips their rows.
    pub fn score_from(
        &mut self,
        sequences: &[Vec<u32>],
        from: &[usize],
        dist: TokenDistribution,
    ) -> EngineResult<Vec<Vec<f32>>> {
        let scorer = Scorer {
            dist,
            weights: &self.weights,
            dims: self.dims,
            inv_freq: &self.inv_freq,
            vocab: self.model.vocab_size,
            max_batched_tokens: self.config.max_batched_tokens,
            replay: None,
        };
        scorer.score(&mut self.pool, ScoreRequest { sequences, from })
    }

    /// Replaces the served weights with `update` after verifying them: every tensor's
    /// checksum on the engine's copy must equal the sender's, and, with a `probe`, the
    /// engine's log-probs on the probe must be within `probe.tolerance · max(1, |log-prob|)` of
    /// the trainer's.
    /// On any failure the engine keeps its previous weights and version and returns
    /// [`EngineError::RefitRejected`]. `update.version` must exceed the current version.
    pub fn refit(
        &mut self,
        update: &WeightUpdate,
        probe: Option<&Probe>,
    ) -> EngineResult<RefitReport> {
        let t0 = Instant::now();
        let kept = self.stats.version;
        let reject = |reason: String| EngineError::RefitRejected {
            version: update.version,
            kept,
            reason,
        };
        if update.version <= kept {
            return Err(reject(format!(
                "version {} is not newer than the served version {kept}",
                update.version
            )));
        }
        let (staged, sums) = EngineWeights::build(
            &self.model,
            (&update.tensors, update.merge.as_ref()),
            self.config.quant,
            &self.device,
            self.experts.as_ref(),
            Some((&self.weights, &self.sums)),
        )?;
        let tv = Instant::now();
        let names = verify_checksums(&sums, update).map_err(reject)?;
        let (mut max_diff, mut mean_diff) = (None, None);
        if let Some(p) = probe {
            let (max, mean) = self.check_probe(&staged, p, reject)?;
            max_diff = Some(max);
            mean_diff = Some(mean);
        }
        let verify_seconds = tv.elapsed().as_secs_f64();
        self.stats.weight_bytes = staged.linear_bytes();
        self.weights = staged;
        self.stats.version = update.version;
        // Cached K/V were computed by the old weights.
        self.pool.clear_prefix_cache();
        let bytes = names
            .iter()
            .filter_map(|n| update.tensors.get(*n))
            .map(|t| t.elem_count() * 4)
            .sum();
        let tensors = names.len();
        self.sums = sums;
        Ok(RefitReport {
            version: update.version,
            previous_version: kept,
            tensors,
            bytes,
            checksums_ok: tensors,
            probe_max_abs_diff: max_diff,
            probe_mean_abs_diff: mean_diff,
            seconds: t0.elapsed().as_secs_f64(),
            verify_seconds,
        })
    }

    /// Scores probe `p` under the `staged` weights and compares with the trainer's
    /// log-probs; returns the max and mean absolute difference (nats), or `reject`'s error
    /// when the probe is malformed or a difference exceeds `p.tolerance · max(1, |log-prob|)`
    /// (or is NaN).
    fn check_probe(
        &mut self,
        staged: &EngineWeights,
        p: &Probe,
        reject: impl Fn(String) -> EngineError,
    ) -> EngineResult<(f32, f32)> {
        if p.tokens.len() < 2 || p.expected_logprobs.len() + 1 != p.tokens.len() {
            return Err(reject(format!(
                "probe has {} tokens and {} expected log-probs (need n >= 2 and n - 1)",
                p.tokens.len(),
                p.expected_logprobs.len()
            )));
        }
        let scorer = Scorer {
            weights: staged,
            dims: self.dims,
            inv_freq: &self.inv_freq,
            vocab: self.model.vocab_size,
            max_batched_tokens: self.config.max_batched_tokens,
            dist: TokenDistribution::MODEL,
            replay: p.routing.as_ref().map(std::slice::from_ref),
        };
        let request = ScoreRequest {
            sequences: std::slice::from_ref(&p.tokens),
            from: &[0],
        };
        let got = scorer
            .score(&mut self.pool, request)?
            .pop()
            .unwrap_or_default();
        let diffs: Vec<f32> = got
            .iter()
            .zip(&p.expected_logprobs)
            .map(|(a, b)| (a - b).abs())
            .collect();
        // f32 rounding grows with a log-prob's magnitude (a probe token the model finds
        // very unlikely sits at tens of nats), so each difference is judged against
        // `tolerance · max(1, |expected|)`.
        let over = diffs
            .iter()
            .zip(&p.expected_logprobs)
            .any(|(d, e)| *d > p.tolerance * e.abs().max(1.0));
        let max = diffs.iter().copied().fold(0f32, f32::max);
        let max = if diffs.iter().any(|d| d.is_nan()) {
            f32::NAN
        } else {
            max
        };
        let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
        if max.is_nan() || over {
            return Err(reject(format!(
                "probe log-probs differ from the trainer's by up to {max} nats \
                 (tolerance {} · max(1, |log-prob|))",
                p.tolerance
            )));
        }
        Ok((max, mean))
    }
}

/// What ends a completion in [`Engine::generate_logged`]: per request, its stop token ids
/// (stop ids, then eos unless ignored), its stop strings (with `detokenize`) and its
/// `max_new_tokens`.
struct StopRules<'a> {
    requests: &'a [EngineRequest],
    stops: &'a [Vec<u32>],
    detokenize: Option<Detokenize<'a>>,
}

/// Compares the engine copy's checksums `sums` with the sender's, in name order. Returns
/// the verified tensor names (sorted), or the rejection reason listing every tensor whose
/// checksum differs or is missing.
fn verify_checksums<'a>(
    sums: &'a HashMap<String, u64>,
    update: &WeightUpdate,
) -> Result<Vec<&'a String>, String> {
    let mut names: Vec<&String> = sums.keys().collect();
    names.sort();
    let mut bad = vec![];
    for name in &names {
        match update.checksums.get(*name) {
            Some(expected) if *expected == sums[*name] => {}
            Some(_) => bad.push(format!("{name} (checksum mismatch)")),
            None => bad.push(format!("{name} (no checksum from the sender)")),
        }
    }
    if !bad.is_empty() {
        return Err(format!(
            "{} of {} tensors failed verification: {}",
            bad.len(),
            names.len(),
            bad.join(", ")
        ));
    }
    Ok(names)
}

/// Samples the next token of each `(sequence, logits row)` in `draws`, in parallel over the
/// draws (each sequence has its own seeded RNG, so the result does not depend on the order).
/// Returns `(sequence, token, log-prob)` in `draws` order.
fn sample_rows(
    seqs: &mut [Sequence],
    draws: &[(usize, usize)],
    logits: &[f32],
    vocab: usize,
) -> Vec<(usize, u32, f32)> {
    let mut row_of = vec![usize::MAX; seqs.len()];
    for &(seq, row) in draws {
        row_of[seq] = row;
    }
    let mut work: Vec<(usize, &mut Sequence)> = seqs
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| row_of[*i] != usize::MAX)
        .collect();
    let picked: Vec<(usize, u32, f32)> = work
        .par_iter_mut()
        .map(|(idx, s)| {
            let row = &logits[row_of[*idx] * vocab..(row_of[*idx] + 1) * vocab];
            let (tok, lp) = sample_row(&mut s.sampler, row);
            (*idx, tok, lp)
        })
        .collect();
    // Back into draws order (the order the loop applied them in before).
    let mut by_seq = vec![None; seqs.len()];
    for p in picked {
        by_seq[p.0] = Some(p);
    }
    draws.iter().filter_map(|&(seq, _)| by_seq[seq]).collect()
}

/// [`Sampler::sample`] compiled for the widest vectors this CPU has (the same code and bits
/// at every width: no reassociation, no fused multiply-adds).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn sample_row(sampler: &mut Sampler, row: &[f32]) -> (u32, f32) {
    sampler.sample(row)
}
