//! The read quota's bookkeeping on each replica, on paused time, against a
//! model of `lua/quota.lua` (the same arithmetic, on the quota's clock):
//! what a replica takes ahead, hands out, gives back and refuses by itself;
//! two replicas sharing one client's quota; the calls a hot client costs;
//! a reservation dropped mid-call; memory for a million clients. The script
//! itself, on a real Redis and Redis Cluster: `gateway/tests/quota_fleet.rs`.

use super::clients::{Class, Client, Held, Owing};
use super::stock::{Now, Plan, Stock, HOLD, WINDOW};
use crate::inbound::quota::{Rate, Verdict};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{advance, Instant};

/// `lua/quota.lua` and the clock, for the replicas of one test.
struct Redis {
    rate: Rate,
    /// The client's bucket: the instant it is full again (ns).
    full: u64,
    origin: Instant,
    calls: u64,
    /// Reads granted in all.
    granted: u64,
}

/// One replica's view of the client.
struct Replica {
    stock: Stock,
    /// What requests gave back (`Client::refunded`).
    refunded: u64,
}

impl Replica {
    fn new() -> Self {
        Self {
            stock: Stock::new(Instant::now()),
            refunded: 0,
        }
    }
}

impl Redis {
    fn new(rate: Rate) -> Self {
        Self {
            rate,
            full: 0,
            origin: Instant::now(),
            calls: 0,
            granted: 0,
        }
    }

    fn now(&self) -> Now {
        let at = Instant::now();
        Now {
            at,
            ns: (at - self.origin).as_nanos() as u64,
        }
    }

    /// What `RedisReadQuota::reserve` does, the call answered at once.
    fn reserve(&mut self, replica: &mut Replica, need: u64) -> Verdict {
        let now = self.now();
        replica.stock.given += std::mem::take(&mut replica.refunded);
        let (take, ahead, back) = match replica.stock.plan(&self.rate, now, need, 0) {
            Plan::Done(verdict) => return verdict,
            Plan::Call { take, ahead, back } => (take, ahead, back),
        };
        self.calls += 1;
        let rate = self.rate;
        // quota.lua: give back, then take what fits, at most half of the rest ahead.
        let full = rate.give_back(self.full, now.ns, back);
        let fit = rate.left(full, now.ns);
        if take <= fit {
            let granted = take + ahead.min((fit - take) / 2);
            self.granted += granted;
            self.full = rate.take(full, now.ns, granted).expect("it fits");
            let full_in = Duration::from_nanos(self.full - now.ns);
            replica.stock.left += granted;
            replica.stock.granted(&rate, now, full_in, need)
        } else {
            self.full = full;
            let wait = rate.take(full, now.ns, take).expect_err("it does not fit");
            let full_in = Duration::from_nanos(full - now.ns);
            (replica.stock).refused(&rate, now, full_in, Duration::from_nanos(wait))
        }
    }
}

fn reserved(verdict: Verdict) -> bool {
    matches!(verdict, Verdict::Reserved { .. })
}

/// 10 reads a second, 20 at most.
fn ten_a_second() -> Rate {
    Rate::new(600, Duration::from_secs(60), 20)
}

#[tokio::test(start_paused = true)]
async fn a_client_seen_once_takes_the_margin_ahead_then_its_demand_sizes_the_takes() {
    let rate = Rate::new(100_000, Duration::from_secs(60), 0);
    let mut redis = Redis::new(rate);
    let mut replica = Replica::new();
    let now = redis.now();
    assert_eq!(
        replica.stock.plan(&rate, now, 5, 0),
        Plan::Call {
            take: 5,
            ahead: 2,
            back: 0
        },
        "a client seen once takes what it needs and the margin (2)"
    );
    // Unless 31 reservations of 5 wait behind its first one.
    let mut burst = Replica::new();
    assert_eq!(
        burst.stock.plan(&rate, now, 5, 31 * 5),
        Plan::Call {
            take: 5,
            ahead: 3 * 31 * 5,
            back: 0
        }
    );
    // A client that reserves 5 reads every 10 ms: after the first calls,
    // each call takes about 750 ms of its demand.
    let mut replica = Replica::new();
    for _ in 0..1_000 {
        assert!(reserved(redis.reserve(&mut replica, 5)));
        advance(Duration::from_millis(10)).await;
    }
    // 10 s: one call a window at first, then one per 750 ms or so.
    println!("5 reads every 10 ms for 10 s: {} calls", redis.calls);
    assert!(
        (10..=20).contains(&redis.calls),
        "{} calls for 1,000 reservations in 10 s",
        redis.calls
    );
    // Nothing was handed out that Redis did not charge; the rest is stock.
    assert_eq!(redis.granted, 5_000 + replica.stock.left);
}

#[tokio::test(start_paused = true)]
async fn the_stock_is_handed_out_while_fresh_refunds_never_and_both_go_back_with_the_next_call() {
    let rate = Rate::new(100_000, Duration::from_secs(60), 0);
    let mut redis = Redis::new(rate);
    let mut replica = Replica::new();
    // Demand: 4 reservations of 5 in a window; the fifth call takes ahead.
    for _ in 0..4 {
        redis.reserve(&mut replica, 5);
    }
    let calls = redis.calls;
    assert!(replica.stock.left >= 5, "taken ahead");
    let stocked = replica.stock.left;
    // A refund waits to go back, never handed out again here.
    replica.refunded += 3;
    assert!(reserved(redis.reserve(&mut replica, 5)));
    assert_eq!(redis.calls, calls, "served from the stock");
    assert_eq!((replica.stock.left, replica.stock.given), (stocked - 5, 3));
    // Past the hold, what is left and the refund go back with the next call.
    advance(HOLD).await;
    let back = replica.stock.left + replica.stock.given;
    let now = redis.now();
    match replica.stock.plan(&rate, now, 5, 0) {
        Plan::Call {
            take, back: sent, ..
        } => assert_eq!((take, sent), (5, back)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (replica.stock.left, replica.stock.given),
        (0, 0),
        "given back with the call"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_kept_here_until_the_reads_fit() {
    let rate = ten_a_second();
    let mut redis = Redis::new(rate);
    let mut replica = Replica::new();
    // Another replica spent the whole burst.
    redis.full = rate.take(0, 0, 20).unwrap();
    let verdict = redis.reserve(&mut replica, 3);
    let Verdict::Refused {
        remaining,
        retry_after,
    } = verdict
    else {
        panic!("{verdict:?}")
    };
    assert_eq!((remaining, retry_after), (0, Duration::from_millis(300)));
    assert_eq!(redis.calls, 1);
    // Refused here, with the time left, until 3 reads fit; a smaller
    // reservation fits sooner.
    advance(Duration::from_millis(100)).await;
    let verdict = redis.reserve(&mut replica, 3);
    assert_eq!(
        verdict,
        Verdict::Refused {
            remaining: 1,
            retry_after: Duration::from_millis(200)
        }
    );
    assert_eq!(redis.calls, 1, "no call while it cannot fit");
    assert!(reserved(redis.reserve(&mut replica, 1)));
    assert_eq!(redis.calls, 2, "one read fits: asked");
    advance(Duration::from_millis(200)).await;
    let verdict = redis.reserve(&mut replica, 3);
    assert!(matches!(verdict, Verdict::Refused { .. }), "{verdict:?}");
    advance(Duration::from_millis(100)).await;
    assert!(reserved(redis.reserve(&mut replica, 3)));
    assert_eq!(redis.calls, 3);
}

/// Two replicas share one client's quota: a client over it, turn about on
/// both for a minute, is handed out its burst and what a minute refills,
/// no more, and hardly less; it costs a call per refill, not per request.
#[tokio::test(start_paused = true)]
async fn two_replicas_hand_out_the_quota_and_no_more() {
    let rate = ten_a_second();
    let mut redis = Redis::new(rate);
    let mut replicas = [Replica::new(), Replica::new()];
    let (mut spent, mut requests, mut refused) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for i in 0..3_000u64 {
        let replica = &mut replicas[(i % 2) as usize];
        requests += 1;
        if reserved(redis.reserve(replica, 3)) {
            // Some requests find an answer cached: one read back.
            let used = if i % 3 == 0 { 2 } else { 3 };
            spent += used;
            replica.refunded += 3 - used;
        } else {
            refused += 1;
        }
        advance(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let bound = rate.burst() + (elapsed.as_millis() / 100) as u64;
    println!(
        "two replicas, {elapsed:?}: spent {spent} of {bound}, {requests} requests, \
         {refused} refused, {} calls",
        redis.calls
    );
    assert!(spent <= bound, "spent {spent} > burst + refill {bound}");
    assert!(
        spent as f64 >= 0.95 * bound as f64,
        "spent {spent}, bound {bound}: too strict"
    );
    assert!(refused > 0);
    assert!(
        redis.calls * 5 <= requests,
        "{} calls for {requests} requests",
        redis.calls
    );
}

/// The load bench's client (one address, 2,000 requests a second of 5
/// reads each, on one replica, a quota it never reaches): about one call a
/// second, nothing beside the per-IP limit's one per 8 requests.
#[tokio::test(start_paused = true)]
async fn a_hot_client_costs_about_one_call_a_second() {
    let rate = Rate::new(1_000_000_000, Duration::from_secs(3600), 0);
    let mut redis = Redis::new(rate);
    let mut replica = Replica::new();
    for _ in 0..20_000 {
        assert!(reserved(redis.reserve(&mut replica, 5)));
        advance(Duration::from_micros(500)).await;
    }
    // A few calls while the takes grow to the demand, then one per 750 ms.
    println!("2,000 requests a second for 10 s: {} calls", redis.calls);
    assert!(
        redis.calls <= 25,
        "{} calls for 20,000 requests in 10 s",
        redis.calls
    );
}

#[tokio::test(start_paused = true)]
async fn what_a_dropped_reservations_call_took_goes_to_the_stock() {
    let client = Arc::new(Client::new(Instant::now()));
    let owing = Arc::new(Owing::default());
    let held = |reads| Held {
        client: client.clone(),
        ip: ip(1),
        owing: owing.clone(),
        reads,
    };
    drop(held(7));
    assert_eq!(client.refunded.load(Relaxed), 7);
    assert_eq!(*owing.list(), [ip(1)], "listed for the flusher");
    let mut claimed = held(4);
    assert_eq!(claimed.claim(), 4);
    drop(claimed);
    assert_eq!(client.refunded.load(Relaxed), 7, "claimed: not twice");
    assert_eq!(owing.list().len(), 1, "listed once");
}

/// The flusher's work is the owing clients, not every client kept: of
/// 100,000 idle clients and three owing ones, it looks at the three; the
/// one whose stock is stale gives its reads back, the fresh one and the
/// one with a call in flight stay listed for the next tick.
#[tokio::test(start_paused = true)]
async fn the_flusher_looks_only_at_owing_clients() {
    let rate = ten_a_second();
    let class = Class::new(rate);
    let origin = Instant::now();
    let at = Instant::now();
    for n in 0..100_000 {
        class.clients.insert(ip(n), Arc::new(Client::new(at)));
    }
    let client = |n| class.clients.get(&ip(n)).unwrap().clone();
    // 7: a refund of 3; 8: 5 in a fresh stock; 9: a refund, a call in flight.
    client(7).refunded.fetch_add(3, Relaxed);
    class.owing.add(ip(7), &client(7));
    {
        let eight = client(8);
        let mut stock = eight.stock.try_lock().unwrap();
        stock.left = 5;
        stock.until = at + HOLD;
    }
    class.owing.add(ip(8), &client(8));
    client(9).refunded.fetch_add(2, Relaxed);
    class.owing.add(ip(9), &client(9));
    class.owing.add(ip(7), &client(7)); // listed once
    let nine = client(9);
    let in_flight = nine.stock.try_lock().unwrap();
    let due = std::mem::take(&mut *class.owing.list());
    assert_eq!(due, [ip(7), ip(8), ip(9)]);
    let back = class.stale(Now::since(origin), &due);
    assert_eq!(back, [(ip(7), 3)]);
    assert_eq!(*class.owing.list(), [ip(8), ip(9)], "listed again");
    assert_eq!(client(7).refunded.load(Relaxed), 0);
    // A HOLD on, the call done: both go back.
    drop(in_flight);
    advance(HOLD).await;
    let due = std::mem::take(&mut *class.owing.list());
    let back = class.stale(Now::since(origin), &due);
    assert_eq!(back, [(ip(8), 5), (ip(9), 2)]);
    assert!(class.owing.list().is_empty());
    assert!(!client(8).owes.load(Relaxed), "unlisted");
}

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

/// A million distinct clients, 10,000 a second, each reserving 10 reads
/// once and giving 8 back: the entries kept stay bounded, and every read
/// given back is handed to Redis when its client is swept.
#[tokio::test(start_paused = true)]
async fn a_million_clients_are_swept_and_their_refunds_given_back() {
    let rate = Rate::new(3600, Duration::from_secs(3600), 0);
    let class = Class::new(rate);
    let origin = Instant::now();
    let now = || {
        let at = Instant::now();
        Now {
            at,
            ns: (at - origin).as_nanos() as u64,
        }
    };
    let (mut peak, mut given_back) = (0, 0u64);
    for n in 0..1_000_000u32 {
        let at = Instant::now();
        given_back += class.count(at).iter().map(|(_, r)| r).sum::<u64>();
        let entry = class
            .clients
            .entry(ip(n))
            .or_insert_with(|| Arc::new(Client::new(at)))
            .clone();
        {
            let mut stock = entry.stock.try_lock().expect("not contended");
            let plan = stock.plan(&rate, now(), 10, 0);
            assert_eq!(
                plan,
                Plan::Call {
                    take: 10,
                    ahead: 2,
                    back: 0
                }
            );
            stock.left += 10;
            let verdict = stock.granted(&rate, now(), Duration::from_secs(10), 10);
            assert!(reserved(verdict));
        }
        drop(entry);
        class
            .clients
            .get(&ip(n))
            .unwrap()
            .refunded
            .fetch_add(8, Relaxed);
        if n % 100 == 99 {
            advance(Duration::from_millis(10)).await;
        }
        peak = peak.max(class.clients.len());
    }
    // A client is idle two windows (500 ms) after its reservation: ~5,000
    // live at 10,000 a second; sweeps every max(4096, 2 × kept) hold at
    // most about 3 × live + 4096.
    assert!(peak < 25_000, "peak {peak} clients held for 1,000,000");
    advance(2 * WINDOW).await;
    for (_, reads) in class.sweep(Instant::now()) {
        given_back += reads;
    }
    assert_eq!(class.clients.len(), 0);
    assert_eq!(given_back, 8_000_000, "every refund given back");
    println!("1,000,000 distinct clients: peak {peak} held");
}

/// Reserving nothing (`fanoutQuota`) on a replica that never saw the
/// client shows it as the fleet has it, spent, not full; it asks Redis at
/// most once a `HOLD` for the client, not once per request.
#[tokio::test(start_paused = true)]
async fn reserving_nothing_shows_the_fleets_quota_with_a_call_a_second_at_most() {
    let rate = Rate::new(60, Duration::from_secs(60), 20);
    let mut redis = Redis::new(rate);
    let mut replica = Replica::new();
    // Another replica spent the whole burst.
    redis.full = rate.take(0, 0, 20).unwrap();
    let verdict = redis.reserve(&mut replica, 0);
    let Verdict::Reserved { remaining, full_in } = verdict else {
        panic!("nothing asked is never refused: {verdict:?}")
    };
    assert_eq!(remaining, 0, "the fleet has it spent");
    assert_eq!(full_in, Duration::from_secs(20));
    assert_eq!(redis.calls, 1);
    assert_eq!(redis.granted, 0, "a call that takes nothing");
    // Busy: from that answer for a second, no call.
    for _ in 0..100 {
        advance(Duration::from_millis(9)).await;
        assert!(matches!(
            redis.reserve(&mut replica, 0),
            Verdict::Reserved { remaining: 0, .. }
        ));
    }
    assert_eq!(redis.calls, 1, "one call a second at most");
    // Past it, asked again: what refilled meanwhile shows.
    advance(Duration::from_millis(200)).await;
    let verdict = redis.reserve(&mut replica, 0);
    assert!(
        matches!(verdict, Verdict::Reserved { remaining: 1, .. }),
        "{verdict:?}"
    );
    assert_eq!(redis.calls, 2);
}
