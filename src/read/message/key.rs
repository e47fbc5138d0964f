//! A read's identity: what makes two reads the same read, for the
//! request's de-duplication (`dedup.rs`) and the engine's cache
//! (`cache.rs`) — owned ([`ReadKey`]), kept in their maps, or borrowed from
//! the read ([`KeyView`]), to look one up without copying the read's URL.
//! Both hash and compare through the view, so a view finds its key.
//!
//! Each carries its hash, computed once when the view is made (seeded
//! foldhash, one seed per process): a map hashes only that `u64` (the
//! cache's with [`KeyHash`], a pass-through), and two keys compare their
//! hashes first, so a lookup probing past other entries rejects each on
//! one integer, not on their URLs. Equal hashes still compare every field:
//! a collision never makes two reads the same read.

use foldhash::fast::SeedableRandomState;
use http::{HeaderName, HeaderValue};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, OnceLock};

/// What makes two reads the same read: the method, the URL, the headers,
/// the body, and the caller's key (a read that is not a `GET` or `HEAD` has
/// one, or is never shared).
#[derive(Clone)]
pub(crate) struct ReadKey {
    /// The hash of the rest (first: compared first).
    hash: u64,
    method: http::Method,
    url: Box<str>,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// A `GET` with a body (a search API's) answers by its body too.
    body: bytes::Bytes,
    key: Option<Box<str>>,
    /// In the cache's keys: who the credentials the engine sends to the
    /// read's upstream belong to (`read/auth.rs`).
    credential: Option<Arc<str>>,
    /// In the cache's keys: an answer any credentials may share
    /// (`read/cache.rs`); no credential, no `Authorization`.
    shared: bool,
}

impl ReadKey {
    /// The key an answer any credentials may share is kept under: this one
    /// without its credentials.
    pub(crate) fn shared(&self) -> Self {
        self.view().shared()
    }

    /// The request the key names, as the HTTP caching rules see it: its
    /// method, URL and headers, with an `Authorization` (a stand-in) if
    /// `authorized`, else none.
    pub(crate) fn request(&self, authorized: bool) -> Option<http::Request<()>> {
        let mut request = http::Request::builder()
            .method(self.method.clone())
            .uri(&*self.url);
        for (name, value) in &self.headers {
            if name != http::header::AUTHORIZATION {
                request = request.header(name, value);
            }
        }
        if authorized {
            request = request.header(http::header::AUTHORIZATION, "credentials");
        }
        request.body(()).ok()
    }

    /// The key, borrowed (how it hashes and compares).
    pub(crate) fn view(&self) -> KeyView<'_> {
        KeyView {
            hash: self.hash,
            method: &self.method,
            url: &self.url,
            headers: &self.headers,
            body: &self.body,
            key: self.key.as_deref(),
            credential: self.credential.as_deref(),
            shared: self.shared,
        }
    }

    /// The bytes the key holds, roughly (the cache weighs its entries).
    pub(crate) fn weight(&self) -> usize {
        let headers: usize = (self.headers.iter())
            .map(|(n, v)| n.as_str().len() + v.len() + 64)
            .sum();
        self.url.len() + headers + self.body.len()
    }
}

/// A [`ReadKey`] borrowed from its read: what the cache is looked up by on
/// every read it may answer, so a hit copies nothing of the read.
#[derive(Clone, Copy)]
pub(crate) struct KeyView<'a> {
    /// The hash of the rest (first: compared first).
    hash: u64,
    method: &'a http::Method,
    url: &'a str,
    headers: &'a [(HeaderName, HeaderValue)],
    body: &'a bytes::Bytes,
    key: Option<&'a str>,
    credential: Option<&'a str>,
    shared: bool,
}

impl<'a> KeyView<'a> {
    /// A read's key (see [`Read::identity`](super::Read::identity)), with
    /// whom the credentials the engine sends belong to, if any.
    pub(crate) fn new(
        method: &'a http::Method,
        url: &'a str,
        (headers, body): (&'a [(HeaderName, HeaderValue)], &'a bytes::Bytes),
        key: Option<&'a str>,
        credential: Option<&'a str>,
    ) -> Self {
        let mut view = Self {
            hash: 0,
            method,
            url,
            headers,
            body,
            key,
            credential,
            shared: false,
        };
        view.hash = view.hash_of();
        view
    }

    /// The hash of the view's fields: each text written whole (foldhash
    /// turns its state by each one's length), what a read may lack (a
    /// body, a key, a credential) only when it has it, and last which parts
    /// it had and how many headers — so two keys whose parts split
    /// differently do not hash alike by construction.
    fn hash_of(&self) -> u64 {
        static STATE: OnceLock<SeedableRandomState> = OnceLock::new();
        let state = STATE.get_or_init(crate::seed::random_state);
        let mut hasher = state.build_hasher();
        hasher.write(self.url.as_bytes());
        hasher.write(self.method.as_str().as_bytes());
        for (name, value) in self.headers {
            hasher.write(name.as_str().as_bytes());
            hasher.write(value.as_bytes());
        }
        if !self.body.is_empty() {
            hasher.write(self.body);
        }
        for text in [self.key, self.credential].into_iter().flatten() {
            hasher.write(text.as_bytes());
        }
        let had = [self.key.is_some(), self.credential.is_some(), self.shared]
            .into_iter()
            .fold(u64::from(!self.body.is_empty()), |had, part| {
                had << 1 | u64::from(part)
            });
        hasher.write_u64((self.headers.len() as u64) << 8 | had);
        hasher.finish()
    }

    /// The same key under the hash `hash`: two keys that collide.
    #[cfg(test)]
    pub(crate) fn with_hash(mut self, hash: u64) -> Self {
        self.hash = hash;
        self
    }

    /// The key it borrows, owned (its credential copied: a miss's cost).
    pub(crate) fn to_owned(self) -> ReadKey {
        ReadKey {
            hash: self.hash,
            method: self.method.clone(),
            url: self.url.into(),
            headers: self.headers.to_vec(),
            body: self.body.clone(),
            key: self.key.map(Into::into),
            credential: self.credential.map(Into::into),
            shared: self.shared,
        }
    }
}

impl KeyView<'_> {
    /// The key an answer any credentials may share is kept under: this one
    /// without its credentials, owned.
    pub(crate) fn shared(self) -> ReadKey {
        let headers: Vec<_> = (self.headers.iter())
            .filter(|(name, _)| name != http::header::AUTHORIZATION)
            .cloned()
            .collect();
        let shared = KeyView {
            headers: &headers,
            credential: None,
            shared: true,
            ..self
        };
        ReadKey {
            hash: shared.hash_of(),
            method: self.method.clone(),
            url: self.url.into(),
            headers,
            body: self.body.clone(),
            key: self.key.map(Into::into),
            credential: None,
            shared: true,
        }
    }
}

/// The hash first, then every field. An empty byte string (a `GET`'s
/// body, most often) is not handed to `memcmp`: an empty `Bytes` points
/// nowhere, and glibc's AVX-512 `memcmp` loads it under an empty mask —
/// a fault suppressed by a microcode assist, a fifth of a cache hit's time
/// (`perf`, `read_path/engine_cache_hit`).
impl PartialEq for KeyView<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && same(self.url.as_bytes(), other.url.as_bytes())
            && self.method == other.method
            && self.shared == other.shared
            && same_str(self.key, other.key)
            && same_str(self.credential, other.credential)
            && self.headers == other.headers
            && same(self.body, other.body)
    }
}

impl Eq for KeyView<'_> {}

/// `a == b`, without `memcmp` for empty ones.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// [`same`], for optional strings.
fn same_str(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same(a.as_bytes(), b.as_bytes()),
        (a, b) => a.is_none() && b.is_none(),
    }
}

/// Through the view.
impl PartialEq for ReadKey {
    fn eq(&self, other: &Self) -> bool {
        self.view() == other.view()
    }
}

impl Eq for ReadKey {}

impl moka::Equivalent<ReadKey> for KeyView<'_> {
    fn equivalent(&self, key: &ReadKey) -> bool {
        *self == key.view()
    }
}

/// A key hashes as its stored hash: a [`KeyView`] as the key it borrows.
impl Hash for KeyView<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Through the view: a [`ReadKey`] hashes as its [`KeyView`].
impl Hash for ReadKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The hasher of a map keyed by [`ReadKey`]s alone (the engine's cache):
/// their stored hash, as it is — already seeded, so not steerable by
/// whoever chooses the URLs.
#[derive(Clone, Copy, Default)]
pub(crate) struct KeyHash;

/// What [`KeyHash`] builds: the `u64` a key writes.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only keys write here, each one `u64`; anything else still hashes.
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

#[cfg(test)]
mod tests {
    use super::KeyView;
    use http::{HeaderName, HeaderValue};

    /// Parts moved from one field to another, or a part present but empty
    /// against one absent, make keys that differ — and hash apart, whatever
    /// the seed: the hash says which parts a key had.
    #[test]
    fn keys_whose_parts_split_differently_hash_apart() {
        let get = http::Method::GET;
        let url = "http://registry.test/v2/a/manifests/b";
        let header = [(HeaderName::from_static("h"), HeaderValue::from_static("v"))];
        let (body, none) = (bytes::Bytes::from_static(b"h"), bytes::Bytes::new());
        let keys = [
            KeyView::new(&get, url, (&header, &none), None, None),
            KeyView::new(&get, url, (&[], &body), Some("v"), None),
            KeyView::new(&get, url, (&[], &none), Some("h"), Some("v")),
            KeyView::new(&get, url, (&[], &none), Some(""), None),
            KeyView::new(&get, url, (&[], &none), None, Some("")),
            KeyView::new(&get, url, (&[], &none), None, None),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert!(a != b);
                assert_ne!(a.hash, b.hash);
            }
        }
    }
}
