//! Step 8 of the walk, the hub's side: a read that authenticates is walked
//! by `auth/walk.rs`, which sends each request it asks for — the read
//! again with credentials, a token fetch inside its own span (`spans.rs`)
//! — through the hub, as a read of its own from step 1.

use crate::read::auth::walk::Sender;
use crate::read::auth::Rejected;
use crate::read::{host_name, spans, Read, ReadResult, Upstream};
use std::future::Future;
use tokio::time::Instant;

/// The hub as the authentication walk sends (`auth/walk.rs`): each request
/// it asks for a read of its own, from step 1.
impl Sender for Upstream<'_> {
    fn follow(&self, read: &mut Read) -> impl Future<Output = ReadResult> + Send {
        Upstream::follow(self, read)
    }

    fn fetch_token(&self, ask: &mut Read) -> impl Future<Output = ReadResult> + Send {
        spans::token_span(ask).around(Upstream::follow(self, ask))
    }

    fn rejected(&self) -> &Rejected {
        &self.reads.rejected
    }

    fn deadline(&self) -> Instant {
        self.reads.budget.deadline()
    }

    fn host_name(&self, url: &reqwest::Url) -> String {
        host_name(url)
    }
}
