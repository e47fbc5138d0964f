//! A realm's answer and the tokens kept: the token in a token service's
//! JSON (`token` or `access_token`), how long it is good for, and the cache
//! that keeps it — bounded in bytes, each token dropped at its own expiry.

use super::fault::FetchError;
use crate::error::ReadError;
use crate::read::message::UpstreamResponse;
use http::{HeaderValue, StatusCode};
use moka::future::Cache;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The longest token answer read (a realm's JSON): past it, `UPSTREAM_ERROR`.
pub(crate) const MAX_TOKEN_ANSWER: usize = 64 << 10;
/// Bytes of kept tokens at most, each weighed by its value and key (a
/// token is a few hundred bytes to a few KiB; an upstream naming a new scope
/// on every challenge cannot make the engine keep more than this).
const MAX_TOKEN_BYTES: u64 = 16 << 20;
/// `expires_in` when the realm gives none (the token specification's).
const DEFAULT_EXPIRES_IN: u64 = 60;

/// Identity of a kept token: who asked (origin), where it comes from, for
/// what, as whom.
pub(crate) type TokenKey = Arc<str>;

/// A kept token: the `Authorization` value (marked sensitive: its `Debug`
/// shows no secret) and how long it is good for.
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub(crate) header: HeaderValue,
    pub(super) lifetime: Duration,
}

struct Expiry;

impl moka::Expiry<TokenKey, Token> for Expiry {
    fn expire_after_create(
        &self,
        _key: &TokenKey,
        token: &Token,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(token.lifetime)
    }
}

/// The cache of kept tokens: [`MAX_TOKEN_BYTES`] at most, each token kept
/// for its lifetime.
pub(super) fn kept() -> Cache<TokenKey, Token> {
    Cache::builder()
        .max_capacity(MAX_TOKEN_BYTES)
        .weigher(|key: &TokenKey, token: &Token| {
            let weight = key.len() + token.header.len() + 256;
            u32::try_from(weight).unwrap_or(u32::MAX)
        })
        .expire_after(Expiry)
        .build()
}

/// The token in a realm's answer, kept for its lifetime; an error for any
/// answer that is not one: a refusal for `403` (a scope the user is not
/// granted: the realm knows the user), else the realm's failure — `401`
/// included: the credentials refused, or a realm the upstream no longer
/// names (moved, it may refuse everyone), so the next read asks the
/// upstream's challenge again (one read more while credentials are wrong,
/// never a realm kept that nobody can pass).
pub(crate) fn token(response: &UpstreamResponse) -> Result<Token, FetchError> {
    if response.status == StatusCode::UNAUTHORIZED || response.status == StatusCode::FORBIDDEN {
        let refused = ReadError::Unauthorized {
            host: response.host.clone(),
            message: format!(
                "the token service answered {}: the configured credentials were refused",
                response.status.as_u16()
            ),
        };
        return Err(match response.status {
            StatusCode::FORBIDDEN => FetchError::refused(refused),
            _ => FetchError::realm(refused),
        });
    }
    answered(response).map_err(FetchError::realm)
}

/// The token in a realm's answer that is not a refusal.
fn answered(response: &UpstreamResponse) -> Result<Token, ReadError> {
    response.error_for_status()?;
    if response.body.len() > MAX_TOKEN_ANSWER {
        return Err(response.error(format!("token answer larger than {MAX_TOKEN_ANSWER} bytes")));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        token: Option<String>,
        access_token: Option<String>,
        expires_in: Option<u64>,
        issued_at: Option<String>,
    }
    let answer: Answer = response.json()?;
    let token = answer
        .token
        .or(answer.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| response.error("the token answer holds no token"))?;
    let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| response.error("the token is not a valid header value"))?;
    header.set_sensitive(true);
    let expires_in = Duration::from_secs(answer.expires_in.unwrap_or(DEFAULT_EXPIRES_IN));
    let age = answer
        .issued_at
        .and_then(|at| humantime::parse_rfc3339_weak(&at).ok())
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .unwrap_or_default();
    let margin = (expires_in / 10).min(Duration::from_secs(10));
    Ok(Token {
        header,
        lifetime: expires_in.saturating_sub(age).saturating_sub(margin),
    })
}

/// The error for a token its request saw rejected, given again (by the
/// request's de-duplicated token fetch, or kept by another request).
pub(crate) fn rejected_again(host: String) -> ReadError {
    ReadError::Unauthorized {
        host,
        message: "the upstream rejected the token its realm gives".into(),
    }
}
