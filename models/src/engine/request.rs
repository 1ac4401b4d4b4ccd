//! The engine's request type: a [`GenerationRequest`] plus stop strings, and the check that
//! ends a completion when its decoded text contains one. Decoding is the caller's function
//! (e.g. a closure over `Tokenizer::decode`); no tokenizer is owned here.

use crate::nn::generate::GenerationRequest;

/// Turns completion token ids into text (used only for stop strings).
pub type Detokenize<'a> = &'a dyn Fn(&[u32]) -> String;

/// A generation request with optional stop strings.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    /// Prompt, token budget, sampling, stop token ids, eos handling.
    pub request: GenerationRequest,
    /// The completion ends (reason `Stop`) as soon as its decoded text contains one of these;
    /// the token that completed the string is the last token. Needs a detokenizer.
    pub stop_strings: Vec<String>,
}

impl From<GenerationRequest> for EngineRequest {
    fn from(request: GenerationRequest) -> Self {
        EngineRequest {
            request,
            stop_strings: vec![],
        }
    }
}

/// Whether the decoded `completion` contains one of `stops`.
pub(crate) fn hits_stop_string(
    stops: &[String],
    completion: &[u32],
    detok: Detokenize<'_>,
) -> bool {
    if stops.is_empty() {
        return false;
    }
    let text = detok(completion);
    stops
        .iter()
        .any(|s| !s.is_empty() && text.contains(s.as_str()))
}
