//! The host table and the in-process caps.

use super::table::{host_name_in, NAME_ON_STACK};
use super::*;

fn url(s: &str) -> reqwest::Url {
    reqwest::Url::parse(s).unwrap()
}

#[test]
fn hosts_are_named_as_the_hosts_tables_name_them() {
    let table = HostTable::new(&BTreeMap::new(), [], &[]);
    let name = |s: &str| table.resolve(&url(s)).name.to_string();
    assert_eq!(name("http://reg.example:5000/v2/a"), "reg.example:5000");
    // The scheme's default port is the port; an explicit default is the same host.
    assert_eq!(name("https://reg.example/v2/"), "reg.example:443");
    assert_eq!(name("http://reg.example:443/v2/"), "reg.example:443");
    assert_eq!(name("http://[::1]:8080/"), "[::1]:8080");
    // Written on the stack as `host_name` formats it, whatever the port
    // or the length; a host past the buffer is formatted on the heap.
    let long = format!("http://{}.example:9/", "a".repeat(NAME_ON_STACK));
    for s in [
        "http://h:0/",
        "http://h:1/",
        "http://h:10/",
        "http://h:65535/",
        "ftp://files.example/",
        "foo://no-known-port.example/",
        "http://127.0.0.1/",
        &long,
    ] {
        assert_eq!(name(s), host_name(&url(s)), "{s}");
    }
    assert!(host_name_in(&url(&long), &mut [0; NAME_ON_STACK]).is_none());
}

/// A host with a `[hosts]` table or known has its own entry; 50,000
/// other hosts add nothing and share one, each read keeping its name.
#[test]
fn only_configured_and_known_hosts_have_an_entry_of_their_own() {
    let coalescing = HostConfig {
        coalesce: true,
        ..Default::default()
    };
    let hosts = [("reg.example:5000".to_string(), coalescing)].into();
    let table = HostTable::new(&hosts, ["cdn.example:443"], &[]);
    let reg = table.resolve(&url("http://reg.example:5000/v2/a"));
    let reg_again = table.resolve(&url("http://reg.example:5000/v2/b?x=1"));
    assert!(Arc::ptr_eq(&reg.state, &reg_again.state));
    assert!(
        Arc::ptr_eq(&reg.name, &reg_again.name),
        "the entry's name, shared"
    );
    assert_eq!(&*reg.state.label, "reg.example:5000");
    assert!(reg.coalesce());
    let cdn = table.resolve(&url("https://cdn.example/blob"));
    assert_eq!(&*cdn.state.label, "cdn.example:443");
    assert!(!cdn.coalesce());
    let first = table.resolve(&url("http://h0.example/"));
    for i in 0..50_000 {
        let other = table.resolve(&url(&format!("http://h{i}.example:{}/", i % 65_536)));
        assert_eq!(*other.name, format!("h{i}.example:{}", i % 65_536));
        assert!(Arc::ptr_eq(&other.state, &first.state));
        let permit = table.entry(format!("db-{i}:5432"));
        assert!(Arc::ptr_eq(&permit.state, &first.state));
    }
    assert_eq!(&*first.state.label, OTHER_HOSTS);
    assert!(!first.coalesce());
    assert_eq!(table.own(), 2);
}

/// Hosts without a table are counted by name while they have reads in
/// flight, and forgotten with their last one.
#[tokio::test]
async fn an_unlimited_host_is_kept_only_while_it_has_reads_in_flight() {
    let caps = LocalHostCaps::new(BTreeMap::new());
    let left = Duration::from_secs(5);
    for i in 0..50_000 {
        let host = format!("h{i}.example:80");
        let slot = caps.acquire(&host, left).await.unwrap();
        assert_eq!(caps.in_flight(&host), 1);
        drop(slot);
    }
    assert_eq!(caps.counts.len(), 0, "hosts kept after their reads");
    let a = caps.acquire("a:1", left).await.unwrap();
    let b = caps.acquire("a:1", left).await.unwrap();
    let c = caps.acquire("b:1", left).await.unwrap();
    assert_eq!((caps.in_flight("a:1"), caps.in_flight("b:1")), (2, 1));
    assert_eq!(caps.counts.len(), 2);
    drop(a);
    assert_eq!(caps.in_flight("a:1"), 1);
    drop((b, c));
    assert_eq!(caps.counts.len(), 0);
}

#[tokio::test]
async fn a_slot_comes_back_on_drop_and_a_zero_cap_refuses_at_once() {
    let one = HostConfig {
        max_concurrent: 1,
        acquire_wait_ms: 10,
        ..Default::default()
    };
    let zero = HostConfig {
        max_concurrent: 0,
        acquire_wait_ms: 10_000,
        ..Default::default()
    };
    let caps = LocalHostCaps::new([("a:1".to_string(), one), ("z:1".to_string(), zero)].into());
    let left = Duration::from_secs(5);
    let slot = caps.acquire("a:1", left).await.unwrap();
    assert_eq!(caps.in_flight("a:1"), 1);
    let refused = caps.acquire("a:1", left).await.unwrap_err();
    assert_eq!(refused, HostRefusal::Saturated { max_concurrent: 1 });
    assert_eq!(caps.in_flight("a:1"), 1, "a refusal gives nothing back");
    drop(slot);
    assert_eq!(caps.in_flight("a:1"), 0);
    let started = tokio::time::Instant::now();
    assert!(caps.acquire("z:1", left).await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no wait at cap 0"
    );
    let unlimited: Vec<_> =
        futures::future::join_all((0..3).map(|_| caps.acquire("u:1", left))).await;
    assert_eq!(caps.in_flight("u:1"), 3);
    drop(unlimited);
    assert_eq!(caps.in_flight("u:1"), 0);
}
