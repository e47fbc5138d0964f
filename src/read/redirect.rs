//! Redirects, followed by the acquisition point itself: each hop is a read
//! of its own through every step (de-duplicated, capped per host, charged),
//! so a redirect cannot send an uncharged request.
//!
//! A 301, 302, 303, 307 or 308 with a `Location` is followed, up to
//! `upstream.max_redirects` hops. The chain ends with `UPSTREAM_ERROR` at a
//! hop back to a URL of the same chain, past the last hop, or at a
//! `Location` that is not an `http(s)` URL. A 303 — and a 301 or 302
//! answering a `POST` — is followed with a `GET` without the body; a 307 or
//! 308 with the same method and body, but never to another origin. A hop to
//! another origin carries only `Accept` and `Content-Type` of the read's
//! headers: any other may be a credential (`x-api-key`), whatever its name.

use super::message::{Read, UpstreamResponse};
use http::{header, HeaderName, Method};

/// The redirects one read has followed so far.
pub(crate) struct Redirects {
    max: u32,
    /// The requests of the chain so far, as (method, URL): a `POST`
    /// redirected (303) to a `GET` of its own URL is no loop.
    chain: Vec<(Method, reqwest::Url)>,
}

impl Redirects {
    /// No hop yet; at most `max` (0: redirects are answered as they are).
    pub(crate) fn new(max: u32) -> Self {
        Self {
            max,
            chain: Vec::new(),
        }
    }

    /// The read that follows `response` to `sent`: `Ok(None)` when it is no
    /// redirect to follow, `Err(why)` when the chain must end here.
    pub(crate) fn next(
        &mut self,
        sent: &Read,
        response: &UpstreamResponse,
    ) -> Result<Option<Read>, String> {
        let Some(location) = location(response).filter(|_| self.max > 0) else {
            return Ok(None);
        };
        let next = match sent.url.join(location) {
            Ok(next) if matches!(next.scheme(), "http" | "https") => next,
            _ => return Err(format!("redirect to {location:?}, not an http(s) URL")),
        };
        if self.chain.len() as u32 >= self.max {
            return Err(format!("more than {} redirects", self.max));
        }
        let Some(hop) = hop(sent, response.status.as_u16(), next) else {
            return Err("a redirect to another origin would carry the request's body".into());
        };
        self.chain.push((sent.method.clone(), sent.url.clone()));
        if self.chain.contains(&(hop.method.clone(), hop.url.clone())) {
            return Err(format!("redirect loop at {}", hop.url));
        }
        Ok(Some(hop))
    }
}

/// The read a redirect `status` to `next` makes of `sent`; `None` when it
/// would carry a body to another origin.
fn hop(sent: &Read, status: u16, next: reqwest::Url) -> Option<Read> {
    let same_origin = sent.url.origin() == next.origin();
    let to_get = status == 303 && sent.method != Method::HEAD
        || matches!(status, 301 | 302) && sent.method == Method::POST;
    if !same_origin && !to_get && !sent.body.is_empty() {
        return None;
    }
    let kept =
        |name: &HeaderName| same_origin || matches!(*name, header::ACCEPT | header::CONTENT_TYPE);
    let headers = sent
        .headers
        .iter()
        .filter(|(name, _)| kept(name))
        .filter(|(name, _)| {
            !to_get || !matches!(*name, header::CONTENT_TYPE | header::CONTENT_LENGTH)
        })
        .cloned()
        .collect();
    Some(Read {
        method: if to_get {
            Method::GET
        } else {
            sent.method.clone()
        },
        url: next,
        headers,
        body: if to_get {
            bytes::Bytes::new()
        } else {
            sent.body.clone()
        },
        key: if to_get { None } else { sent.key.clone() },
        keep: Default::default(),
        extras: None,
    })
}

/// The `Location` of a redirect answer, if `response` is one.
fn location(response: &UpstreamResponse) -> Option<&str> {
    match response.status.as_u16() {
        301 | 302 | 303 | 307 | 308 => response.header("location"),
        _ => None,
    }
}
