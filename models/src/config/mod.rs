//! A model's description: `config.json` read and checked ([`model_config`], `json.rs`,
//! [`bounds`]), the families that declare their keys and parameters ([`family`]), the parameter
//! layout and named sizes.
//!
//! **The model declaration.** A tensor name is spelled once; everything that touches weights
//! reads the declaration:
//! * [`param_spec`][]: `ParamSpec`, an HF tensor name, shape and `ParamKind` (embedding, linear
//!   weight, router weight, bias, norm). The kind decides the random init (Normal(0, 0.02),
//!   ones, zeros), weight decay (linear and router weights) and the engine's `DtypePolicy`
//!   (linear weights may be quantized; routers and the rest stay f32). Seeded init in
//!   declaration order.
//! * [`layout`][]: the declaration as structured data: `LinearParams`, `AttentionParams` (with
//!   optional per-head `q_norm`/`k_norm`), `MlpParams`, `FeedForwardParams` (a dense MLP or
//!   `MoeParams`: router, experts, optional `SharedExpertParams`, and the `PackedExpertNames`
//!   of the same tensors), `LayerParams`, `BackboneParams` (canonical order: embedding; per
//!   layer input norm, q, k, v, o, q/k norms, post-attention norm, then gate, up, down or
//!   router, experts, shared expert and its gate, weight before bias; final norm).
//!   `dense_backbone` builds the HF Llama-style layout for given biases; `moe_backbone`
//!   (`moe/layout.rs`) replaces the sparse layers' MLPs with the family's `MoeNames`.
//! * [`family`][]: `Family` (`family/kind.rs`) and its registry, one file per family implementing
//!   `FamilyDecl`: `model_type`, class prefix, the config.json keys only it reads and writes
//!   (biases, sliding windows, experts, with HF's defaults), its biases, its checks
//!   (`validate`), its preset MoE sizes, and its backbone layout (the dense one unless it
//!   overrides `backbone`). `ModelConfig::backbone_params()` (`derived.rs`) asks it.
//! * The heads (`nn/head.rs`): the `Head` trait and its three implementations, each with its HF
//!   class suffix, its parameters and how it binds them: `LmHead` (`lm_head.weight`, or the
//!   embedding when tied), `ValueHead` (`score` Linear(H, 1) with bias,
//!   `*ForTokenClassification`), `RewardHead` (`score.weight` without bias,
//!   `*ForSequenceClassification`). `Model<H: Head>` (`nn/model.rs`) holds the backbone's
//!   `ParamStore` and `Decoder` plus a head, and every constructor (`from_weights`,
//!   `from_backbone`, `init_random*`, `load`, `load_with_new_head`), `save` and the weight
//!   accessors once; `CausalLm`, `ValueModel` and `RewardModel` are type aliases whose files
//!   add only the head's forward.
//! * `MoeConfig` (`moe/config.rs`, `ModelConfig::moe`): experts, top-k, expert width,
//!   `norm_topk_prob`, which layers are sparse (`decoder_sparse_step`, `mlp_only_layers`), the
//!   shared expert, `router_aux_loss_coef`, `output_router_logits`; its validation.
//! * `json.rs` and `raw.rs`: config.json as a serde struct (`RawConfig`; unknown keys kept in
//!   `extra` for the round trip) and the rules serde cannot say: derived defaults (`head_dim`,
//!   `num_key_value_heads`, `rope_theta` 10000, `rms_norm_eps` 1e-6, `max_position_embeddings`
//!   2048), the RoPE variants (`rope_scaling` or v5 `rope_parameters`; default, linear,
//!   llama3), `layer_types`. Type errors name the file and the key path (`serde_path_to_error`,
//!   e.g. `rope_scaling.factor`, `eos_token_id[1]`).
//! * A fresh model folder (`io/init_dir.rs`, `init_model_dir`): the one writer, used by
//!   `oxalign init-model` and by a run without `model.path` (`<run>/init`), with the vocabulary
//!   of [`preset`]'s `Preset::vocab_size`.
//!
//! Readers: `io/checkpoint.rs` (`read_checkpoint`) turns packed experts into the declared names
//! (`moe/expert_layout.rs`); `ParamStore` (`io/param_store.rs`) validates and keeps the specs
//! (`spec(name)`); the training modules pick their tensors by the declared names;
//! `engine/weights.rs` fuses q/k/v and gate/up from the declared parts and quantizes by
//! `DtypePolicy`; the trainer's AdamW groups decay by `ParamKind::decays`
//! (`oxalign_rlhf::optim::AdamW::for_params`, `rlhf/tests/decay_groups.rs`). Adding a family: a
//! file in `family/` implementing `FamilyDecl`, plus its variant in `family/kind.rs` and its
//! match arm in `family/mod.rs`.

pub mod bounds;
mod derived;
pub mod family;
pub(crate) mod json;
pub mod layout;
pub mod model_config;
pub(crate) mod param_spec;
pub mod preset;
pub(crate) mod raw;
mod validate;
