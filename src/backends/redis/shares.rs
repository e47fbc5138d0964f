//! Per-host caps held by the whole fleet, without a round trip per read.
//!
//! Each replica holds a share of every capped host's slots on Redis and hands
//! it to its reads locally:
//!
//! - **On Redis**, a host is one hash (`<prefix>:shares:<HOST:PORT>`; not
//!   `host:`, the per-read leases' sorted sets before, so replicas of both
//!   versions on one Redis during a rolling upgrade do not fail each
//!   other's calls with `WRONGTYPE`) with one field per replica:
//!   `"<has> <wants> <expires> <since>"` — the slots it holds, its demand
//!   (reads in flight and waiting) when it last reported, when the field
//!   lapses (`lease_ms` after that report; a crashed replica's slots free up
//!   then), and since when its demand has not been met (0: it has been). One script, `CLAIM`, is the only writer: a
//!   replica reports what it has in use and what it wants, and Redis answers
//!   what it may hold, never letting the fields' sum pass the cap.
//! - **Allocation.** While every replica's demand fits under the cap, a
//!   claim gets its demand plus spare slots: at most `lease_block`, and at
//!   most half the room still free, so a newcomer always finds some. When
//!   the demands do not fit (or another replica is short), the claim is
//!   *busy*: it gets its fair share of the cap (water-filling over the
//!   demands: nobody gets more than they want, the rest is split evenly,
//!   rounded down, and the slots left over go one each to the replicas
//!   short the longest — so an odd slot, or a cap smaller than the replicas
//!   wanting it, turns round instead of staying with its holder) and no
//!   spare. A replica is never told to hold less than it has in use; it just
//!   takes no new slot until its reads have come down under its share.
//! - **Locally**, a [`Pool`] per host counts the slots allowed and in use.
//!   A read takes one while fewer are in use than allowed — no network.
//!   Otherwise it asks the pool's claimer (one task per host, so one claim at
//!   a time and a cancelled read never loses a reply) and waits for the
//!   claim, a slot coming back, or its own wait running out
//!   (`HOST_SATURATED`). A read that stops waiting — it joined an identical
//!   read another request sent (`coalesce = true`), or its request was
//!   cancelled — drops its wait: it leaves the pool's waiters and the local
//!   cap's queue, and the local slot it held while waiting goes back.
//! - **Refresh.** While a replica holds or wants anything of a host, its
//!   claimer claims every `refresh_ms`: that renews the field, reports the
//!   demand, and gives back what is no longer used (all spare after a period
//!   without a new read; everything above the fair share when busy). While
//!   busy, a slot that comes back is reported at once, so the replicas
//!   waiting see it.
//! - **Safety.** While a claim is in flight, the pool hands out no slot
//!   beyond those in use when it was sent (the claim may shrink the
//!   allowance to that), so Redis never holds less for a replica than it
//!   has in flight. A claim is timed (`timed_script`): one that Redis runs
//!   after its deadline does nothing. A claim with no answer leaves the
//!   allowance at what was in use and invalid: slots are handed out again
//!   only after a claim that succeeds — also after any other failed call of
//!   the backend (a restarted Redis may have lost the hash) — and while the
//!   breaker is open, `failure_mode` applies. An allowance is used only
//!   within `2/3 lease_ms` of sending the claim that granted it, so Redis
//!   still holds it then. Data lost on Redis with no failed call (a restart
//!   between two calls, `FLUSHALL`, eviction) is noticed only at the next
//!   claim, at most `refresh_ms` later; until then the cap may be exceeded
//!   by the slots in use and taken here (README).

use super::{down, Lua, RedisBackend};
use crate::config::{FailureMode, HostConfig};
use crate::error::{HostRefusal, Unavailable};
use crate::read::hosts::{HostLimiter, HostSlot, LocalHostCaps};
use futures::future::BoxFuture;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// KEYS[1] the host's hash; ARGV: holder, floor (what the holder may have
/// in use until the answer arrives), wants, cap, block, lease (ms), deadline
/// (µs on Redis's clock; 0: none). Returns {allowed, busy (1 when some
/// demand is not met), Redis time (µs)}, or {-1, 0, time} past the deadline,
/// nothing done. Records the holder's field as {max(allowed, floor), wants,
/// expiry (ms), since when it is short (µs; 0: not)} (none when the first
/// two are 0).
/// Running it twice answers the same.
pub(super) const CLAIM: &str = r#"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[7])
if deadline > 0 and now_us > deadline then
  return {-1, 0, now_us}
end
local now = math.floor(now_us / 1000)
local holder = ARGV[1]
local floor, wants = tonumber(ARGV[2]), tonumber(ARGV[3])
local cap, block, lease = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local fields = redis.call('HGETALL', KEYS[1])
-- Since when this holder has been short (its demand not met), if it was at
-- its last claim (µs: claims one after another get distinct times); one
-- that was not ranks after every one that was.
local since = now_us + 1
local others_has, short = 0, 0
local claimants = {}
for i = 1, #fields, 2 do
  local h, v = fields[i], fields[i + 1]
  local has, want, expires, was = string.match(v, '^(%d+) (%d+) (%d+) ?(%d*)$')
  was = tonumber(was) or 0
  if not has or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], h)
  elseif h == holder then
    if was > 0 then since = was end
  else
    has, want = tonumber(has), tonumber(want)
    others_has = others_has + has
    if want > has then short = short + want - has end
    if was == 0 then was = now_us + 1 end
    claimants[#claimants + 1] = {want, was, h}
  end
end
claimants[#claimants + 1] = {wants, since, holder}
local total = 0
for _, c in ipairs(claimants) do total = total + c[1] end
local free = cap - others_has
local allowed, busy
-- Given an odd slot (above `level`): to the back of the queue for the next.
local odd, level = false, nil
if short == 0 and total <= cap and wants <= free then
  busy = 0
  allowed = wants + math.min(block, math.floor(math.max(free - wants, 0) / 2))
else
  -- Water-filling: demands below an even split of what is left are met;
  -- the others get the split rounded down, and the slots left over go one
  -- each to those short the longest (so an odd slot turns round, and a
  -- cap smaller than the claimants still serves them in turn).
  busy = 1
  allowed = wants
  table.sort(claimants, function(a, b) return a[1] < b[1] end)
  local left = cap
  for i, c in ipairs(claimants) do
    local n = #claimants - i + 1
    if c[1] * n > left then
      level = math.floor(left / n)
      if wants > level then
        local ahead = 0
        for j = i, #claimants do
          local o = claimants[j]
          if o[3] ~= holder and (o[2] < since or (o[2] == since and o[3] < holder)) then
            ahead = ahead + 1
          end
        end
        odd = ahead < left - level * n
        allowed = level + (odd and 1 or 0)
      end
      break
    end
    left = left - c[1]
  end
end
allowed = math.max(0, math.min(allowed, free))
odd = odd and allowed > level
local has = math.max(allowed, floor)
if has == 0 and wants == 0 then
  redis.call('HDEL', KEYS[1], holder)
else
  local was = 0
  if allowed < wants then was = odd and now_us or math.min(since, now_us) end
  -- %d: µs have 16 digits, past what `..` prints without an exponent.
  local field = string.format('%d %d %d %d', has, wants, now + lease, was)
  redis.call('HSET', KEYS[1], holder, field)
  redis.call('PEXPIRE', KEYS[1], lease * 2)
end
return {allowed, busy, now_us}
"#;

/// The pause between claims that leave reads waiting: from this, doubling.
const FIRST_PAUSE: Duration = Duration::from_millis(2);
const LAST_PAUSE: Duration = Duration::from_millis(20);

/// Per-host caps held by the whole fleet: a local slot, then a slot of this
/// replica's share on Redis.
#[derive(Debug)]
pub struct RedisHostCaps {
    local: LocalHostCaps,
    backend: RedisBackend,
    /// One per `[hosts]` table.
    pools: HashMap<String, Arc<Pool>>,
}

impl RedisHostCaps {
    /// Caps for the `[hosts]` tables, shared on `backend`.
    pub fn new(hosts: BTreeMap<String, HostConfig>, backend: RedisBackend) -> Self {
        // Unique per replica and restart: no clock involved.
        let nonce =
            std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id());
        let holder = format!("{}-{nonce:x}", std::process::id());
        let script = Arc::new(Lua::new(CLAIM));
        let pools = hosts
            .iter()
            .map(|(host, config)| {
                let pool = Pool {
                    host: host.clone(),
                    backend: backend.clone(),
                    script: script.clone(),
                    key: backend.key("shares", host),
                    holder: holder.clone(),
                    cap: config.max_concurrent,
                    wait: config.acquire_wait(),
                    state: Mutex::default(),
                    wanted: Notify::new(),
                    freed: Notify::new(),
                    outcomes: watch::Sender::new(Ok(())),
                    claimer: OnceLock::new(),
                };
                (host.clone(), Arc::new(pool))
            })
            .collect();
        Self {
            local: LocalHostCaps::new(hosts),
            backend,
            pools,
        }
    }

    /// Slots this replica holds of `host`'s cap on Redis, and of those, in
    /// use by its reads (for tests and docs).
    pub fn held(&self, host: &str) -> (u32, u32) {
        self.pools.get(host).map_or((0, 0), |pool| {
            let state = pool.lock();
            (state.allowed, state.in_use)
        })
    }
}

impl Drop for RedisHostCaps {
    fn drop(&mut self) {
        for pool in self.pools.values() {
            if let Some(claimer) = pool.claimer.get() {
                claimer.abort();
                // What it held frees now rather than after `lease_ms`.
                self.backend
                    .forget("HDEL", pool.key.clone(), pool.holder.clone());
            }
        }
    }
}

/// One host's share held by this replica.
#[derive(Debug, Default)]
struct State {
    /// Slots this replica may have in use, while `valid_until` (Redis holds
    /// at least as many for it, and at least those in use).
    allowed: u32,
    in_use: u32,
    /// Reads waiting for a slot.
    waiting: u32,
    /// While a claim is in flight: the floor it reported, the most that may
    /// be in use until it is answered.
    in_flight: Option<u32>,
    /// Until when `allowed` may be handed out, and the backend's failure
    /// count then (any failed call since voids it).
    valid_until: Option<(Instant, u64)>,
    /// The last claim found demand not met.
    busy: bool,
    /// Redis may hold a field for this replica: refresh it.
    recorded: bool,
    /// A slot was taken since the last claim.
    used: bool,
    /// The most slots in use and waited for at once since the last claim:
    /// the demand it reports.
    peak: u32,
    /// A slot came back while busy that this replica may not reuse.
    give_back: bool,
}

#[derive(Debug)]
struct Pool {
    host: String,
    backend: RedisBackend,
    script: Arc<Lua>,
    key: String,
    holder: String,
    cap: u32,
    /// `acquire_wait_ms`.
    wait: Duration,
    state: Mutex<State>,
    /// A read needs a claim.
    wanted: Notify,
    /// A slot came back.
    freed: Notify,
    /// Each claim's outcome.
    outcomes: watch::Sender<Result<(), Unavailable>>,
    claimer: OnceLock<tokio::task::AbortHandle>,
}

/// A slot of a pool: back to it when dropped.
struct Slot(Arc<Pool>);

impl Drop for Slot {
    fn drop(&mut self) {
        let give_back = {
            let mut state = self.0.lock();
            state.in_use -= 1;
            // Others are short and this slot is above the share: report it
            // now, not at the next refresh.
            state.give_back |= state.busy && state.in_use >= state.allowed;
            state.give_back
        };
        self.0.freed.notify_waiters();
        if give_back {
            self.0.wanted.notify_one();
        }
    }
}

/// A read waiting on a pool, counted in its demand.
struct Waiting<'a>(&'a Pool);

impl<'a> Waiting<'a> {
    fn new(pool: &'a Pool) -> Self {
        let mut state = pool.lock();
        state.waiting += 1;
        state.peak = state.peak.max(state.in_use + state.waiting);
        drop(state);
        Self(pool)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().waiting -= 1;
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot of the allowance, if one is free and valid: no network.
    fn take(self: &Arc<Self>) -> Option<Slot> {
        let mut state = self.lock();
        if !self.room(&state) {
            return None;
        }
        state.in_use += 1;
        state.used = true;
        state.peak = state.peak.max(state.in_use + state.waiting);
        Some(Slot(self.clone()))
    }

    /// Whether a read may take a slot now: the allowance is valid and not
    /// all in use (nor, while a claim is in flight, its floor).
    fn room(&self, state: &State) -> bool {
        let limit = state
            .in_flight
            .map_or(state.allowed, |n| n.min(state.allowed));
        let valid = state.valid_until.is_some_and(|(until, failures)| {
            Instant::now() < until && failures == self.backend.failed_calls()
        });
        valid && state.in_use < limit
    }

    /// Whether a claim is needed now: a read waits with no room, or a slot
    /// came back that others need and this replica may not reuse.
    fn needs_claim(&self) -> bool {
        let state = self.lock();
        state.give_back || state.waiting > 0 && !self.room(&state)
    }

    /// A slot within `give_up` (the host's wait) — or, while the cap is not
    /// known to be full, the claim asked for in time answered (a slow Redis:
    /// at most `timeout_ms` more, never past `last`): `Ok(None)` when none
    /// came free in time, `Err` when Redis could not be asked.
    async fn slot(
        self: &Arc<Self>,
        give_up: Instant,
        last: Instant,
    ) -> Result<Option<Slot>, Unavailable> {
        if let Some(slot) = self.take() {
            return Ok(Some(slot));
        }
        self.claimer.get_or_init(|| {
            let refresh = self.backend.inner.refresh;
            tokio::spawn(claims(self.clone(), refresh)).abort_handle()
        });
        let mut outcomes = self.outcomes.subscribe();
        let _waiting = Waiting::new(self);
        let (mut until, mut extended) = (give_up, false);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.take() {
                return Ok(Some(slot));
            }
            if self.backend.is_open() {
                return Err(down("skipped after a failed call (backoff)"));
            }
            self.wanted.notify_one();
            tokio::select! {
                changed = outcomes.changed() => {
                    changed.map_err(|_| down("the claimer stopped"))?;
                    outcomes.borrow_and_update().clone()?;
                }
                () = &mut freed => {}
                () = tokio::time::sleep_until(until) => {
                    if extended || self.lock().busy {
                        return Ok(None);
                    }
                    (until, extended) = ((give_up + self.backend.inner.timeout).min(last), true);
                }
            }
        }
    }

    /// One claim: reports what is in use and wanted, applies the answer.
    async fn claim(&self) -> Result<(), Unavailable> {
        let backend = &self.backend;
        let (floor, wants, block) = {
            let mut state = self.lock();
            let wants = state.peak.max(state.in_use + state.waiting);
            let idle = !state.used && state.in_use == 0 && state.waiting == 0;
            let block = if idle { 0 } else { backend.inner.block };
            // Holding on to what is allowed, reads go on during the claim.
            // Giving back (idle, others short, or far more than the demand
            // and a block), only what is in use may be until the answer.
            let shrink =
                idle || state.busy || state.allowed > wants.saturating_add(block.saturating_mul(2));
            // Reads taken during the last claim may be more than its answer
            // allowed (the claim kept the allowance before it): Redis holds
            // them, so the floor does too, or the claim would give them away.
            let floor = if shrink {
                state.in_use
            } else {
                state.allowed.max(state.in_use)
            };
            state.in_flight = Some(floor);
            state.peak = 0;
            state.used = false;
            state.give_back = false;
            (floor, wants, block)
        };
        let (sent, failures) = (Instant::now(), backend.failed_calls());
        let lease_ms = backend.inner.lease.as_millis() as i64;
        let args = [
            i64::from(floor),
            i64::from(wants),
            i64::from(self.cap),
            i64::from(block),
            lease_ms,
        ];
        let reply = backend
            .timed_script::<(i64, i64, i64)>(&self.script, &self.key, Some(&self.holder), &args)
            .await;
        let mut state = self.lock();
        state.in_flight = None;
        let granted = match reply {
            Ok((allowed, busy, _)) if allowed >= 0 => Ok((allowed as u32, busy == 1)),
            Ok(_) => Err(down("the claim ran after its deadline")),
            Err(failure) => Err(failure.error),
        };
        match granted {
            Ok((allowed, busy)) => {
                // Redis holds max(allowed, floor) for this replica, the
                // floor for reads in flight; new ones only within `allowed`.
                state.allowed = allowed;
                state.valid_until = Some((sent + backend.inner.lease * 2 / 3, failures));
                state.busy = busy;
                state.recorded = allowed > 0 || floor > 0 || wants > 0;
                // Others turned out short while this claim kept the old
                // allowance as its floor: give back what Redis holds beyond
                // the share and the reads in flight now, not a refresh later.
                if busy && floor > allowed.max(state.in_use) {
                    state.give_back = true;
                    self.wanted.notify_one();
                }
                Ok(())
            }
            Err(error) => {
                // Redis holds at least the floor, or nothing changed.
                state.allowed = state.allowed.min(floor);
                state.valid_until = None;
                state.recorded = true;
                Err(error)
            }
        }
    }
}

/// A pool's claimer: a claim when one is needed (paced while claims leave
/// reads waiting), and `refresh` after the last while Redis may hold
/// anything.
async fn claims(pool: Arc<Pool>, refresh: Duration) {
    // Registered on the first read, so after the application's recorder.
    let (share, busy) = crate::metrics::host_share(&pool.host);
    let mut pause = FIRST_PAUSE;
    let mut next_refresh = Instant::now() + refresh;
    loop {
        let recorded = pool.lock().recorded;
        tokio::select! {
            // A read asked, or a slot came back; asked during the last claim,
            // there may be room by now.
            () = pool.wanted.notified() => if !pool.needs_claim() {
                continue;
            },
            () = tokio::time::sleep_until(next_refresh), if recorded => {}
        }
        next_refresh = Instant::now() + refresh;
        let outcome = pool.claim().await;
        // Redis had no more room for reads still waiting: claiming again at
        // once would only ask again.
        let short = {
            let state = pool.lock();
            share.set(f64::from(state.allowed));
            busy.set(if state.busy { 1.0 } else { 0.0 });
            state.busy && state.waiting > 0 && state.in_use >= state.allowed
        };
        let _previous = pool.outcomes.send_replace(outcome);
        if short {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LAST_PAUSE);
        } else {
            pause = FIRST_PAUSE;
        }
    }
}

impl HostLimiter for RedisHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
        Box::pin(async move {
            let started = Instant::now();
            let local = self.local.acquire(host, time_left).await?;
            let Some(pool) = self.pools.get(host) else {
                return Ok(local);
            };
            let (wait, last) = (pool.wait.min(time_left), started + time_left);
            match pool.slot(started + wait, last).await {
                Ok(Some(slot)) => Ok(local.join(HostSlot::new(slot))),
                Ok(None) => Err(HostRefusal::Saturated {
                    max_concurrent: pool.cap,
                }),
                Err(err) => match self.backend.failure_mode() {
                    FailureMode::Open => {
                        crate::metrics::shared_state_fallback("host_caps");
                        // The breaker logs the outage once; this is per read.
                        tracing::debug!(error = %err, host, "shared host caps down; capping in-process");
                        Ok(local)
                    }
                    FailureMode::Closed => Err(HostRefusal::Unavailable {
                        message: err.message,
                    }),
                },
            }
        })
    }

    fn in_flight(&self, host: &str) -> u64 {
        self.local.in_flight(host)
    }
}

#[cfg(test)]
mod tests;
