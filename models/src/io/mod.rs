//! Model folders on disk: reading and writing HF safetensors folders, initialising a fresh
//! one, the trainable parameter store, and the machine memory sizes are checked against.

pub mod checkpoint;
pub(crate) mod fused_projections;
pub(crate) mod init_dir;
pub mod machine_memory;
pub mod param_store;
pub(crate) mod text_decoder;
pub mod tokenizer_files;
