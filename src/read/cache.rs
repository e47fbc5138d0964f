//! Reads that never need to happen: an engine-wide cache of answers to
//! reads declared immutable ([`Read::immutable`]; content addressed by a
//! digest never changes) or fresh for a while ([`Read::fresh_for`]: a
//! staleness the caller accepts, for that long), shared by every inbound
//! request.
//!
//! - **What is kept**: a `2xx` answer to a `GET` declared immutable, whole
//!   (a body the transport cut or refused is an error, never an answer),
//!   and — for a read that names its SHA-256 ([`Read::sha256`]) — only when
//!   the body's digest is that one: a lying upstream cannot plant content,
//!   and the mismatch is the read's `UPSTREAM_ERROR`.
//! - **Whose it is**: the key is the read's identity for de-duplication —
//!   method, URL, headers, body — so a caller's own `Authorization` keeps
//!   two users' entries apart; a credential the engine attached
//!   (`auth.rs`) counts as the identity it was issued to (the upstream's
//!   origin and user, or anonymous), not as the token's bytes, so a token
//!   refreshed every few minutes does not empty the cache. No read is
//!   answered from an entry its own credentials did not fetch.
//! - **What a hit costs**: nothing that guards the upstream — no budget, no
//!   slot, no send. It is reported: the operation's `cacheHits`, the
//!   request's counters, and `fanout_cache_total{host, outcome}`.
//! - **Bound**: `upstream.cache_bytes`, each entry weighed by its body plus
//!   its URL and headers (moka's weighted LRU-ish eviction, TinyLFU
//!   admission); 0 turns the cache off.

use super::message::{Read, ReadKey, UpstreamResponse};
use crate::error::ReadError;
use foldhash::fast::SeedableRandomState;
use moka::sync::Cache;
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// An entry's weight beyond its body and key: the response's struct, its
/// header map, the cache's own node.
const ENTRY_OVERHEAD: usize = 512;

/// The engine's cache of immutable answers.
pub(crate) struct ImmutableCache {
    /// Seeded foldhash: the key (a URL, headers) hashed in a fraction of
    /// SipHash's time, and not predictable by whoever chooses the URLs.
    entries: Option<Cache<ReadKey, Kept, SeedableRandomState>>,
}

/// An answer kept, and for how long (`None`: for ever).
#[derive(Clone)]
struct Kept {
    answer: Arc<UpstreamResponse>,
    ttl: Option<Duration>,
}

/// Each entry lives as long as its read said.
struct PerEntry;

impl moka::Expiry<ReadKey, Kept> for PerEntry {
    fn expire_after_create(
        &self,
        _key: &ReadKey,
        kept: &Kept,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        kept.ttl
    }
}

impl ImmutableCache {
    /// A cache of at most `bytes` (0: none).
    pub(crate) fn new(bytes: u64) -> Self {
        let entries = (bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(bytes)
                .weigher(|key: &ReadKey, kept: &Kept| {
                    let weight = kept.answer.body.len() + key.weight() + ENTRY_OVERHEAD;
                    u32::try_from(weight).unwrap_or(u32::MAX)
                })
                .expire_after(PerEntry)
                .build_with_hasher(crate::seed::random_state())
        });
        Self { entries }
    }

    /// The key `read` is kept under and for how long, if it may be kept: a
    /// `GET` declared immutable or fresh for a while, with the cache on.
    /// `credential`: whom the credentials the engine sends to its upstream
    /// belong to.
    pub(crate) fn key(
        &self,
        read: &Read,
        credential: Option<Arc<str>>,
    ) -> Option<(ReadKey, Option<Duration>)> {
        let ttl = read.keep_for()?;
        let safe = matches!(read.method, http::Method::GET | http::Method::HEAD);
        let cacheable = safe && self.entries.is_some();
        cacheable.then(|| (ReadKey::cached(read, credential), ttl))
    }

    /// The answer kept under `key`.
    pub(crate) fn get(&self, key: &ReadKey) -> Option<Arc<UpstreamResponse>> {
        Some(self.entries.as_ref()?.get(key)?.answer)
    }

    /// Keeps `answer` under `key` for `ttl` (`None`: for ever) if it may be
    /// kept (a `2xx`).
    pub(crate) fn keep(&self, key: ReadKey, ttl: Option<Duration>, answer: &Arc<UpstreamResponse>) {
        if let Some(entries) = &self.entries {
            if answer.status.is_success() {
                let answer = answer.clone();
                entries.insert(key, Kept { answer, ttl });
            }
        }
    }

    /// The bytes the entries weigh now.
    pub(crate) fn weighted_size(&self) -> u64 {
        self.entries.as_ref().map_or(0, |e| {
            e.run_pending_tasks();
            e.weighted_size()
        })
    }
}

/// `answer`, if its body's SHA-256 is `expected` (lowercase hex) or none is
/// expected; else the read's `UPSTREAM_ERROR`. Only a `2xx` body is checked.
pub(crate) fn verified(
    answer: Arc<UpstreamResponse>,
    expected: Option<&str>,
) -> Result<Arc<UpstreamResponse>, ReadError> {
    let Some(expected) = expected else {
        return Ok(answer);
    };
    if !answer.status.is_success() {
        return Ok(answer);
    }
    let actual = format!("{:x}", Sha256::digest(&answer.body));
    if actual == expected {
        Ok(answer)
    } else {
        Err(answer.error(format!(
            "the body's SHA-256 is sha256:{actual}, not the digest it was read by"
        )))
    }
}
