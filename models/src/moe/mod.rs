//! Mixture of experts: the config, the parameter layout and the two checkpoint layouts of
//! experts, the router and what it chose, the sparse block, its auxiliary loss, and expert
//! parallelism (ownership, row exchange, the parallel forward).
//!
//! The files:
//! * [`config`][]: `MoeConfig`.
//! * [`layout`][]: a sparse layer's `{block}.gate` router `[E, H]` (kind `Router`),
//!   `{block}.experts.{e}.{gate,up,down}` (Mixtral's `block_sparse_moe` with `w1, w3, w2`),
//!   Qwen2-MoE's `shared_expert.*` and `shared_expert_gate` `[1, H]`; Qwen3's `q_norm`/`k_norm`
//!   `[head_dim]` (`crate::config::layout::add_qk_norms`, shared with dense Qwen3).
//! * [`expert_layout`][]: the packed layout (`mlp.experts.gate_up_proj` `[E, 2I, H]`,
//!   `mlp.experts.down_proj` `[E, H, I]`) split into the declared per-expert tensors on load.
//!   transformers 5 keeps experts packed in memory but writes per-expert names; oxalign always
//!   writes per-expert names.
//! * [`router`][]: logits (under `Precision::FakeInt8` by the engine's own f32 kernel,
//!   `nn/f32_linear.rs`), composed softmax, the top-k per token as host data (`top_k_experts`:
//!   largest first, lower index on ties; or replayed choices, `choose`) and the routing weights
//!   gathered from the softmax tensor, renormalised when `norm_topk_prob`. The weights stay in
//!   the autograd graph, so the router learns.
//! * [`block`][]: `SparseMoe`: every expert once over its tokens (`index_select`), outputs scaled
//!   by the routing weights and summed back with one `index_add`; plus
//!   `sigmoid(shared_expert_gate(x)) · shared_expert(x)`. Used by the training and KV-cached
//!   forwards.
//! * [`routing`][]: `RouterTrace` (a forward's router logits per sparse layer, still
//!   differentiable, and the experts it chose; or a replay of recorded ones) and
//!   `ExpertChoices` (`[sparse layer][token · k]`, `FREE` = route freely; `for_batch` lays
//!   per-sequence records onto a padded `[B, T]` batch, `for_packed` onto packed rows;
//!   `disagreement`).
//! * [`aux_loss`][]: `load_balancing_loss` and `Model::router_aux_loss(trace, mask)` /
//!   `router_aux_loss_coef()`, added to the policy's SFT and RL losses by `PolicyTrainer` (HF's
//!   coefficient, or `model.router_aux_loss_coef`).
//! * [`expert_parallel`][], [`expert_exchange`][] and `parallel.rs`: expert parallelism (see
//!   [`expert_parallel`]).
//!
//! **Traces and the engine.** `CausalLm::next_token_outputs_traced` (and
//! `Decoder::forward_traced`, `forward_packed_traced`) run the forward with a trace; the plain
//! forwards use a throwaway one. The engine's sparse block is `engine/moe_forward.rs`: router
//! in f32, the same top-k rule, experts in the engine's precision (int8 quantizes experts,
//! never routers).
//!
//! **Rollout routing replay.** `Engine::generate_with_routing` records the experts of every fed
//! token (`engine/route_log.rs`; a follower forked from a shared prompt gets the leader's
//! record); the trainer's forward with `RouterTrace::replaying(ExpertChoices::for_batch(..))`
//! uses the rollout's experts while its routing weights are still its own softmax.
//! `rl.routing_replay = true` feeds this through the policy role: its engine replicas record
//! (`EngineReplica::record_routing`), each `Sample` carries its `ExpertChoices`,
//! `RolloutBatch::sequences` puts them in `Sequences::routing`, and `TokenBatch::routing` (kept
//! row for row by `select_rows`, so minibatches and data-parallel shards keep theirs) makes
//! `PolicyTrainer`'s forwards replay them: π_old when the trainer scores it and every update's
//! π_θ, padded (`ExpertChoices::for_batch`) or packed (`PackedRows::routing`,
//! `ExpertChoices::for_packed`). The reference and the critic route on their own. The trace
//! counts how many replayed (token, layer) routings differ from the router's own top-k
//! (`RouterTrace::overridden`), reported per step as `routing_overridden`. The switch is
//! refused for a dense policy (`actors/src/recipe/moe_switches.rs`). The refit probe of an MoE
//! model carries the trainer's experts for its tokens (`Probe::routing`) and the engine scores
//! the probe with them (`engine/score.rs`, `StepRouting` in `engine/forward.rs`), so the probe
//! compares weights, not routing: an int8 router that flips a near tie no longer fails a
//! correct refit, while the checksums still cover the routers.
//!
//! **Parity.** `tools/moe_reference.py` writes the tiny fixtures (`qwen3_moe_tiny`,
//! `qwen3_moe_packed`, `mixtral_tiny`, `qwen2_moe_tiny`) that `models/tests/moe_parity.rs`
//! checks (log-probs of the trainer and the engine within 1e-4, greedy identical, the
//! load-balancing loss and the router's gradient against PyTorch autograd);
//! `models/tests/routing_replay.rs` checks replay in the model, `rlhf/tests/routing_replay.rs`
//! in the policy trainer (padded, packed, an int8 update) and `tests/train_routing_replay.rs`
//! end to end.

pub mod aux_loss;
pub mod block;
pub mod config;
pub(crate) mod expert_exchange;
pub(crate) mod expert_layout;
pub mod expert_parallel;
pub mod layout;
pub(crate) mod parallel;
pub mod router;
pub mod routing;
