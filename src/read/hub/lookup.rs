//! Step 0 of the walk, the engine's cache (`cache.rs`), first of all: a
//! read it may answer looked up — keyed by whom the engine's credentials
//! for its upstream belong to (`auth.rs`), by its host's table
//! (`hosts.rs`) — a hit counted and handed to the request as its own, a
//! miss read, checked against its digest and kept.

use crate::read::budget::bump;
use crate::read::cache;
use crate::read::spans;
use crate::read::{Cached, Read, ReadResult, Upstream, UpstreamResponse};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Upstream<'_> {
    /// The engine's cache, for a read it may answer (`cache.rs`) — declared
    /// immutable or fresh for a while, addressed by its digest, or to a
    /// host whose answers are kept as their headers say: its answer
    /// (`Break`), else whether and where it is to be kept (`Continue`).
    pub(in crate::read) fn look_up(&self, read: &Read) -> ControlFlow<ReadResult, Cached> {
        let parts = &self.reads.parts;
        let by_headers = !read.cache_done() && parts.host_table.cache_control(&read.url);
        if !read.is_checked() && !by_headers {
            return ControlFlow::Continue(Cached::Not);
        }
        let identity = parts.auth.identity(&read.url);
        let Some(probe) = parts.cache.probe(read, identity, by_headers) else {
            return ControlFlow::Continue(Cached::Missed(None));
        };
        self.hit(read, &probe)?;
        ControlFlow::Continue(Cached::Missed(Some(probe.missed())))
    }

    /// A read the engine's cache may answer (`cache.rs`) — declared
    /// immutable or fresh for a while, addressed by its digest, or to a
    /// host whose answers are kept as their headers say — that it did not:
    /// read (the cache not looked at again), checked against its digest,
    /// and kept.
    pub(in crate::read) async fn checked(
        &self,
        mut read: Read,
        lookup: Option<cache::Lookup>,
    ) -> ReadResult {
        let parts = &self.reads.parts;
        let expected = read.take_check();
        let host = lookup.as_ref().map(|_| parts.host_table.resolve(&read.url));
        let answer = cache::verified(self.resolve(read).await?, expected.as_deref())?;
        if let (Some(lookup), Some(host)) = (lookup, host) {
            if let Some(kept) = parts.cache.keep(lookup, &answer, expected, host.label()) {
                host.metrics().cache_stored.increment(1);
                // The request's later hits on it are this answer.
                self.reads.hits.filled(kept, answer.clone());
            }
        }
        Ok(answer)
    }

    /// The answer the engine's cache keeps for `probe`, counted as a hit
    /// (`Break`); else the miss counted (`Continue`).
    fn hit(&self, read: &Read, probe: &cache::Probe<'_>) -> ControlFlow<ReadResult> {
        let parts = &self.reads.parts;
        let Some(mut hit) = parts.cache.get(probe, read.sha256_named()) else {
            let host = parts.host_table.resolve(&read.url);
            host.metrics().cache_misses.increment(1);
            return ControlFlow::Continue(());
        };
        self.op.cache_hits.fetch_add(1, Relaxed);
        bump(&self.reads.budget.stats().cache_hits);
        spans::note("fanout.cache_hit", true);
        hit.tag().metrics().cache_hits.increment(1);
        let kept = match hit.answer() {
            Ok(kept) => kept,
            // Not the digest this read names: its own error.
            Err(err) => return ControlFlow::Break(Err(err)),
        };
        // A response of the request's own, shared by its hits on the entry:
        // what they derive of it lives with the request, not in the cache;
        // held by the request, its bytes count as a read's answer's do.
        let own = |kept: &UpstreamResponse| self.keep(Arc::new(kept.copy()));
        ControlFlow::Break(self.reads.hits.answer(kept, own))
    }
}
