//! The in-process inbound limiter (GCRA via governor) on a fake clock.
use fanout_budget::{Decision, LocalLimiter};
use governor::clock::FakeRelativeClock;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

#[test]
fn five_per_minute_refills_one_every_twelve_seconds() {
    let clock = FakeRelativeClock::default();
    let limiter = LocalLimiter::with_clock(NonZeroU32::new(5).unwrap(), clock.clone());
    for remaining in (0..5).rev() {
        assert!(
            matches!(limiter.check(ip(1)), Decision::Allow { remaining: r, .. } if r == remaining)
        );
    }
    assert_eq!(
        limiter.check(ip(1)),
        Decision::Deny {
            retry_after: Duration::from_secs(12)
        }
    );
    clock.advance(Duration::from_secs(5));
    assert_eq!(
        limiter.check(ip(1)),
        Decision::Deny {
            retry_after: Duration::from_secs(7)
        }
    );
    clock.advance(Duration::from_secs(7));
    assert!(matches!(
        limiter.check(ip(1)),
        Decision::Allow { remaining: 0, .. }
    ));
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_million_distinct_clients_do_not_grow_memory_without_bound() {
    let clock = FakeRelativeClock::default();
    let limiter = LocalLimiter::with_clock(NonZeroU32::new(300).unwrap(), clock.clone());
    let rss_before = rss_kib();
    let mut peak_keys = 0;
    // 1,000,000 distinct addresses, one request each, 10,000 per second.
    for n in 0..1_000_000u32 {
        assert!(matches!(limiter.check(ip(n)), Decision::Allow { .. }));
        clock.advance(Duration::from_micros(100));
        peak_keys = peak_keys.max(limiter.len());
    }
    // A key is idle 200 ms (one emission interval at 300/min) after its
    // request, so about 2,000 keys are live at 10,000/s. Sweeps run every
    // max(4096, 2 × keys left) checks, so at most ~3 × live + 4096 are held.
    assert!(
        peak_keys < 16_000,
        "peak {peak_keys} keys held for 1,000,000 clients"
    );
    clock.advance(Duration::from_secs(60));
    limiter.sweep();
    assert_eq!(limiter.len(), 0, "idle keys are evicted");
    if let (Some(before), Some(after)) = (rss_before, rss_kib()) {
        println!("1,000,000 distinct clients: peak {peak_keys} keys held, RSS {before} KiB -> {after} KiB");
    }
}
