//! The shares: which origin a URL's request counts against, and the take
//! that never passes the share under any interleaving of threads.
use super::*;
use proptest::prelude::*;
use std::sync::Arc;

fn shares(tables: &[(&str, &str, u64)]) -> Shares {
    let upstreams = tables
        .iter()
        .map(|(name, url, max)| {
            let table = UpstreamTable::default().url(*url).max_reads(*max);
            (name.to_string(), table)
        })
        .collect();
    Shares::new(&upstreams)
}

fn url(text: &str) -> reqwest::Url {
    text.parse().unwrap()
}

#[test]
fn a_request_counts_against_the_share_of_its_origin() {
    let shares = shares(&[
        ("a", "https://Registry.Example/v2/", 3),
        ("b", "http://127.0.0.1:5000", 1),
        ("free", "http://127.0.0.1:6000", 0),
    ]);
    let a = shares.of(&url("https://registry.example/v2/x/tags/list"));
    assert!(a.is_some());
    // The default port is the origin's.
    assert_eq!(shares.of(&url("https://REGISTRY.example:443/other")), a);
    // Another scheme, port or host is another origin.
    assert_eq!(shares.of(&url("http://registry.example/v2/")), None);
    assert_eq!(shares.of(&url("https://registry.example:8443/v2/")), None);
    assert_eq!(shares.of(&url("https://auth.registry.example/token")), None);
    let b = shares.of(&url("http://127.0.0.1:5000/item/1"));
    assert!(b.is_some() && b != a);
    // No share of its own (0): not a share.
    assert_eq!(shares.of(&url("http://127.0.0.1:6000/ok")), None);
}

#[test]
fn without_a_share_nothing_is_looked_at_and_nothing_is_held() {
    let shares = shares(&[("a", "http://127.0.0.1:5000", 0)]);
    assert!(shares.capped.is_empty());
    assert_eq!(shares.of(&url("http://127.0.0.1:5000/")), None);
    assert!(shares.open().used.is_empty());
}

#[test]
fn a_spent_share_refuses_naming_its_upstream_and_a_give_back_reopens_it() {
    let shares = shares(&[("a", "http://127.0.0.1:5000", 2)]);
    let id = shares.of(&url("http://127.0.0.1:5000/")).unwrap();
    let request = shares.open();
    assert!(shares.try_take(&request, id).is_ok());
    assert!(!shares.is_spent(&request, id));
    assert!(shares.try_take(&request, id).is_ok());
    assert!(shares.is_spent(&request, id));
    let refused = shares.try_take(&request, id).unwrap_err();
    assert_eq!(
        refused,
        ReadError::UpstreamBudgetExhausted {
            upstream: "a".into(),
            limit: 2
        }
    );
    assert_eq!(refused.code(), "FANOUT_BUDGET_EXHAUSTED");
    assert_eq!(shares.used(&request, id), 2, "a refusal changes nothing");
    shares.give_back(&request, id);
    assert!(shares.try_take(&request, id).is_ok());
    // Another request's share is its own.
    let other = shares.open();
    assert_eq!(shares.used(&other, id), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Threads taking at once are granted exactly `min(takes, max)`.
    #[test]
    fn concurrent_takes_never_pass_the_share(max in 1u64..50, takes in 0u64..120, threads in 1usize..8) {
        let shares = Arc::new(shares(&[("a", "http://127.0.0.1:5000", max)]));
        let id = shares.of(&url("http://127.0.0.1:5000/")).unwrap();
        let request = Arc::new(shares.open());
        let per = takes.div_ceil(threads as u64);
        let granted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads as u64)
                .map(|t| {
                    let (shares, request) = (&shares, &request);
                    let n = per.min(takes.saturating_sub(t * per));
                    s.spawn(move || (0..n).filter(|_| shares.try_take(request, id).is_ok()).count() as u64)
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        prop_assert_eq!(granted, takes.min(max));
        prop_assert_eq!(shares.used(&request, id), takes.min(max));
    }
}
