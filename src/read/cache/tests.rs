//! The cache's own tests: the fill-once rule under misses that end
//! together; keys whose stored hashes collide; an entry's time.

use super::*;
use std::time::Instant;

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

/// An entry kept for a while answers until its time is up, then never,
/// and the next answer kept replaces it — also when no lookup found it
/// stale first.
#[test]
fn an_entry_answers_until_its_time_then_is_replaced() {
    let cache = AnswerCache::<()>::new(1 << 20);
    let ttl = Duration::from_millis(300);
    let url = "http://registry.local/v2/app/tags/list";
    let read = Read::get(url.parse().unwrap()).fresh_for(ttl);
    let probe = || cache.probe(&read, None, false).unwrap();
    let body = || Some(cache.get(&probe(), None)?.answer().unwrap().body.clone());
    let keep = |body| {
        cache
            .keep(probe().missed(), &answer(body), None, ())
            .is_some()
    };
    // Each entry's time runs from within `keep`: after `before`, and
    // before the instant taken when it returns.
    let before = Instant::now();
    assert!(keep("one"));
    let kept_at = Instant::now();
    let seen = body();
    if before.elapsed() < ttl {
        assert_eq!(seen.as_deref(), Some(&b"one"[..]), "fresh, not answered");
    }
    wait_past(kept_at + ttl);
    assert_eq!(body(), None, "answered past its time");
    assert!(keep("two"));
    // Stale again, not looked up: the next answer kept replaces it.
    wait_past(Instant::now() + ttl);
    let before = Instant::now();
    assert!(keep("three"));
    let seen = body();
    if before.elapsed() < ttl {
        assert_eq!(
            seen.as_deref(),
            Some(&b"three"[..]),
            "the stale entry stayed"
        );
    }
    // Kept for ever: no time at all.
    let blob = "http://registry.local/v2/app/blobs/a";
    let immutable = Read::get(blob.parse().unwrap()).immutable();
    let probe = || cache.probe(&immutable, None, false).unwrap();
    assert!(cache
        .keep(probe().missed(), &answer("a"), None, ())
        .is_some());
    let hit = cache.get(&probe(), None).expect("kept");
    assert!(hit.kept.ttl.is_none());
}

/// Waits until the clock is past `at` (the time itself is what is tested).
fn wait_past(at: Instant) {
    while let Some(left) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(left + Duration::from_millis(1));
    }
}

/// What a read declares is what the cache keeps it for: immutable for
/// ever whatever `fresh_for` said before or after, `fresh_for` that long,
/// zero or nothing not at all — and a read the cache was looked at for
/// stays one (the hub's lookup then skips it: `hub/lookup.rs`).
#[test]
fn a_read_is_kept_as_it_declares() {
    let url = || "http://registry.local/v2/app/manifests/a".parse().unwrap();
    let minute = Duration::from_secs(60);
    let kept_for = |read: Read| read.keep_for();
    assert_eq!(kept_for(Read::get(url()).immutable()), Some(None));
    let both = Read::get(url()).immutable().fresh_for(minute);
    assert_eq!(kept_for(both), Some(None));
    let both = Read::get(url()).fresh_for(minute).immutable();
    assert_eq!(kept_for(both), Some(None));
    let fresh = Read::get(url()).fresh_for(minute);
    assert_eq!(kept_for(fresh), Some(Some(minute)));
    assert_eq!(kept_for(Read::get(url()).fresh_for(Duration::ZERO)), None);
    assert_eq!(kept_for(Read::get(url())), None);
    let mut read = Read::get(url()).immutable().sha256("sha256:AB");
    assert!(read.is_checked() && !read.cache_done());
    assert_eq!(read.take_check().as_deref(), Some("ab"));
    assert!(read.cache_done() && !read.is_checked());
    assert_eq!(read.keep_for(), None);
    // Declared again after the lookup (the engine never does): still done.
    let read = read.immutable().fresh_for(minute);
    assert!(read.cache_done() && !read.is_checked());
}
