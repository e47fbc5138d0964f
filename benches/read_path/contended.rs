//! Two threads at once.

use crate::fixtures::{charge, current_thread, in_task, mem_engine, timed_reads, urls};
use crate::{CHUNK, CONTENDED};
use criterion::{black_box, Criterion};
use fanout_budget::{inbound::Caller, request::FanoutRequest, Engine, Read};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// Runs `work(thread, iters, barrier)` on two threads at once; the mean of
/// the time each timed (each thread does `iters` iterations).
pub(crate) fn two_threads<W>(iters: u64, work: W) -> Duration
where
    W: Fn(usize, u64, Arc<Barrier>) -> Duration + Sync,
{
    let barrier = Arc::new(Barrier::new(2));
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let (work, barrier) = (&work, barrier.clone());
                s.spawn(move || work(t, iters, barrier))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread"))
            .collect()
    });
    (times[0] + times[1]) / 2
}

/// Two threads reading through one engine: each through its own inbound
/// request (two HTTP requests at once), or both through the same one (two
/// operations of one batch on two threads).
pub(crate) fn engine_two_threads(
    rts: &[Runtime; 2],
    engine: &Engine,
    pools: &[Arc<Vec<reqwest::Url>>; 2],
    iters: u64,
    same_request: bool,
) -> Duration {
    let slot: Arc<Mutex<Option<FanoutRequest>>> = Arc::default();
    two_threads(iters, |t, iters, barrier| {
        let (engine, pool, slot) = (engine.clone(), pools[t].clone(), slot.clone());
        in_task(&rts[t], async move {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(CHUNK as u64) as usize;
                left -= n as u64;
                let request = if same_request {
                    if t == 0 {
                        *slot.lock().unwrap() = Some(engine.begin_request(Caller::Public));
                    }
                    barrier.wait();
                    slot.lock().unwrap().clone().expect("the shared request")
                } else {
                    engine.begin_request(Caller::Public)
                };
                let reads = pool[..n].iter().cloned().map(Read::get).collect();
                barrier.wait();
                total += timed_reads(&request, reads).await;
            }
            total
        })
    })
}

pub(crate) fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group(CONTENDED);
    let used = Arc::new(AtomicU64::new(0));
    g.bench_function("atomic_charge", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_, iters, barrier| {
                barrier.wait();
                let started = Instant::now();
                for _ in 0..iters {
                    black_box(charge(&used, u64::MAX));
                }
                started.elapsed()
            })
        })
    });

    let rts = [current_thread(), current_thread()];
    let sem = Arc::new(Semaphore::new(256));
    g.bench_function("semaphore_acquire_release", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, iters, barrier| {
                let sem = sem.clone();
                in_task(&rts[t], async move {
                    barrier.wait();
                    let started = Instant::now();
                    for _ in 0..iters {
                        drop(black_box(sem.acquire().await.expect("open")));
                    }
                    started.elapsed()
                })
            })
        })
    });

    let engine = mem_engine(true);
    let pools = [urls(0, CHUNK), urls(1, CHUNK)];
    g.bench_function("engine_miss_two_requests", |b| {
        b.iter_custom(|iters| engine_two_threads(&rts, &engine, &pools, iters, false))
    });
    g.bench_function("engine_miss_one_request", |b| {
        b.iter_custom(|iters| engine_two_threads(&rts, &engine, &pools, iters, true))
    });
    g.finish();
}
