//! What the read quota costs a request in process: a
//! reservation and its settlement on [`LocalQuotas`] against one check of a
//! keyed governor limiter over the same keys (what the per-IP limit costs a
//! request), through the public API only.
//!
//! `cargo bench --bench quota` measures, for 1024 and 65536 client keys
//! cycled in order, each inserted before timing:
//!
//! - `governor`: one `check_key` of a keyed GCRA limiter over governor's
//!   `DashMapStateStore` hashed by foldhash;
//! - `reserve_settle`: `LocalQuotas::reserve_now` of 10 reads then
//!   `refund_now` of 7 (a request that spent 3 of its budget of 10).
//!
//! The quotas are large enough that every check and reservation is
//! admitted; refusals are counted and must be 0.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fanout_budget::inbound::quota::{LocalQuotas, QuotaClass, Rate, Verdict};
use foldhash::fast::RandomState;
use governor::clock::DefaultClock;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

fn keys(n: u32) -> Vec<IpAddr> {
    (0..n)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
        .collect()
}

fn bench(c: &mut Criterion) {
    for n in [1024u32, 65_536] {
        let keys = keys(n);
        let mut group = c.benchmark_group(format!("quota_{n}_keys"));
        let store: DashMapStateStore<IpAddr, RandomState> =
            DashMapStateStore::with_hasher(RandomState::default());
        let quota = Quota::per_minute(NonZeroU32::new(u32::MAX).unwrap());
        let governor: RateLimiter<IpAddr, _, DefaultClock> =
            RateLimiter::new(quota, store, DefaultClock::default());
        let mut refused = 0u64;
        for key in &keys {
            refused += u64::from(governor.check_key(key).is_err());
        }
        let mut i = 0;
        group.bench_function("governor", |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                refused += u64::from(governor.check_key(black_box(&keys[i])).is_err());
            })
        });
        // 10 reads reserved, 3 spent, a trillion reads an hour: never refused.
        let rate = Rate::new(1 << 40, Duration::from_secs(3600), 1 << 20);
        let quotas = LocalQuotas::new(Some(rate), None);
        for key in &keys {
            quotas.reserve_now(QuotaClass::Public, *key, 10);
        }
        group.bench_function("reserve_settle", |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                let key = black_box(keys[i]);
                let verdict = quotas.reserve_now(QuotaClass::Public, key, 10);
                refused += u64::from(matches!(verdict, Verdict::Refused { .. }));
                quotas.refund_now(QuotaClass::Public, key, 7);
            })
        });
        group.finish();
        println!("quota_{n}_keys: refused (must be 0): {refused}");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
