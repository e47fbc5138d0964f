//! A request's own responses for the engine cache's entries: what a hit
//! hands the request, shared by all its hits on one entry (see `cache.rs`).

use crate::error::ReadError;
use crate::read::message::UpstreamResponse;
use foldhash::fast::FixedState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// One inbound request's own responses for the cache's entries — each
/// entry it was answered with (or filled), with the response the request
/// got for it — so the request's identical reads share one response, and
/// what they derive of it, while the entry holds only its parts. Keyed by
/// the entry's address; the entry is held with it, so that address is not
/// another entry's while the request lives.
pub(crate) struct RequestHits {
    own: Mutex<Owned>,
}

/// By the entry's address: the entry, and the request's response for it.
type Owned = HashMap<usize, (Arc<UpstreamResponse>, Arc<UpstreamResponse>), FixedState>;

impl RequestHits {
    /// None yet (nothing allocated until the first).
    pub(crate) fn new() -> Self {
        Self {
            own: Mutex::new(HashMap::with_hasher(FixedState::default())),
        }
    }

    fn own(&self) -> MutexGuard<'_, Owned> {
        // Each section is one map operation: a poisoned map is still whole.
        self.own.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request's response for the entry `kept`: the one it has, else
    /// what `make` makes of the entry (kept for the request when it is an
    /// answer). The entry is held only then: a repeat hit copies no
    /// pointer of it.
    pub(crate) fn answer(
        &self,
        kept: &Arc<UpstreamResponse>,
        make: impl FnOnce(&UpstreamResponse) -> Result<Arc<UpstreamResponse>, ReadError>,
    ) -> Result<Arc<UpstreamResponse>, ReadError> {
        let mut own = self.own();
        let at = Arc::as_ptr(kept) as usize;
        if let Some((_, answer)) = own.get(&at) {
            return Ok(answer.clone());
        }
        let answer = make(kept)?;
        own.insert(at, (kept.clone(), answer.clone()));
        Ok(answer)
    }

    /// The request filled the entry `kept` with `answer`: its later hits
    /// on it are that answer.
    pub(crate) fn filled(&self, kept: Arc<UpstreamResponse>, answer: Arc<UpstreamResponse>) {
        let at = Arc::as_ptr(&kept) as usize;
        self.own().entry(at).or_insert((kept, answer));
    }
}
