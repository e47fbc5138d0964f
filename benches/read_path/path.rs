//! Floors, the transport alone and the engine, on one thread.

use crate::fixtures::{
    charge, engine_reads, in_task, mem_engine, mem_engine_in, mem_transport, urls, Dedup, YieldOnce,
};
use crate::support::{paired, Paired};
use crate::{CHUNK, HOST, LONG, ROUNDS};
use criterion::{black_box, BenchmarkGroup};
use fanout_budget::{inbound::Caller, read::Transport, Engine, Read};
use fanout_testkit::median;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

pub(crate) fn floors(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, rt: &Runtime) {
    let used = Arc::new(AtomicU64::new(0));
    g.bench_function("atomic_charge", |b| {
        b.iter(|| black_box(charge(&used, u64::MAX)))
    });

    let sem = Arc::new(Semaphore::new(256));
    g.bench_function("semaphore_acquire_release", |b| {
        b.iter_custom(|iters| {
            let sem = sem.clone();
            in_task(rt, async move {
                let started = Instant::now();
                for _ in 0..iters {
                    drop(black_box(sem.acquire().await.expect("open")));
                }
                started.elapsed()
            })
        })
    });

    let hosts: dashmap::DashMap<String, Arc<Semaphore>> = dashmap::DashMap::new();
    hosts.insert(HOST.into(), Arc::new(Semaphore::new(256)));
    g.bench_function("dashmap_semaphore_slot", |b| {
        b.iter(|| {
            let sem = hosts.get(black_box(HOST)).expect("a host").clone();
            black_box(sem.try_acquire_owned().expect("a slot"))
        })
    });

    g.bench_function("timeout_ready", |b| {
        b.iter_custom(|iters| {
            in_task(rt, async move {
                let started = Instant::now();
                for _ in 0..iters {
                    let _ = black_box(tokio::time::timeout(LONG, std::future::ready(())).await);
                }
                started.elapsed()
            })
        })
    });

    let mut yield_once = yield_routine(rt, false);
    g.bench_function("yield_once", |b| b.iter_custom(&mut yield_once));
    let mut armed = yield_routine(rt, true);
    g.bench_function("timeout_armed", |b| b.iter_custom(&mut armed));
}

/// `YieldOnce`, bare or inside `tokio::time::timeout` (the timer armed).
pub(crate) fn yield_routine(rt: &Runtime, timeout: bool) -> impl FnMut(u64) -> Duration + '_ {
    move |iters| {
        in_task(rt, async move {
            let started = Instant::now();
            for _ in 0..iters {
                if timeout {
                    let _ = black_box(tokio::time::timeout(LONG, YieldOnce(false)).await);
                } else {
                    YieldOnce(false).await;
                }
            }
            started.elapsed()
        })
    }
}

/// The in-memory transport called directly.
pub(crate) fn transport_routine(rt: &Runtime, yields: bool) -> impl FnMut(u64) -> Duration + '_ {
    let transport = mem_transport(yields);
    let read = Read::get(urls(0, 1)[0].clone());
    move |iters| {
        let (transport, read) = (transport.clone(), read.clone());
        in_task(rt, async move {
            let started = Instant::now();
            for _ in 0..iters {
                // A read is consumed, as on the engine path (which builds one per read).
                black_box(
                    transport
                        .fetch(read.clone(), HOST)
                        .await
                        .expect("a response"),
                );
            }
            started.elapsed()
        })
    }
}

/// Reads through `engine` (see `engine_reads`).
pub(crate) fn engine_routine(
    rt: &Runtime,
    engine: Engine,
    pool: Arc<Vec<reqwest::Url>>,
    mode: Dedup,
) -> impl FnMut(u64) -> Duration + '_ {
    move |iters| in_task(rt, engine_reads(engine.clone(), pool.clone(), iters, mode))
}

pub(crate) fn transports(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
) {
    for (id, yields) in [("transport_ready", false), ("transport_yield", true)] {
        let mut routine = transport_routine(rt, yields);
        g.bench_function(id, |b| b.iter_custom(&mut routine));
    }
}

pub(crate) fn engine_uncontended(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
) {
    let pool = urls(0, CHUNK);
    let cases = [
        ("engine_miss_ready", false, Dedup::Miss),
        ("engine_miss", true, Dedup::Miss),
        ("engine_hit", true, Dedup::Hit),
    ];
    for (id, yields, mode) in cases {
        let mut routine = engine_routine(rt, mem_engine(yields), pool.clone(), mode);
        g.bench_function(id, |b| b.iter_custom(&mut routine));
    }
    let engine = mem_engine(true);
    g.bench_function("begin_request", |b| {
        b.iter(|| black_box(engine.begin_request(Caller::Public).operation()))
    });
    cache_hit(g, rt);
}

/// A hit in the engine's cache of immutable answers (`Read::immutable`,
/// warmed), one request open for the run, against its floor: a bare moka
/// lookup of a key built beforehand (`moka_get`: one key, looked up again
/// and again; `moka_get_prebuilt`: a thousand keys at a time, each looked
/// up once, as the engine's reads are). `engine_cache_hit` times the engine
/// only (each `Read` built beforehand, outside the clock, a thousand at a
/// time); `engine_cache_hit_built` also builds each
/// `Read` (its URL copied, its extras boxed: the caller's share). The
/// honest floor beside the bare one: `moka_get_configured` (and
/// `_prebuilt`), a moka cache built as the engine's is — a key of its
/// key's fields, seeded foldhash, a weigher, an expiry per entry.
///
/// `engine_cache_hit_10k` and `moka_get_configured_10k`: the same, with
/// [`POPULATED`] other entries kept beside the one hit (a probe then meets
/// other keys in moka's table, where the stored hash is compared first).
fn cache_hit(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, rt: &Runtime) {
    for (id, prebuilt, populated) in [
        ("engine_cache_hit", true, 0),
        ("engine_cache_hit_built", false, 0),
        ("engine_cache_hit_10k", true, POPULATED),
    ] {
        let engine = mem_engine(false);
        populate(rt, &engine, populated);
        let url = urls(0, 1)[0].clone();
        let mut hits = move |iters: u64| {
            let (engine, url) = (engine.clone(), url.clone());
            in_task(rt, async move {
                let request = engine.begin_request(Caller::Public);
                let op = request.operation();
                let upstream = op.upstream();
                let read = || Read::get(url.clone()).immutable();
                black_box(upstream.read(read()).await.expect("warm"));
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(1000);
                    left -= n;
                    if prebuilt {
                        let reads: Vec<Read> = (0..n).map(|_| read()).collect();
                        let started = Instant::now();
                        for read in reads {
                            black_box(upstream.read(read).await.expect("a hit"));
                        }
                        elapsed += started.elapsed();
                    } else {
                        let started = Instant::now();
                        for _ in 0..n {
                            black_box(upstream.read(read()).await.expect("a hit"));
                        }
                        elapsed += started.elapsed();
                    }
                }
                elapsed
            })
        };
        g.bench_function(id, |b| b.iter_custom(&mut hits));
    }
    let floor: moka::sync::Cache<String, Arc<Vec<u8>>> = moka::sync::Cache::new(1024);
    let key = urls(0, 1)[0].to_string();
    floor.insert(key.clone(), Arc::new(vec![0; 64]));
    g.bench_function("moka_get", |b| {
        b.iter(|| black_box(floor.get(black_box(&key)).expect("kept")))
    });
    // As the engine's reads are: each key built beforehand, a thousand at a
    // time, looked up once and dropped on the clock (a key not in the CPU's
    // cache, as a read's URL built elsewhere is not).
    g.bench_function("moka_get_prebuilt", |b| {
        b.iter_custom(prebuilt_gets(|| key.clone(), |key| floor.get(&key)))
    });
    // Configured as the engine's cache is (`src/read/cache.rs`): a key of
    // the engine's key's fields, hashed by seeded foldhash, a weigher, an
    // expiry per entry (a `get` reads the clock); one entry, as the engine's
    // cache holds in `engine_cache_hit`.
    let configured = configured_floor(&key, 0);
    let populated = configured_floor(&key, POPULATED);
    let key = EngineKey::of(&key);
    g.bench_function("moka_get_configured", |b| {
        b.iter(|| black_box(configured.get(black_box(&key)).expect("kept")))
    });
    g.bench_function("moka_get_configured_prebuilt", |b| {
        b.iter_custom(prebuilt_gets(|| key.clone(), |key| configured.get(&key)))
    });
    g.bench_function("moka_get_configured_10k", |b| {
        b.iter(|| black_box(populated.get(black_box(&key)).expect("kept")))
    });
}

/// The other entries the populated cache-hit benches keep.
const POPULATED: usize = 10_000;

/// Keeps `n` answers in `engine`'s cache (URLs of their own, not the one
/// hit), a few hundred reads per request (its budget holds a thousand).
fn populate(rt: &Runtime, engine: &Engine, n: usize) {
    if n == 0 {
        return;
    }
    let (engine, urls) = (engine.clone(), urls(1, n));
    in_task(rt, async move {
        for chunk in urls.chunks(500) {
            let request = engine.begin_request(Caller::Public);
            let op = request.operation();
            let upstream = op.upstream();
            for url in chunk {
                let read = Read::get(url.clone()).immutable();
                black_box(upstream.read(read).await.expect("kept"));
            }
        }
        Duration::ZERO
    });
}

/// Lookups of keys built beforehand, a thousand at a time, each looked up
/// once and dropped on the clock.
fn prebuilt_gets<K, V>(
    build: impl Fn() -> K,
    get: impl Fn(K) -> Option<V>,
) -> impl FnMut(u64) -> Duration {
    move |iters| {
        let mut elapsed = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let n = left.min(1000);
            left -= n;
            let keys: Vec<K> = (0..n).map(|_| build()).collect();
            let started = Instant::now();
            for key in keys {
                black_box(get(key).expect("kept"));
            }
            elapsed += started.elapsed();
        }
        elapsed
    }
}

/// The engine's cache key's fields (`ReadKey`, private to the engine),
/// hashed as a plain key is, compared with the engine's care: an empty body
/// is not handed to `memcmp` (glibc's AVX-512 `memcmp` loads an empty
/// `Bytes`' dangling pointer under an empty mask, a microcode assist; the
/// derived `PartialEq` costs ~100 ns a lookup more).
#[derive(Clone, Eq)]
struct EngineKey {
    method: http::Method,
    url: Box<str>,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    body: bytes::Bytes,
    key: Option<Box<str>>,
    credential: Option<Arc<str>>,
    shared: bool,
}

impl PartialEq for EngineKey {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &[u8], b: &[u8]| a.len() == b.len() && (a.is_empty() || a == b);
        same(self.url.as_bytes(), other.url.as_bytes())
            && self.method == other.method
            && self.shared == other.shared
            && self.key == other.key
            && self.credential == other.credential
            && self.headers == other.headers
            && same(&self.body, &other.body)
    }
}

impl std::hash::Hash for EngineKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (&self.method, &self.url, &self.headers, &self.body).hash(state);
        (&self.key, &self.credential, self.shared).hash(state);
    }
}

impl EngineKey {
    fn of(url: &str) -> Self {
        Self {
            method: http::Method::GET,
            url: url.into(),
            headers: Vec::new(),
            body: bytes::Bytes::new(),
            key: None,
            credential: None,
            shared: false,
        }
    }
}

/// An entry as the engine's: an answer and how long it lives.
struct EngineEntry {
    answer: Arc<Vec<u8>>,
    ttl: Option<Duration>,
}

struct PerEntry;

impl moka::Expiry<EngineKey, Arc<EngineEntry>> for PerEntry {
    fn expire_after_create(
        &self,
        _: &EngineKey,
        entry: &Arc<EngineEntry>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        entry.ttl
    }
}

type Configured =
    moka::sync::Cache<EngineKey, Arc<EngineEntry>, foldhash::fast::SeedableRandomState>;

/// A moka cache built as the engine builds its own, holding `url` and
/// `others` entries more.
fn configured_floor(url: &str, others: usize) -> Configured {
    let cache: Configured = moka::sync::Cache::builder()
        .max_capacity(32 << 20)
        .weigher(|key: &EngineKey, entry: &Arc<EngineEntry>| {
            (key.url.len() + entry.answer.len() + 1024) as u32
        })
        .expire_after(PerEntry)
        .build_with_hasher(foldhash::fast::SeedableRandomState::random());
    let entry = EngineEntry {
        answer: Arc::new(vec![0; 64]),
        ttl: None,
    };
    let entry = Arc::new(entry);
    cache.insert(EngineKey::of(url), entry.clone());
    for other in urls(1, others).iter() {
        cache.insert(EngineKey::of(other.as_str()), entry.clone());
    }
    cache.run_pending_tasks();
    assert_eq!(cache.entry_count() as usize, others + 1);
    cache
}

/// The floors as one routine around the in-memory transport (pending
/// once), as a read must at least do them: the hand-rolled budget's charge,
/// a `DashMap` lookup and a semaphore slot (the host cap), `timeout` armed
/// around the send. Less the transport alone: the floors beside the engine
/// path, in the same run.
pub(crate) fn floors_routine(rt: &Runtime) -> impl FnMut(u64) -> Duration + '_ {
    let transport = mem_transport(true);
    let read = Read::get(urls(0, 1)[0].clone());
    let used = Arc::new(AtomicU64::new(0));
    let hosts: Arc<dashmap::DashMap<String, Arc<Semaphore>>> = Arc::default();
    hosts.insert(HOST.into(), Arc::new(Semaphore::new(256)));
    move |iters| {
        let (transport, read) = (transport.clone(), read.clone());
        let (used, hosts) = (used.clone(), hosts.clone());
        in_task(rt, async move {
            let started = Instant::now();
            for _ in 0..iters {
                black_box(charge(&used, u64::MAX));
                let host = hosts.get(black_box(HOST)).expect("a host").clone();
                let slot = host.try_acquire_owned().expect("a slot");
                let sent = tokio::time::timeout(LONG, transport.fetch(read.clone(), HOST)).await;
                black_box(sent.expect("in time").expect("a response"));
                drop(slot);
            }
            started.elapsed()
        })
    }
}

/// The engine path and its floors measured in one run, turn about: the
/// engine read (miss, pends once), the floors' routine and the transport
/// alone, their order turning each round (every order of the three in
/// turn), so that the load the machine carries meanwhile hits all alike.
pub(crate) struct AgainstFloors {
    /// Median ns per read of the engine, of the floors' routine, of the
    /// transport alone.
    pub(crate) engine_ns: f64,
    pub(crate) floors_total_ns: f64,
    pub(crate) transport_ns: f64,
    /// Median over the rounds of engine − transport: the engine path.
    pub(crate) path_ns: f64,
    /// Median over the rounds of floors − transport: the floors.
    pub(crate) floors_ns: f64,
    /// Median over the rounds of (engine − transport) / (floors − transport).
    pub(crate) ratio: f64,
    /// The lowest and highest per-round ratio.
    pub(crate) ratio_min: f64,
    pub(crate) ratio_max: f64,
    pub(crate) rounds: usize,
}

/// The six orders of three routines, one a round in turn.
const ORDERS: [[usize; 3]; 6] = [
    [0, 1, 2],
    [1, 2, 0],
    [2, 0, 1],
    [2, 1, 0],
    [1, 0, 2],
    [0, 2, 1],
];

/// The engine path against its floors (see [`AgainstFloors`]), `iters`
/// reads a turn, `rounds` rounds.
pub(crate) fn against_floors(rt: &Runtime, rounds: usize, iters: u64) -> AgainstFloors {
    let mut engine = engine_routine(rt, mem_engine(true), urls(0, CHUNK), Dedup::Miss);
    let mut floors = floors_routine(rt);
    let mut transport = transport_routine(rt, true);
    let per = |d: Duration| d.as_secs_f64() * 1e9 / iters as f64;
    // One turn each first, unrecorded: warm caches, pools and maps.
    let mut times = [0.0; 3];
    let mut turn = |which: usize, times: &mut [f64; 3]| {
        times[which] = per(match which {
            0 => engine(iters),
            1 => floors(iters),
            _ => transport(iters),
        })
    };
    for which in 0..3 {
        turn(which, &mut times);
    }
    let mut seen: [Vec<f64>; 6] = Default::default();
    for round in 0..rounds {
        for which in ORDERS[round % ORDERS.len()] {
            turn(which, &mut times);
        }
        let [e, f, t] = times;
        for (list, value) in seen
            .iter_mut()
            .zip([e, f, t, e - t, f - t, (e - t) / (f - t)])
        {
            list.push(value);
        }
    }
    let ratios = seen[5].clone();
    let [mut e, mut f, mut t, mut path, mut floor, mut ratio] = seen;
    AgainstFloors {
        engine_ns: median(&mut e),
        floors_total_ns: median(&mut f),
        transport_ns: median(&mut t),
        path_ns: median(&mut path),
        floors_ns: median(&mut floor),
        ratio: median(&mut ratio),
        ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratio_max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        rounds,
    }
}

pub(crate) fn paired_read_path(rt: &Runtime) -> (Paired, Paired, Paired) {
    let path = paired(
        ROUNDS,
        20_000,
        engine_routine(rt, mem_engine(true), urls(0, CHUNK), Dedup::Miss),
        transport_routine(rt, true),
    );
    use fanout_budget::config::LimitMode;
    let measure = paired(
        ROUNDS,
        20_000,
        engine_routine(
            rt,
            mem_engine_in(true, LimitMode::Measure),
            urls(0, CHUNK),
            Dedup::Miss,
        ),
        engine_routine(
            rt,
            mem_engine_in(true, LimitMode::Enforce),
            urls(0, CHUNK),
            Dedup::Miss,
        ),
    );
    let timer = paired(
        ROUNDS,
        100_000,
        yield_routine(rt, true),
        yield_routine(rt, false),
    );
    (path, timer, measure)
}
