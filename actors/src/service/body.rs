//! Reading a service's answer without trusting its size: a body announced or found to
//! be longer than [`MAX_RESPONSE_BYTES`] is refused as soon as that is known, so a service
//! cannot make the trainer buffer more than the limit (plus one network chunk).

use super::error_chain;

/// The largest answer read from a service, bytes (8 MiB: hundreds of thousands of
/// rewards).
pub(crate) const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// The body is longer than the limit.
    #[error("the answer is over the limit of {limit} bytes")]
    TooLarge {
        /// The limit, bytes.
        limit: usize,
    },
    /// The transfer failed.
    #[error("reading the body: {0}")]
    Read(String),
}

/// The body of `response`, at most `limit` bytes: refused from its `Content-Length` when that
/// is over, else read chunk by chunk and refused once past it.
pub(crate) async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| BodyError::Read(error_chain(&e)))?
    {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `": <first 200 bytes of the body>"`, or nothing for an empty body.
pub(crate) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}
