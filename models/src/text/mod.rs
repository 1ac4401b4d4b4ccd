//! Text in and out of a model: the tokenizer of an HF folder, the byte-level tokenizer
//! oxalign writes for fresh models, and HF chat templates.

pub mod byte_tokenizer;
pub mod chat_template;
pub mod tokenizer;
pub mod tool_call;
pub mod turn_wrapper;
