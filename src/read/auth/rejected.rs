//! The tokens one inbound request saw rejected: never sent again by it,
//! never kept again from its answers.
//!
//! A request's reads are de-duplicated (`dedup.rs`): the token fetch it
//! repeats after a rejection is answered with the very answer that gave
//! the rejected token. Each token an upstream answered `401` to is noted
//! here (a hash of it: no secret is held; 8 bytes for each distinct token
//! the request was refused with); a token fetch whose token is noted is an error, not a
//! token, and the kept token cache never takes it.

use http::HeaderValue;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

/// The tokens one request saw rejected.
#[derive(Default)]
pub(crate) struct Rejected {
    /// Keyed at random per request.
    hasher: RandomState,
    /// Whether any is noted (the common case, none, takes no lock).
    any: AtomicBool,
    noted: Mutex<Vec<u64>>,
}

impl Rejected {
    /// Notes `token` (an `Authorization` value) as rejected.
    pub(crate) fn note(&self, token: &HeaderValue) {
        let hash = self.hasher.hash_one(token.as_bytes());
        let mut noted = self.noted.lock().expect("not poisoned");
        if !noted.contains(&hash) {
            noted.push(hash);
        }
        self.any.store(true, Relaxed);
    }

    /// Whether `token` was rejected in this request.
    pub(crate) fn has(&self, token: &HeaderValue) -> bool {
        if !self.any.load(Relaxed) {
            return false;
        }
        let hash = self.hasher.hash_one(token.as_bytes());
        self.noted.lock().expect("not poisoned").contains(&hash)
    }
}
