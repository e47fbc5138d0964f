//! Whose doing a failed token fetch is. A token fetch is shared: one read
//! sends it, every read of any request that needs the same token meanwhile
//! waits for it, and all of them get its outcome. Its failure is one of
//! three [`Fault`]s, decided where it is known — the read's error, or the
//! realm's answer — never from an error's text:
//!
//! - **the realm's** ([`Fault::Realm`]): it failed to answer (transport
//!   error, timeout, a redirect the engine does not follow), answered an
//!   error status other than `403` (a `401`, a `404`, a `5xx`), an answer that
//!   is not a token, or a token its request saw rejected. The realm is
//!   forgotten; the next read learns the upstream's challenge afresh.
//! - **a refusal** ([`Fault::Refused`]): the realm answered `403` (a scope
//!   the user is not granted), or its host said its quota is spent. The
//!   realm did its job: it is kept, and the error is every waiter's (the
//!   same key asks the same thing). A `401` is the realm's: refused
//!   credentials, or a realm the upstream moved away from, which may refuse
//!   everyone — kept, it would wedge every read with a scope.
//! - **the fetching request's own** ([`Fault::Fetcher`]): its budget, its
//!   deadline, a host slot it could not get in its time, the bound on the
//!   answer bytes it keeps ([`ReadError::AnswerBound`]). It says nothing of
//!   the realm, and nothing of a read that waited: that one fetches again
//!   itself.

use crate::error::ReadError;

/// How many times a read whose shared token fetch was stopped by the
/// fetching request's own bounds fetches again itself (each a read of its
/// own request, never past its deadline).
pub(crate) const REFETCHES: u32 = 2;

/// Whose doing a failed token fetch is (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The realm failed: it is forgotten.
    Realm,
    /// The realm (or its host) refused, as it should: it is kept.
    Refused,
    /// The fetching request's own bound stopped it: the realm is kept, and
    /// a read that waited on the fetch fetches again.
    Fetcher,
}

/// A failed token fetch: the error its reads get, and whose doing it is.
#[derive(Clone, Debug)]
pub(crate) struct FetchError {
    pub(crate) error: ReadError,
    pub(crate) fault: Fault,
}

impl FetchError {
    /// The realm's failure.
    pub(crate) fn realm(error: ReadError) -> Self {
        Self {
            error,
            fault: Fault::Realm,
        }
    }

    /// The realm's refusal.
    pub(crate) fn refused(error: ReadError) -> Self {
        Self {
            error,
            fault: Fault::Refused,
        }
    }

    /// The fetch's read to the realm (redirects included) failed with
    /// `error`: the realm's doing when it failed to answer, the fetching
    /// request's own when the engine stopped the read.
    pub(crate) fn read(error: ReadError) -> Self {
        let fault = match &error {
            ReadError::Upstream { .. } | ReadError::UpstreamTimeout { .. } => Fault::Realm,
            ReadError::QuotaExhausted { .. }
            | ReadError::Unauthorized { .. }
            | ReadError::Forbidden { .. } => Fault::Refused,
            ReadError::AnswerBound { .. }
            | ReadError::BudgetExhausted { .. }
            | ReadError::UpstreamBudgetExhausted { .. }
            | ReadError::TooManyHops { .. }
            | ReadError::DeadlineExceeded
            | ReadError::HostSaturated { .. }
            | ReadError::Unavailable { .. }
            | ReadError::BadUserInput { .. } => Fault::Fetcher,
        };
        Self { error, fault }
    }
}
