//! Access control for every dashboard route: with a token, a request must carry it
//! (`Authorization: Bearer T` or `?token=T`) or gets 401; without one (loopback only), a
//! request whose `Host` is not a loopback name gets 403, which stops DNS-rebinding pages.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The access policy of one server.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub(crate) token: Option<Arc<str>>,
}

/// `true` for a token that can travel in a header and a URL: 1..=256 printable ASCII
/// characters, no spaces.
pub(crate) fn valid_token(token: &str) -> bool {
    (1..=256).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_graphic())
}

/// Compares without an early exit, so the time taken does not reveal how many leading
/// characters of a guess were right.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(0);
        diff |= usize::from(g ^ e);
    }
    diff == 0
}

/// Decodes `%XX` escapes (a `+` stays a `+`: tokens hold no spaces).
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The token a request carries, from `Authorization: Bearer` first, else `?token=`.
fn request_token(req: &Request) -> Option<Vec<u8>> {
    if let Some(value) = req.headers().get(header::AUTHORIZATION) {
        let value = value.to_str().ok()?.trim();
        let (scheme, rest) = value.split_once(' ')?;
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(rest.trim().as_bytes().to_vec());
        }
    }
    req.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == "token")
            .map(|(_, v)| percent_decode(v))
    })
}

/// `true` when the `Host` header names this machine (`localhost`, `127.x.y.z`, `[::1]`),
/// or is absent (non-browser clients).
fn host_is_loopback(req: &Request) -> bool {
    let Some(host) = req.headers().get(header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn deny(status: StatusCode, message: &'static str) -> Response {
    let mut resp = (status, message).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"oxalign dashboard\""),
        );
    }
    resp
}

/// Middleware applying [`Access`] to every request.
pub(crate) async fn check(State(access): State<Access>, req: Request, next: Next) -> Response {
    match &access.token {
        Some(expected) => {
            let ok = request_token(&req).is_some_and(|g| same_secret(&g, expected.as_bytes()));
            if !ok {
                return deny(
                    StatusCode::UNAUTHORIZED,
                    "401 Unauthorized: this dashboard needs its token: send \
                     `Authorization: Bearer TOKEN` or open the page with ?token=TOKEN\n",
                );
            }
        }
        None => {
            if !host_is_loopback(&req) {
                return deny(
                    StatusCode::FORBIDDEN,
                    "403 Forbidden: this dashboard serves loopback host names only; start it \
                     with --token to serve other hosts\n",
                );
            }
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = axum::http::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn token_from_header_or_query() {
        let r = req("/api/state", &[("authorization", "Bearer s3cr%t")]);
        assert_eq!(request_token(&r).unwrap(), b"s3cr%t");
        let r = req("/?a=1&token=a%26b+c", &[]);
        assert_eq!(request_token(&r).unwrap(), b"a&b+c");
        let r = req("/?token=abc%2", &[]);
        assert_eq!(request_token(&r).unwrap(), b"abc%2");
        assert!(request_token(&req("/?tok=1", &[("authorization", "Basic x")])).is_none());
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1:8265",
            "localhost:1",
            "[::1]:80",
            "LOCALHOST",
            "127.1.2.3",
        ] {
            assert!(host_is_loopback(&req("/", &[("host", h)])), "{h}");
        }
        for h in [
            "evil.example:8265",
            "10.0.0.1",
            "[fe80::1]:1",
            "localhost.evil.example",
        ] {
            assert!(!host_is_loopback(&req("/", &[("host", h)])), "{h}");
        }
        assert!(valid_token("abc-DEF_123"));
        assert!(!valid_token("has space"));
        assert!(!valid_token(""));
    }
}
