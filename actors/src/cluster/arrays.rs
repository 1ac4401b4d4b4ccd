//! Which fields of a call travel as tensors: [`Arrays::take`] moves a message's numeric
//! arrays — token ids, per-token f32 arrays, rewards, log-probs — into a [`Blob`] under
//! their field paths (`batch.seqs.prompt_ids`, `batch.advantages`, `tokens`, ...), leaving
//! empty placeholders for the MessagePack part; [`Arrays::put`] puts them back on the other
//! side. Everything else (ids, finish reasons, settings, texts, summaries, MoE routing
//! records) stays in MessagePack.

use super::blob::{Blob, Tensors};
use super::error::TensorError;
use super::wire::{Request, Response};
use crate::batch::{ExperienceBatch, RolloutBatch, RolloutRequest, Sequences, TokenArray};
use crate::roles::{DpoWork, RewardRequest};

/// A value whose arrays travel as tensors.
pub(crate) trait Arrays {
    /// Moves the arrays into `blob`, named `at.FIELD`.
    fn take(&mut self, at: &str, blob: &mut Blob);
    /// Puts them back from `t`.
    fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError>;
}

/// `at.field` (`field` at the top).
fn path(at: &str, field: &str) -> String {
    match at {
        "" => field.to_string(),
        _ => format!("{at}.{field}"),
    }
}

impl Arrays for TokenArray {
    fn take(&mut self, at: &str, blob: &mut Blob) {
        let a = std::mem::take(self);
        blob.f32(at.to_string(), vec![a.rows(), a.cols()], a.data());
    }

    fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        *self = t.array(at)?;
        Ok(())
    }
}

/// Present in the MessagePack part (as an empty placeholder) exactly when it travels.
impl<A: Arrays> Arrays for Option<A> {
    fn take(&mut self, at: &str, blob: &mut Blob) {
        if let Some(a) = self {
            a.take(at, blob);
        }
    }

    fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        match self {
            Some(a) => a.put(at, t),
            None => Ok(()),
        }
    }
}

impl Arrays for Vec<f32> {
    fn take(&mut self, at: &str, blob: &mut Blob) {
        let v = std::mem::take(self);
        blob.f32(at.to_string(), vec![v.len()], &v);
    }

    fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        *self = t.vec_f32(at, None)?;
        Ok(())
    }
}

impl Arrays for Sequences {
    fn take(&mut self, at: &str, blob: &mut Blob) {
        let pairs = std::mem::take(&mut self.pairs);
        blob.ragged_u32(&path(at, "prompt_ids"), pairs.iter().map(|p| &p.0[..]));
        blob.ragged_u32(&path(at, "response_ids"), pairs.iter().map(|p| &p.1[..]));
    }

    fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        let prompts = t.ragged_u32(&path(at, "prompt_ids"), None)?;
        let responses = t.ragged_u32(&path(at, "response_ids"), Some(prompts.len()))?;
        self.pairs = prompts.into_iter().zip(responses).collect();
        Ok(())
    }
}

impl Arrays for RolloutRequest {
    fn take(&mut self, at: &str, blob: &mut Blob) {
        let prompts: Vec<Vec<u32>> = self
            .samples
            .iter_mut()
            .map(|s| std::mem::take(&mut s.prompt))
            .collect();
        blob.ragged_u32(&path(at, "prompt_ids"), prompts.iter().map(Vec::as_slice));
    }

    fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        let rows = Some(self.samples.len());
        let prompts = t.ragged_u32(&path(at, "prompt_ids"), rows)?;
        for (s, p) in self.samples.iter_mut().zip(prompts) {
            s.prompt = p;
        }
        Ok(())
    }
}

impl Arrays for RolloutBatch {
    fn take(&mut self, at: &str, blob: &mut Blob) {
        let mut prompts = Vec::with_capacity(self.samples.len());
        let mut responses = Vec::with_capacity(self.samples.len());
        let mut logprobs = Vec::with_capacity(self.samples.len());
        for s in &mut self.samples {
            prompts.push(std::mem::take(&mut s.prompt));
            responses.push(std::mem::take(&mut s.response));
            logprobs.push(std::mem::take(&mut s.logprobs));
        }
        blob.ragged_u32(&path(at, "prompt_ids"), prompts.iter().map(Vec::as_slice));
        blob.ragged_u32(
            &path(at, "response_ids"),
            responses.iter().map(Vec::as_slice),
        );
        blob.ragged_f32(&path(at, "logprobs"), logprobs.iter().map(Vec::as_slice));
    }

    fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        let rows = Some(self.samples.len());
        let prompts = t.ragged_u32(&path(at, "prompt_ids"), rows)?;
        let responses = t.ragged_u32(&path(at, "response_ids"), rows)?;
        let logprobs = t.ragged_f32(&path(at, "logprobs"), rows)?;
        let rows = prompts.into_iter().zip(responses).zip(logprobs);
        for (s, ((p, r), l)) in self.samples.iter_mut().zip(rows) {
            (s.prompt, s.response, s.logprobs) = (p, r, l);
        }
        Ok(())
    }
}

/// The fields of a struct, each at its own path.
macro_rules! fields {
    ($ty:ty { $($f:ident),* }) => {
        impl Arrays for $ty {
            fn take(&mut self, at: &str, blob: &mut Blob) {
                $(Arrays::take(&mut self.$f, &path(at, stringify!($f)), blob);)*
            }

            fn put(&mut self, at: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
                $(Arrays::put(&mut self.$f, &path(at, stringify!($f)), t)?;)*
                Ok(())
            }
        }
    };
}

fields!(ExperienceBatch {
    seqs,
    old_logprobs,
    advantages,
    ref_logprobs,
    rollout_logprobs,
    old_values,
    returns
});
fields!(DpoWork {
    chosen,
    rejected,
    ref_chosen,
    ref_rejected
});

impl Arrays for Request {
    fn take(&mut self, _: &str, blob: &mut Blob) {
        match self {
            Request::Generate { request, .. } => request.take("request", blob),
            Request::Logprobs { seqs, .. }
            | Request::Rewards(RewardRequest { seqs, .. })
            | Request::Values(seqs)
            | Request::Sft { seqs, .. } => seqs.take("seqs", blob),
            Request::TrainPolicy(w) => w.batch.take("batch", blob),
            Request::TrainCritic(w) => w.batch.take("batch", blob),
            Request::Dpo(w) => w.take("", blob),
            _ => {}
        }
    }

    fn put(&mut self, _: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        match self {
            Request::Generate { request, .. } => request.put("request", t),
            Request::Logprobs { seqs, .. }
            | Request::Rewards(RewardRequest { seqs, .. })
            | Request::Values(seqs)
            | Request::Sft { seqs, .. } => seqs.put("seqs", t),
            Request::TrainPolicy(w) => w.batch.put("batch", t),
            Request::TrainCritic(w) => w.batch.put("batch", t),
            Request::Dpo(w) => w.put("", t),
            _ => Ok(()),
        }
    }
}

impl Arrays for Response {
    fn take(&mut self, _: &str, blob: &mut Blob) {
        match self {
            Response::Batch(b) => b.take("batch", blob),
            Response::Tokens(a) => a.take("tokens", blob),
            Response::Rewards(v) => v.take("rewards", blob),
            _ => {}
        }
    }

    fn put(&mut self, _: &str, t: &mut Tensors<'_>) -> Result<(), TensorError> {
        match self {
            Response::Batch(b) => b.put("batch", t),
            Response::Tokens(a) => a.put("tokens", t),
            Response::Rewards(v) => v.put("rewards", t),
            _ => Ok(()),
        }
    }
}
