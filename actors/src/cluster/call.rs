//! One call message (a request or an answer) as bytes: `u32` LE, the length of the
//! MessagePack part; the [`Envelope`] as MessagePack with its arrays emptied; then those
//! arrays as one safetensors buffer (`arrays.rs` says which fields, `blob.rs` how; empty when
//! the call has none). Decoding puts the arrays back and refuses a malformed buffer with
//! [`DecodeError::Tensors`], which names the call, so only that call fails.

use super::arrays::Arrays;
use super::blob::{Blob, Tensors};
use super::error::{DecodeError, EncodeError};
use super::wire::{decode, encode, Envelope, Request, Response};
use serde::{de::DeserializeOwned, Serialize};

/// The bytes of call `id` with `request`.
pub fn encode_request(id: u64, request: Request) -> Result<Vec<u8>, EncodeError> {
    encode_call(id, request)
}

/// The call a controller sent.
pub fn decode_request(bytes: &[u8]) -> Result<Envelope<Request>, DecodeError> {
    decode_call(bytes, Request::kind)
}

/// The bytes of the answer `response` to call `id`.
pub fn encode_response(id: u64, response: Response) -> Result<Vec<u8>, EncodeError> {
    encode_call(id, response)
}

/// An answer a worker sent.
pub fn decode_response(bytes: &[u8]) -> Result<Envelope<Response>, DecodeError> {
    decode_call(bytes, Response::kind)
}

fn encode_call<T: Arrays + Serialize>(id: u64, mut body: T) -> Result<Vec<u8>, EncodeError> {
    let mut blob = Blob::default();
    body.take("", &mut blob);
    let tensors = blob.into_bytes()?;
    let head = encode(&Envelope { id, body })?;
    let mut out = Vec::with_capacity(4 + head.len() + tensors.len());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(&tensors);
    Ok(out)
}

fn decode_call<T: Arrays + DeserializeOwned>(
    bytes: &[u8],
    kind: fn(&T) -> &'static str,
) -> Result<Envelope<T>, DecodeError> {
    let layout = |what: String| DecodeError::Layout {
        len: bytes.len(),
        what,
    };
    let Some((len, rest)) = bytes.split_first_chunk::<4>() else {
        return Err(layout(
            "expected a 4-byte length of the MessagePack part first".into(),
        ));
    };
    let len = u32::from_le_bytes(*len) as usize;
    if len > rest.len() {
        return Err(layout(format!(
            "its MessagePack part of {len} bytes runs past the end"
        )));
    }
    let (head, tensors) = rest.split_at(len);
    let mut env: Envelope<T> = decode(head)?;
    let (id, call) = (env.id, kind(&env.body));
    let failed = move |source| DecodeError::Tensors { id, call, source };
    let mut t = Tensors::parse(tensors).map_err(failed)?;
    let put = env.body.put("", &mut t).and_then(|()| t.finish());
    put.map_err(failed)?;
    Ok(env)
}
