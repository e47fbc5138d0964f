//! Automatic persisted queries, Apollo's protocol.
//!
//! A client sends `extensions.persistedQuery = {version: 1, sha256Hash}`
//! and no `query`; when the server knows the hash it runs the text it kept
//! for it, else it answers `PERSISTED_QUERY_NOT_FOUND` (message
//! `PersistedQueryNotFound`, which Apollo's link matches) and the client
//! sends the text with the hash once, which the server checks (the SHA-256
//! of the text, in hex) and keeps. A GET then carries only the hash, and
//! repeated requests do not resend large texts.
//!
//! How it works: one `std::sync::RwLock` around two generations of maps
//! from the hash to the text. A lookup takes the read lock and clones an
//! `Arc<str>`, from the current generation or else the previous one (a hit
//! there is copied into the current one). Bounded by memory (`[http]
//! persisted_queries_bytes`, each entry weighed as its text plus
//! [`ENTRY_OVERHEAD`]), half for each generation: when a new text would
//! pass the current one's half, the previous generation is dropped (freed
//! outside the lock) and the current one becomes the previous. A text in
//! use survives as long as it is asked for once per generation; a client
//! registering many texts costs the others at most a resend, never memory.
//! A text is kept only once its hash is checked, so nobody can plant a text
//! under another text's hash. The kept text is parsed like any other
//! through the parsed-document cache (`cache.rs`).

use crate::error::OperationError;
use crate::seed::random_state;
use async_graphql::{Request, Value};
use foldhash::fast::SeedableRandomState;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// What one kept entry weighs besides its text: the map's slot (the
/// 32-byte key and the `Arc<str>`, at the map's load factor), the `Arc`'s
/// counters and the allocator's rounding.
const ENTRY_OVERHEAD: usize = 128;

/// The query texts kept by hash (bounded).
pub(crate) struct PersistedQueries {
    table: RwLock<Table>,
    max_bytes: usize,
}

struct Table {
    current: Generation,
    previous: Generation,
}

struct Generation {
    texts: HashMap<[u8; 32], Arc<str>, SeedableRandomState>,
    bytes: usize,
}

impl Generation {
    fn new() -> Self {
        Self {
            texts: HashMap::with_hasher(random_state()),
            bytes: 0,
        }
    }
}

impl PersistedQueries {
    /// Keeps texts weighing at most `max_bytes` in all; `0`: off.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            table: RwLock::new(Table {
                current: Generation::new(),
                previous: Generation::new(),
            }),
            max_bytes,
        }
    }

    /// Applies `request`'s `extensions.persistedQuery`, if any: fills in
    /// the kept text of a hash-only request, or checks and keeps the text
    /// sent with its hash. A request without the extension is left as it is.
    pub(crate) fn resolve(&self, request: &mut Request) -> Result<(), OperationError> {
        let Some(ext) = request.extensions.get("persistedQuery") else {
            return Ok(());
        };
        let hash = parse(ext)?;
        if request.query.is_empty() {
            if self.max_bytes == 0 {
                return Err(OperationError::PersistedQueryNotSupported {
                    message: "persisted queries are off on this server".into(),
                });
            }
            let (kept, current) = {
                let table = self.read();
                match table.current.texts.get(&hash) {
                    Some(text) => (Some(text.clone()), true),
                    None => (table.previous.texts.get(&hash).cloned(), false),
                }
            };
            let Some(text) = kept else {
                return Err(OperationError::PersistedQueryNotFound);
            };
            if !current {
                self.keep(hash, &text);
            }
            request.query = text.to_string();
            return Ok(());
        }
        if <[u8; 32]>::from(Sha256::digest(request.query.as_bytes())) != hash {
            return Err(OperationError::PersistedQueryHashMismatch);
        }
        self.keep(hash, &request.query);
        Ok(())
    }

    /// Keeps `text` in the current generation (see the module docs).
    fn keep(&self, hash: [u8; 32], text: &str) {
        let half = self.max_bytes / 2;
        let entry = text.len() + ENTRY_OVERHEAD;
        if entry > half / 16 {
            return;
        }
        let dropped = {
            let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
            if table.current.texts.contains_key(&hash) {
                return;
            }
            let dropped = (table.current.bytes + entry > half).then(|| {
                let current = std::mem::replace(&mut table.current, Generation::new());
                std::mem::replace(&mut table.previous, current)
            });
            table.current.texts.insert(hash, text.into());
            table.current.bytes += entry;
            dropped
        };
        drop(dropped);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The kept texts' weight now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        let table = self.read();
        table.current.bytes + table.previous.bytes
    }
}

/// `{version: 1, sha256Hash: "<64 hex digits>"}` → the hash.
fn parse(ext: &Value) -> Result<[u8; 32], OperationError> {
    let unsupported = |message: &str| OperationError::PersistedQueryNotSupported {
        message: message.into(),
    };
    let Value::Object(ext) = ext else {
        return Err(unsupported("extensions.persistedQuery must be an object"));
    };
    match ext.get("version") {
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        _ => return Err(unsupported("only persisted query version 1 is supported")),
    }
    let Some(Value::String(hex)) = ext.get("sha256Hash") else {
        return Err(unsupported(
            "extensions.persistedQuery.sha256Hash is missing",
        ));
    };
    let bytes = hex.as_bytes();
    let mut hash = [0u8; 32];
    if bytes.len() != 64 {
        return Err(unsupported("sha256Hash must be 64 hex digits"));
    }
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |b: u8| (b as char).to_digit(16);
        match (digit(pair[0]), digit(pair[1])) {
            (Some(hi), Some(lo)) => hash[i] = (hi * 16 + lo) as u8,
            _ => return Err(unsupported("sha256Hash must be 64 hex digits")),
        }
    }
    Ok(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_of(text: &str) -> String {
        Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn request(query: &str, hash: &str) -> Request {
        let mut request = Request::new(query);
        let ext = serde_json::json!({"version": 1, "sha256Hash": hash});
        request.extensions.insert(
            "persistedQuery".into(),
            Value::from_json(ext).expect("a value"),
        );
        request
    }

    #[test]
    fn hash_only_misses_then_the_text_registers_it() {
        let store = PersistedQueries::new(1 << 20);
        let text = "{ __typename }";
        let hash = hash_of(text);
        let mut first = request("", &hash);
        assert_eq!(
            store.resolve(&mut first),
            Err(OperationError::PersistedQueryNotFound)
        );
        store.resolve(&mut request(text, &hash)).unwrap();
        let mut again = request("", &hash.to_uppercase());
        store.resolve(&mut again).unwrap();
        assert_eq!(again.query, text);
    }

    #[test]
    fn a_text_is_kept_only_under_its_own_hash() {
        let store = PersistedQueries::new(1 << 20);
        let other = hash_of("{ other }");
        assert_eq!(
            store.resolve(&mut request("{ __typename }", &other)),
            Err(OperationError::PersistedQueryHashMismatch)
        );
        assert_eq!(
            store.resolve(&mut request("", &other)),
            Err(OperationError::PersistedQueryNotFound)
        );
    }

    #[test]
    fn malformed_extensions_are_not_supported() {
        let store = PersistedQueries::new(1 << 20);
        for hash in ["", "xyz", &"g".repeat(64), &"a".repeat(63)] {
            let err = store.resolve(&mut request("", hash)).unwrap_err();
            assert!(
                matches!(err, OperationError::PersistedQueryNotSupported { .. }),
                "{hash}"
            );
        }
        let mut v2 = Request::new("");
        v2.extensions.insert(
            "persistedQuery".into(),
            Value::from_json(serde_json::json!({"version": 2, "sha256Hash": hash_of("x")}))
                .unwrap(),
        );
        assert!(matches!(
            store.resolve(&mut v2),
            Err(OperationError::PersistedQueryNotSupported { .. })
        ));
    }

    #[test]
    fn memory_stays_within_the_bound() {
        let max = 16 << 10;
        let store = PersistedQueries::new(max);
        for i in 0..10_000 {
            let text = format!("{{ field{i} }}");
            store.resolve(&mut request(&text, &hash_of(&text))).unwrap();
            assert!(store.bytes() <= max);
        }
        // The latest text is still there.
        let last = "{ field9999 }";
        let mut hit = request("", &hash_of(last));
        store.resolve(&mut hit).unwrap();
        assert_eq!(hit.query, last);
    }

    #[test]
    fn a_text_in_use_survives_a_flood_of_registrations() {
        let max = 64 << 10;
        let store = PersistedQueries::new(max);
        let used = "{ used }";
        store.resolve(&mut request(used, &hash_of(used))).unwrap();
        // Each round registers fewer texts than a generation holds, then
        // asks for the one in use.
        for round in 0..50 {
            for i in 0..100 {
                let text = format!("{{ flood{round}x{i} }}");
                store.resolve(&mut request(&text, &hash_of(&text))).unwrap();
            }
            let mut hit = request("", &hash_of(used));
            store.resolve(&mut hit).unwrap();
            assert_eq!(hit.query, used, "round {round}");
            assert!(store.bytes() <= max);
        }
        // One not asked for is gone after two generations.
        let mut gone = request("", &hash_of("{ flood0x0 }"));
        assert_eq!(
            store.resolve(&mut gone),
            Err(OperationError::PersistedQueryNotFound)
        );
    }

    #[test]
    fn off_refuses_hash_only_but_runs_texts() {
        let store = PersistedQueries::new(0);
        let text = "{ __typename }";
        assert!(matches!(
            store.resolve(&mut request("", &hash_of(text))),
            Err(OperationError::PersistedQueryNotSupported { .. })
        ));
        let mut full = request(text, &hash_of(text));
        store.resolve(&mut full).unwrap();
        assert_eq!(full.query, text);
    }
}
