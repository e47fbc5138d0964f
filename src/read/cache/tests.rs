//! The cache's own tests: the fill-once rule under misses that end together.

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
