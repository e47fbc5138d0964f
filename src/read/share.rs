//! An upstream's share of the request's budget: `[upstreams."NAME"]
//! max_reads`, at most that many requests sent to the upstream's origin
//! (scheme, host and port) per inbound HTTP request, every operation of a
//! batch together (a WebSocket event is a request of its own).
//!
//! The upstreams with a share are fixed when the engine is built
//! ([`Shares`]); each request counts its reads against each share
//! ([`ShareUse`]). A read belongs to the share of the origin it is *sent*
//! to — its URL's, a redirect hop's, a token fetch's — so every request
//! sent there counts, whoever asked for it. The hub takes a read's unit of
//! the share right before it charges the request's budget, and gives it
//! back when the request's budget refuses the read: a refused read is
//! charged nothing, to the share or to the request. Like the request's
//! charge, a unit is taken with a compare-and-swap that only moves `used`
//! from `n` to `n + 1` while `n < max`: no interleaving sends more.

use crate::config::UpstreamTable;
use crate::error::ReadError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[cfg(test)]
mod tests;

/// The upstreams that have a share of their own, fixed when the engine is
/// built.
pub(crate) struct Shares {
    capped: Box<[Capped]>,
}

/// One upstream with a share: its origin, its name, its share.
struct Capped {
    name: String,
    scheme: String,
    /// Lowercase.
    host: String,
    port: Option<u16>,
    max: u64,
}

/// Which share a read counts against (an index into [`Shares`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShareId(usize);

/// One request's reads against each share.
pub(crate) struct ShareUse {
    used: Box<[AtomicU64]>,
}

impl Shares {
    /// The shares of the tables with `max_reads` above 0 and a valid URL.
    pub(crate) fn new(upstreams: &BTreeMap<String, UpstreamTable>) -> Self {
        let capped = upstreams
            .iter()
            .filter(|(_, table)| table.max_reads > 0)
            .filter_map(|(name, table)| {
                let url = table.base_url()?;
                Some(Capped {
                    name: name.clone(),
                    scheme: url.scheme().to_string(),
                    host: url.host_str()?.to_ascii_lowercase(),
                    port: url.port_or_known_default(),
                    max: table.max_reads,
                })
            })
            .collect();
        Self { capped }
    }

    /// The share a request sent to `url` counts against, if its origin has
    /// one (nothing to look at when no upstream has a share).
    pub(crate) fn of(&self, url: &reqwest::Url) -> Option<ShareId> {
        if self.capped.is_empty() {
            return None;
        }
        let host = url.host_str()?;
        let port = url.port_or_known_default();
        (self.capped.iter())
            .position(|c| {
                c.port == port && c.scheme == url.scheme() && c.host.eq_ignore_ascii_case(host)
            })
            .map(ShareId)
    }

    /// A request's use of the shares: none used yet.
    pub(crate) fn open(&self) -> ShareUse {
        ShareUse {
            used: self.capped.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether the share `id` is spent in `request` (a cheap check before
    /// waiting for anything).
    pub(crate) fn is_spent(&self, request: &ShareUse, id: ShareId) -> bool {
        request.used[id.0].load(Relaxed) >= self.capped[id.0].max
    }

    /// Takes one read of the share `id` in `request`, or refuses it (and
    /// changes nothing) when the share is spent.
    pub(crate) fn try_take(&self, request: &ShareUse, id: ShareId) -> Result<(), ReadError> {
        let max = self.capped[id.0].max;
        let taken = request.used[id.0]
            .fetch_update(Relaxed, Relaxed, |used| (used < max).then(|| used + 1));
        match taken {
            Ok(_) => Ok(()),
            Err(_) => Err(self.spent(id)),
        }
    }

    /// Gives back the read just taken of the share `id` in `request` (the
    /// request's budget refused it: it is not sent).
    pub(crate) fn give_back(&self, request: &ShareUse, id: ShareId) {
        request.used[id.0].fetch_sub(1, Relaxed);
    }

    /// Reads left of the share `id` in `request`.
    pub(crate) fn left(&self, request: &ShareUse, id: ShareId) -> u64 {
        let max = self.capped[id.0].max;
        max.saturating_sub(request.used[id.0].load(Relaxed))
    }

    /// Takes up to `n` reads of the share `id` in `request` at once (a
    /// grant to a service on the engine, `propagate.rs`): the reads taken.
    pub(crate) fn take_up_to(&self, request: &ShareUse, id: ShareId, n: u64) -> u64 {
        let max = self.capped[id.0].max;
        let mut took = 0;
        let _ = request.used[id.0].fetch_update(Relaxed, Relaxed, |used| {
            took = max.saturating_sub(used).min(n);
            (took > 0).then_some(used + took)
        });
        took
    }

    /// Gives back `n` reads taken of the share `id` in `request` (a grant's
    /// part its service did not spend).
    pub(crate) fn give_back_n(&self, request: &ShareUse, id: ShareId, n: u64) {
        if n > 0 {
            request.used[id.0].fetch_sub(n, Relaxed);
        }
    }

    /// The refusal of a read to the upstream of the share `id`, naming it.
    pub(crate) fn spent(&self, id: ShareId) -> ReadError {
        let capped = &self.capped[id.0];
        ReadError::UpstreamBudgetExhausted {
            upstream: capped.name.clone(),
            limit: capped.max,
        }
    }

    /// Reads of the share `id` taken in `request` so far.
    #[cfg(test)]
    pub(crate) fn used(&self, request: &ShareUse, id: ShareId) -> u64 {
        request.used[id.0].load(Relaxed)
    }
}
