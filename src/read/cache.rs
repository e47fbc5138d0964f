//! Reads that never need to happen: an engine-wide cache of answers,
//! shared by every inbound request, to reads declared immutable
//! ([`Read::immutable`]; content addressed by a digest never changes) or
//! fresh for a while ([`Read::fresh_for`]: a staleness the caller accepts,
//! for that long) — and, on a host whose table says `cache_control = true`,
//! to any `GET` whose answer's `Cache-Control`/`Expires` let a shared cache
//! keep it.
//!
//! - **What is kept**: a `2xx` answer, whole (a body the transport cut or
//!   refused is an error, never an answer), and — for a read that names its
//!   SHA-256 ([`Read::sha256`]) — only when the body's digest is that one: a
//!   lying upstream cannot plant content, and the mismatch is the read's
//!   `UPSTREAM_ERROR`. By the headers, the HTTP caching rules are
//!   [`http_cache_semantics`]'s, as a shared cache applies them (RFC 9111),
//!   with no heuristic freshness: kept while fresh (`max-age`, `s-maxage`,
//!   `Expires`, less any `Age`; `immutable` alone for a day), never when the
//!   answer says `no-store`, `private` or `no-cache` or varies on `*`.
//! - **Whose it is**: the key is the read's identity for de-duplication —
//!   method, URL, headers, body — so a caller's own `Authorization` keeps
//!   two users' entries apart; a credential the engine attached
//!   (`auth.rs`) counts as the identity it was issued to (the upstream's
//!   origin and user, or anonymous), not as the token's bytes, so a token
//!   refreshed every few minutes does not empty the cache. No read is
//!   answered from an entry its own credentials did not fetch — unless the
//!   upstream said any credentials may share it: an answer a shared cache
//!   may keep even for a request with `Authorization` (RFC 9111 §3.5:
//!   `public`, `s-maxage`, `must-revalidate`) is kept under a key without
//!   credentials, which every read of the same URL and headers looks up
//!   after its own.
//! - **Filled once**: the first answer kept under a key stays until it
//!   expires or is evicted; an identical miss that ended meanwhile (a
//!   coalesced joiner, a race) adds nothing.
//! - **What a hit costs**: nothing that guards the upstream — no budget, no
//!   slot, no send. It is reported: the operation's `cacheHits`, the
//!   request's counters, and `fanout_cache_total{host, outcome}`.
//! - **Only what the reader could use**: an answer a reader called
//!   [`UpstreamResponse::error`] on (a body that does not parse, a page
//!   that is not what it should be) is dropped from the cache when next
//!   looked up, and never answers again.
//! - **What an entry holds is what it weighs**: the entry is a copy of the
//!   answer made when it is kept — the body copied into an allocation of
//!   its own (the transport's chunk may share a larger buffer), nothing a
//!   reader derived of it ([`UpstreamResponse::derived`]: a parsed list
//!   can be many times its page). A hit hands the inbound request a
//!   response of its own ([`RequestHits`]), shared by all its hits on the
//!   entry, on which it derives for itself; that lives as long as the
//!   request, and its bytes count against the request's bound as a read's
//!   answer does.
//! - **Bound**: `upstream.cache_bytes`, each entry weighed by its body plus
//!   its URL and headers (moka's weighted LRU-ish eviction, TinyLFU
//!   admission); 0 turns the cache off. It holds at every moment, not
//!   eventually: an answer heavier than an eighth of the bound is never
//!   kept, and each insert is applied (admitted or refused, the evictions
//!   it causes made) before the read returns — moka would otherwise apply
//!   them in batches of 64 writes or every 300 ms. Only the inserts of
//!   reads ending at the same instant, one per worker thread, are ever
//!   pending together. `fanout_cache_total{outcome="stored"}` counts the
//!   answers actually admitted.

mod hits;

pub(crate) use hits::RequestHits;

use super::message::{KeyHash, KeyView, Read, ReadKey, UpstreamResponse};
use crate::error::ReadError;
use http::HeaderValue;
use http_cache_semantics::{CacheOptions, CachePolicy, ResponseLike};
use moka::sync::Cache;
use sha2::{Digest as _, Sha256};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// An entry's weight beyond its body, its URL and its headers' bytes: the
/// response's and the key's structs, the cache's own node, its places in
/// the cache's queues and timer wheel, the allocator's rounding — measured
/// (`tests/cache_memory.rs`: what the process holds for a full cache stays
/// within its bound).
const ENTRY_OVERHEAD: usize = 1024;

/// What each header of an answer holds beyond its name and value: its slot
/// in the header map, its index, the value's own allocation.
const HEADER_OVERHEAD: usize = 96;

/// The largest share of the bound one entry may weigh: a heavier answer is
/// never kept.
const MAX_ENTRY_SHARE: u64 = 8;

/// RFC 9111 §1.2.2: an `Age` past what a cache can count is taken as 2^31
/// seconds.
const AGE_CEILING: &str = "2147483648";

/// The engine's cache of answers.
pub(crate) struct AnswerCache<H> {
    /// Hashed by the hash each key carries (seeded foldhash, computed once
    /// when the read's key is made: not predictable by whoever chooses the
    /// URLs); a probe past another entry compares that hash before the URL.
    entries: Option<Cache<ReadKey, Arc<Kept<H>>, KeyHash>>,
    /// The most one entry may weigh.
    max_entry: u64,
}

/// An answer kept (a copy of the reader's, holding only what is weighed),
/// and for how long (`None`: for ever). Shared: a hit clones one pointer.
struct Kept<H> {
    answer: Arc<UpstreamResponse>,
    ttl: Option<Duration>,
    /// The SHA-256 (lowercase hex) the body was checked against when kept.
    sha256: Option<Box<str>>,
    /// What the keeping read tagged it with (the hub: its host's label,
    /// to count hits on, so that a hit looks up no host).
    host: H,
}

/// An entry found for a read: held (the one pointer moka hands out) while
/// the hit is answered, its answer and tag borrowed from it, not copied.
pub(crate) struct Hit<H> {
    kept: Arc<Kept<H>>,
    /// The read's own check of the body, when it names another digest.
    checked: Result<(), ReadError>,
}

impl<H> Hit<H> {
    /// What the keeping read tagged the entry with.
    pub(crate) fn tag(&self) -> &H {
        &self.kept.host
    }

    /// The answer kept, or the read's own error when the body is not the
    /// digest it names (taken: a second call answers the entry).
    pub(crate) fn answer(&mut self) -> Result<&Arc<UpstreamResponse>, ReadError> {
        std::mem::replace(&mut self.checked, Ok(()))?;
        Ok(&self.kept.answer)
    }
}

/// Each entry lives as long as its read (or its headers) said.
struct PerEntry;

impl<H> moka::Expiry<ReadKey, Arc<Kept<H>>> for PerEntry {
    fn expire_after_create(
        &self,
        _key: &ReadKey,
        kept: &Arc<Kept<H>>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        kept.ttl
    }
}

/// Where a read is looked for, borrowed from the read: a hit copies
/// nothing of it.
pub(crate) struct Probe<'r> {
    /// The read's own key: its identity, and whose credentials the engine
    /// sends.
    key: KeyView<'r>,
    rule: Rule,
}

impl Probe<'_> {
    /// A miss: where the read's answer is to be kept (its key copied).
    pub(crate) fn missed(self) -> Lookup {
        Lookup {
            key: self.key.to_owned(),
            rule: self.rule,
        }
    }
}

/// Where a read that missed keeps its answer.
pub(crate) struct Lookup {
    key: ReadKey,
    rule: Rule,
}

/// How long an answer may be kept.
#[derive(Clone, Copy)]
enum Rule {
    /// As the read declared: for ever (`None`) or this long.
    Declared(Option<Duration>),
    /// As the answer's headers say (the host's `cache_control`).
    Headers,
}

impl<H: Clone + Send + Sync + 'static> AnswerCache<H> {
    /// A cache of at most `bytes` (0: none).
    pub(crate) fn new(bytes: u64) -> Self {
        let entries = (bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(bytes)
                .weigher(|key: &ReadKey, kept: &Arc<Kept<H>>| {
                    u32::try_from(weight(key, &kept.answer)).unwrap_or(u32::MAX)
                })
                .expire_after(PerEntry)
                .build_with_hasher(KeyHash)
        });
        Self {
            entries,
            max_entry: bytes / MAX_ENTRY_SHARE,
        }
    }

    /// Where `read` is looked for, if it may be kept: a `GET` (or `HEAD`)
    /// declared immutable or fresh for a while, or — `by_headers`, its
    /// host's `cache_control` — any `GET`; with the cache on.
    /// `credential`: whom the credentials the engine sends to its upstream
    /// belong to.
    pub(crate) fn probe<'r>(
        &self,
        read: &'r Read,
        credential: Option<&'r str>,
        by_headers: bool,
    ) -> Option<Probe<'r>> {
        self.entries.as_ref()?;
        let rule = match read.keep_for() {
            Some(ttl) if matches!(read.method, http::Method::GET | http::Method::HEAD) => {
                Rule::Declared(ttl)
            }
            None if by_headers && read.method == http::Method::GET => Rule::Headers,
            _ => return None,
        };
        let key = read.key_view(credential);
        Some(Probe { key, rule })
    }

    /// The entry kept for `probe`: under its own key, or — by the
    /// headers — under the key any credentials share. The cache's own copy:
    /// a reader gets a [`copy`](UpstreamResponse::copy) of it. A read that
    /// names the SHA-256 its body must have (`sha256`) is answered only by
    /// a body that has it (checked once, when kept, for the digest the
    /// keeping read named; hashed again for another), else its own
    /// `UPSTREAM_ERROR` — the entry stays, for the reads it does answer.
    pub(crate) fn get(&self, probe: &Probe<'_>, sha256: Option<&str>) -> Option<Hit<H>> {
        let entries = self.entries.as_ref()?;
        let usable = |key: &KeyView<'_>| {
            let kept = entries.get(key)?;
            if kept.answer.is_unusable() {
                entries.invalidate(key);
                return None;
            }
            Some(kept)
        };
        let kept = match usable(&probe.key) {
            Some(kept) => kept,
            None => match probe.rule {
                Rule::Headers => usable(&probe.key.shared().view())?,
                Rule::Declared(_) => return None,
            },
        };
        let checked = match sha256 {
            Some(named) if kept.sha256.as_deref() != Some(named) => {
                verified(kept.answer.clone(), Some(named)).map(drop)
            }
            _ => Ok(()),
        };
        Some(Hit { kept, checked })
    }

    /// Keeps `answer` for `lookup` if it may be kept (a `2xx`; by the
    /// headers, one they let a shared cache keep and still fresh) and
    /// nothing is kept there yet. The entry's answer, if it was kept.
    pub(crate) fn keep(
        &self,
        lookup: Lookup,
        answer: &Arc<UpstreamResponse>,
        sha256: Option<Box<str>>,
        host: H,
    ) -> Option<Arc<UpstreamResponse>> {
        let entries = self.entries.as_ref()?;
        if !answer.status.is_success() {
            return None;
        }
        let (key, ttl) = match lookup.rule {
            Rule::Declared(ttl) => (lookup.key, ttl),
            Rule::Headers => match by_headers(&lookup.key, answer) {
                Some(Fresh { ttl, shared: true }) => (lookup.key.shared(), Some(ttl)),
                Some(Fresh { ttl, shared: false }) => (lookup.key, Some(ttl)),
                None => return None,
            },
        };
        if answer.is_unusable() || weight(&key, answer) as u64 > self.max_entry {
            return None;
        }
        let kept = Arc::new(answer.compact());
        let entry = Arc::new(Kept {
            answer: kept.clone(),
            ttl,
            sha256,
            host,
        });
        // `or_insert_with`, not `or_insert`: moka's `or_insert` is a get then
        // an insert, so two misses ending at once would both insert (the second
        // replacing the first); its initializer runs once per key.
        if !entries
            .entry(key.clone())
            .or_insert_with(|| entry)
            .is_fresh()
        {
            return None;
        }
        // Applied now: admitted or refused, and what it evicts gone.
        entries.run_pending_tasks();
        entries.contains_key(&key).then_some(kept)
    }

    /// The bytes the entries weigh now.
    pub(crate) fn weighted_size(&self) -> u64 {
        self.entries.as_ref().map_or(0, |e| {
            e.run_pending_tasks();
            e.weighted_size()
        })
    }
}

/// The bytes an entry holds, roughly: its body, its key, its headers, and
/// what every entry costs.
fn weight(key: &ReadKey, answer: &UpstreamResponse) -> usize {
    let headers: usize = (answer.headers.iter())
        .map(|(name, value)| name.as_str().len() + value.len() + HEADER_OVERHEAD)
        .sum();
    answer.body.len() + answer.host.len() + headers + key.weight() + ENTRY_OVERHEAD
}

/// What an answer's headers allow: kept this long, and for any credentials
/// or only the read's own.
struct Fresh {
    ttl: Duration,
    shared: bool,
}

/// What `answer`'s headers allow a shared cache to do with it, answering
/// the request `key` describes: nothing (`None`), or keep it while fresh —
/// for any credentials when a shared cache could keep it even for a
/// request with `Authorization` (RFC 9111 §3.5).
fn by_headers(key: &ReadKey, answer: &UpstreamResponse) -> Option<Fresh> {
    let options = CacheOptions {
        shared: true,
        // Fresh only as long as the upstream said: no guess from
        // `Last-Modified`.
        cache_heuristic: 0.0,
        ..CacheOptions::default()
    };
    let now = SystemTime::now();
    let response = Answer::of(answer);
    let fresh = |authorized: bool| {
        let request = key.request(authorized)?;
        let policy = CachePolicy::new_options(&request, &response, now, options);
        let fresh = policy.is_storable()
            && policy
                .before_request(&request, now)
                .satisfies_without_revalidation();
        let ttl = policy.time_to_live(now);
        (fresh && !ttl.is_zero()).then_some(ttl)
    };
    // An answer that varies on any request header is kept for the same
    // headers and credentials only: the shared key drops `Authorization`.
    let varies = answer.headers.contains_key(http::header::VARY);
    if let Some(ttl) = fresh(true).filter(|_| !varies) {
        return Some(Fresh { ttl, shared: true });
    }
    fresh(false).map(|ttl| Fresh { ttl, shared: false })
}

/// An answer, as the HTTP caching rules see it: its headers, with an `Age`
/// past what a cache can count taken as 2^31 seconds (RFC 9111 §1.2.2;
/// `http_cache_semantics` would read it as 0, fresh).
struct Answer<'a> {
    status: http::StatusCode,
    headers: Cow<'a, http::HeaderMap>,
}

impl<'a> Answer<'a> {
    fn of(answer: &'a UpstreamResponse) -> Self {
        let mut headers = Cow::Borrowed(&answer.headers);
        if let Some(age) = answer.headers.get(http::header::AGE).and_then(age_to_read) {
            (headers.to_mut()).insert(http::header::AGE, age);
        }
        Self {
            status: answer.status,
            headers,
        }
    }
}

/// The `Age` to read in place of `age`, when `http_cache_semantics` would
/// misread it (as 0, fresh): a list's first member (RFC 9111 §5.1: a cache
/// uses the first), and a value past what it can count taken as 2^31.
fn age_to_read(age: &HeaderValue) -> Option<HeaderValue> {
    let text = age.to_str().ok()?;
    let first = text.split(',').next()?.trim();
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
        return None; // not a delta-seconds: no Age at all
    }
    let counted = first.parse::<u64>().ok().filter(|secs| *secs <= 1 << 31);
    match counted {
        None => Some(HeaderValue::from_static(AGE_CEILING)),
        Some(_) if first.len() != text.len() => HeaderValue::from_str(first).ok(),
        Some(_) => None,
    }
}

impl ResponseLike for Answer<'_> {
    fn status(&self) -> http::StatusCode {
        self.status
    }

    fn headers(&self) -> &http::HeaderMap {
        &self.headers
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
        // This read's expectation, not a verdict on the answer (other reads
        // of the same URL may name its digest).
        Err(answer.mismatch(format!(
            "the body's SHA-256 is sha256:{actual}, not the digest it was read by"
        )))
    }
}

#[cfg(test)]
mod tests;
