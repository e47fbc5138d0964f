//! The cache's own tests: the fill-once rule under misses that end
//! together; keys whose stored hashes collide.

use super::*;

/// Misses of one key ending at the same instant on many threads fill
/// the entry once: exactly one of them keeps its answer.
#[test]
fn misses_ending_together_fill_an_entry_once() {
    let cache = Arc::new(AnswerCache::<()>::new(1 << 20));
    let answer = Arc::new(UpstreamResponse::new(
        "registry.local",
        http::StatusCode::OK,
        http::HeaderMap::new(),
        bytes::Bytes::from_static(b"{}"),
    ));
    let threads = 8;
    for round in 0..200 {
        let url = format!("http://registry.local/v2/blobs/{round}");
        let barrier = Arc::new(std::sync::Barrier::new(threads));
        let kept: usize = (0..threads)
            .map(|_| {
                let (cache, answer, barrier) = (cache.clone(), answer.clone(), barrier.clone());
                let read = Read::get(url.parse().unwrap()).immutable();
                std::thread::spawn(move || {
                    let lookup = cache.probe(&read, None, false).unwrap().missed();
                    barrier.wait();
                    usize::from(cache.keep(lookup, &answer, None, ()).is_some())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .sum();
        assert_eq!(
            kept, 1,
            "round {round}: {kept} of {threads} kept the answer"
        );
    }
}

/// An answer whose body is `body`.
fn answer(body: &'static str) -> Arc<UpstreamResponse> {
    Arc::new(UpstreamResponse::new(
        "registry.local",
        http::StatusCode::OK,
        http::HeaderMap::new(),
        bytes::Bytes::from_static(body.as_bytes()),
    ))
}

/// Two reads whose keys carry the same stored hash are still two keys: each
/// is answered with its own entry, never the other's, and a read whose
/// entry is not kept misses though another under its hash is.
#[test]
fn keys_with_the_same_hash_are_told_apart() {
    let cache = AnswerCache::<()>::new(1 << 20);
    let read = |tag: &str| {
        let url = format!("http://registry.local/v2/app/manifests/{tag}");
        Read::get(url.parse().unwrap()).immutable()
    };
    let (a, b) = (read("a"), read("b"));
    let probe = |read| {
        let mut probe = cache.probe(read, None, false).unwrap();
        probe.key = probe.key.with_hash(42);
        probe
    };
    let body = |probe: &Probe<'_>| {
        let mut hit = cache.get(probe, None)?;
        Some(hit.answer().unwrap().body.clone())
    };
    assert!(cache
        .keep(probe(&a).missed(), &answer("a"), None, ())
        .is_some());
    assert_eq!(body(&probe(&a)).as_deref(), Some(&b"a"[..]));
    assert_eq!(body(&probe(&b)), None, "b answered with a's entry");
    assert!(cache
        .keep(probe(&b).missed(), &answer("b"), None, ())
        .is_some());
    assert_eq!(body(&probe(&b)).as_deref(), Some(&b"b"[..]));
    assert_eq!(body(&probe(&a)).as_deref(), Some(&b"a"[..]));
}
