//! The upstreams' quota gates shared on Redis ([`QuotaBoard`]): when an
//! upstream tells one replica its quota is spent, every replica stops
//! sending to it until the time it gave.
//!
//! One hash per deployment, `<prefix>:quota`, one field per closed host:
//! when its gate opens, on Redis's clock (so the replicas' clocks do not
//! matter). A replica that hears a closing publishes it at once
//! (`lua/quota_close.lua`, one call); every replica reads the hash every
//! `5 × refresh_ms` (250 ms by default: `lua/quota_read.lua`, one call,
//! which also drops the opened gates) in a task of its own, and closes its
//! own gates for what is left of each. The read path never waits on Redis:
//! a replica that has not read the board yet sends at most what its
//! upstream answers in one interval before it knows; while Redis is down
//! each replica keeps its own gates (`failure_mode` does not apply: a
//! closing is advice, not a limit).

use super::backend::{RedisBackend, Route};
use super::lua::Lua;
use crate::read::{Learn, QuotaBoard};
use redis::{FromRedisValue, RedisResult, Value};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

static CLOSE: OnceLock<Lua> = OnceLock::new();
static READ: OnceLock<Lua> = OnceLock::new();

/// The quota gates of a deployment's replicas, on Redis.
pub struct RedisQuotaBoard {
    backend: RedisBackend,
    /// Who is told what the board says; `None` until the engine subscribes.
    learn: Mutex<Option<Learn>>,
    /// The reading task, started once.
    reading: OnceLock<()>,
}

impl std::fmt::Debug for RedisQuotaBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQuotaBoard")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// `lua/quota_read.lua`'s reply: each closed host and the ms it stays closed.
struct Closed(Vec<(String, u64)>);

impl FromRedisValue for Closed {
    fn from_redis_value(v: &Value) -> RedisResult<Self> {
        let flat: Vec<Value> = redis::from_redis_value(v)?;
        let mut closed = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            let [host, left] = pair else {
                return Err(super::lua::unexpected("QUOTA_READ", v));
            };
            closed.push((
                redis::from_redis_value(host)?,
                redis::from_redis_value(left)?,
            ));
        }
        Ok(Self(closed))
    }
}

impl RedisQuotaBoard {
    /// The board on `backend`.
    pub fn new(backend: RedisBackend) -> Self {
        Self {
            backend,
            learn: Mutex::new(None),
            reading: OnceLock::new(),
        }
    }

    fn key(&self) -> String {
        self.backend.key("quota", "hosts")
    }

    /// Starts the reading task, once, if a runtime is here.
    fn start_reading(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.reading.get_or_init(|| {
            let board = Arc::downgrade(self);
            let every = (self.backend.refresh() * 5).max(Duration::from_millis(50));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(board) = board.upgrade() else { return };
                    board.read_once().await;
                }
            });
        });
    }

    /// Reads the board once and tells what it says.
    async fn read_once(&self) {
        let script = READ.get_or_init(|| Lua::new(include_str!("lua/quota_read.lua")));
        let deadline = self.backend.local_deadline();
        let key = self.key();
        let closed: Result<Closed, _> = (self.backend)
            .script(Route::Call, deadline, script, &key, None, &[])
            .await;
        let Ok(Closed(closed)) = closed else { return };
        let learn = self.learn.lock().expect("not poisoned").clone();
        if let Some(learn) = learn {
            for (host, left_ms) in closed {
                learn(&host, Duration::from_millis(left_ms));
            }
        }
    }
}

/// The board as the engine takes it ([`EngineBuilder::quota_board`](crate::EngineBuilder::quota_board)).
#[derive(Debug, Clone)]
pub struct SharedQuotaBoard(pub(super) Arc<RedisQuotaBoard>);

impl QuotaBoard for SharedQuotaBoard {
    fn publish(&self, host: &str, closed_for: Duration) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.0.start_reading();
        let board = self.0.clone();
        let host = host.to_string();
        tokio::spawn(async move {
            let script = CLOSE.get_or_init(|| Lua::new(include_str!("lua/quota_close.lua")));
            let deadline = board.backend.local_deadline();
            let key = board.key();
            let ms = closed_for.as_millis().min(i64::MAX as u128) as i64;
            let _: Result<i64, _> = (board.backend)
                .script(Route::Call, deadline, script, &key, Some(&host), &[ms])
                .await;
        });
    }

    fn subscribe(&self, learn: Learn) {
        *self.0.learn.lock().expect("not poisoned") = Some(learn);
        self.0.start_reading();
    }
}
