//! One host's share of its cap held by this replica ([`Pool`]), handed to
//! reads locally, and its claimer.
//!
//! - **Locally**, a pool counts the slots allowed and in use. A read takes
//!   one while fewer are in use than allowed — no network. Otherwise it asks
//!   the pool's claimer (one task per host, so one claim at a time and a
//!   cancelled read never loses a reply) and waits for the claim, a slot
//!   coming back, or its own wait running out (`HOST_SATURATED`). A read
//!   that stops waiting — it joined an identical read another request sent
//!   (`coalesce = true`), or its request was cancelled — drops its wait: it
//!   leaves the pool's waiters, and the local slot it held while waiting
//!   goes back.
//! - **A claim** (`lua/claim.lua`) reports what is in use and what is
//!   wanted; Redis answers what may be held ([`ClaimReply`]).
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
//!   within `share_use` (two thirds of `lease_ms`, `config::share_use`) of
//!   sending the claim that granted it, so Redis still holds it then. Data
//!   lost on Redis with no failed call (a restart between two calls,
//!   `FLUSHALL`, eviction) is noticed only at the next claim, at most
//!   `refresh_ms` later; until then the cap may be exceeded by the slots in
//!   use and taken here (the book, book/src/replicas.md).
//! - **Fallback** (`failure_mode = "open"`, Redis down): while no allowance
//!   is valid, reads take slots of the pool itself up to the fallback share
//!   (half the cap), in line; the slots still in use of the last allowance
//!   count against it. Redis holds none of the fallback slots until a claim
//!   succeeds again (the first after the breaker closes): it reports every
//!   slot in use, however it was granted, and one taken while it was in
//!   flight is reported by another claim right after its answer. Until
//!   then the fleet may hold more than the cap: each replica its share, as
//!   the book says (book/src/replicas.md).

use super::claim::{Claim, Grant};
use crate::backends::redis::backend::{down, RedisBackend, Route};
use crate::config::HostConfig;
use crate::error::Unavailable;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// The pause between claims that leave reads waiting: from this, doubling.
const FIRST_PAUSE: Duration = Duration::from_millis(2);
const LAST_PAUSE: Duration = Duration::from_millis(20);

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
    /// Fallback slots were taken while the last claim was in flight: more
    /// are in use than it reported, so Redis may hold fewer. Claim again.
    unreported: bool,
}

/// One host's share held by this replica, and its claimer.
#[derive(Debug)]
pub(super) struct Pool {
    host: String,
    backend: RedisBackend,
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
    /// The line of reads waiting for a fallback slot: first come, first
    /// served, as a semaphore would (a slot coming back wakes every waiter).
    fallback_line: tokio::sync::Mutex<()>,
}

/// A slot of a pool: back to it when dropped.
pub(super) struct Slot(Arc<Pool>);

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
pub(super) struct Waiting<'a>(&'a Pool);

impl<'a> Waiting<'a> {
    pub(super) fn new(pool: &'a Pool) -> Self {
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
    /// The pool of `host` (its `[hosts]` table `config`) for replica
    /// `holder`, on `backend`; no claimer until a read needs one.
    pub(super) fn new(
        host: &str,
        config: &HostConfig,
        backend: &RedisBackend,
        holder: &str,
    ) -> Self {
        Self {
            host: host.to_string(),
            backend: backend.clone(),
            key: backend.key("shares", host),
            holder: holder.to_string(),
            cap: config.max_concurrent,
            wait: config.acquire_wait(),
            state: Mutex::default(),
            wanted: Notify::new(),
            freed: Notify::new(),
            outcomes: watch::Sender::new(Ok(())),
            claimer: OnceLock::new(),
            fallback_line: tokio::sync::Mutex::const_new(()),
        }
    }

    /// The host's cap (for the whole fleet).
    pub(super) fn cap(&self) -> u32 {
        self.cap
    }

    /// How long a read may wait for a slot (`acquire_wait_ms`).
    pub(super) fn wait(&self) -> Duration {
        self.wait
    }

    /// Slots this replica may have in use, and of those, in use.
    pub(super) fn held(&self) -> (u32, u32) {
        let state = self.lock();
        (state.allowed, state.in_use)
    }

    /// This replica's field of the host's hash.
    #[cfg(test)]
    pub(super) fn holder(&self) -> &str {
        &self.holder
    }

    /// Reads waiting for a slot.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> u32 {
        self.lock().waiting
    }

    /// Stops the claimer, if one started, and gives back in the background
    /// what this replica holds of the host, so it frees now rather than
    /// after `lease_ms`: tried again every `backoff_ms` while it fails (a
    /// master failing over), for at most `lease_ms` (after which it lapses
    /// anyway).
    pub(super) fn stop(&self) {
        let Some(claimer) = self.claimer.get() else {
            return;
        };
        claimer.abort();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, key, holder) = (self.backend.clone(), self.key.clone(), self.holder.clone());
        runtime.spawn(async move {
            let until = Instant::now() + backend.lease();
            loop {
                let hdel = redis::cmd("HDEL").arg(&key).arg(&holder).clone();
                let removed = backend.call(Route::FollowUp, until, |mut conn| async move {
                    hdel.query_async::<i64>(&mut conn).await
                });
                let Err(error) = removed.await else {
                    return;
                };
                if Instant::now() + backend.backoff() >= until {
                    tracing::debug!(%error, "could not give back a host share; it lapses");
                    return;
                }
                tokio::time::sleep(backend.backoff()).await;
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot of the allowance, if one is free and valid: no network.
    pub(super) fn take(self: &Arc<Self>) -> Option<Slot> {
        self.take_if(|state| self.room(state))
    }

    /// A slot, counted in use, if `room` says there is one.
    fn take_if(self: &Arc<Self>, room: impl FnOnce(&State) -> bool) -> Option<Slot> {
        let mut state = self.lock();
        if !room(&state) {
            return None;
        }
        state.in_use += 1;
        state.used = true;
        state.peak = state.peak.max(state.in_use + state.waiting);
        Some(Slot(self.clone()))
    }

    /// This replica's share of the host while Redis cannot be asked
    /// (`failure_mode = "open"`): half the cap, at least one — its share in
    /// the smallest fleet, two.
    pub(super) fn fallback_share(&self) -> u32 {
        (self.cap / 2).max(1)
    }

    /// A slot of the fallback share while Redis cannot be asked, waiting
    /// in line until `give_up` for one to come back; `None` when none did.
    ///
    /// Counted with the slots of the allowance: those a claim granted
    /// before the outage and still in use count against the share, so the
    /// replica never holds more than the share, or what it held when Redis
    /// went, whichever is more; and those taken here are in use when Redis
    /// is back, so the next claim reports them. The share is used only while
    /// no allowance is valid: once a claim succeeds, a read waiting here
    /// takes a slot of the allowance or none. A fallback slot taken while a
    /// claim is in flight (the first after the breaker closed) is more than
    /// that claim reports: its answer asks for another claim at once.
    pub(super) async fn fallback(self: &Arc<Self>, give_up: Instant) -> Option<Slot> {
        let share = self.fallback_share();
        let room = |state: &State| !self.valid(state) && state.in_use < share;
        let _turn = match self.fallback_line.try_lock() {
            Ok(turn) => turn,
            Err(_) => {
                let _waiting = Waiting::new(self);
                tokio::time::timeout_at(give_up, self.fallback_line.lock())
                    .await
                    .ok()?
            }
        };
        if let Some(slot) = self.take().or_else(|| self.take_if(room)) {
            return Some(slot);
        }
        let _waiting = Waiting::new(self);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.take().or_else(|| self.take_if(room)) {
                return Some(slot);
            }
            tokio::select! {
                () = &mut freed => {}
                () = tokio::time::sleep_until(give_up) => return None,
            }
        }
    }

    /// Whether a read may take a slot now: the allowance is valid and not
    /// all in use (nor, while a claim is in flight, its floor).
    fn room(&self, state: &State) -> bool {
        let limit = state
            .in_flight
            .map_or(state.allowed, |n| n.min(state.allowed));
        self.valid(state) && state.in_use < limit
    }

    /// Whether the allowance may be handed out: granted by a claim sent
    /// within `share_use`, and no call of the backend failed since.
    fn valid(&self, state: &State) -> bool {
        state.valid_until.is_some_and(|(until, failures)| {
            Instant::now() < until && failures == self.backend.failed_calls()
        })
    }

    /// Whether a claim is needed now: a read waits with no room, a slot
    /// came back that others need and this replica may not reuse, or
    /// slots are in use that the last claim did not report.
    fn needs_claim(&self) -> bool {
        let state = self.lock();
        state.give_back || state.unreported || state.waiting > 0 && !self.room(&state)
    }

    /// A slot within `give_up` (the host's wait) — or, while the cap is not
    /// known to be full, the claim asked for in time answered (a slow Redis:
    /// at most `timeout_ms` more, never past `last`): `Ok(None)` when none
    /// came free in time, `Err` when Redis could not be asked.
    pub(super) async fn slot(
        self: &Arc<Self>,
        give_up: Instant,
        last: Instant,
    ) -> Result<Option<Slot>, Unavailable> {
        if let Some(slot) = self.take() {
            return Ok(Some(slot));
        }
        self.claimer.get_or_init(|| {
            let refresh = self.backend.refresh();
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
                    (until, extended) = ((give_up + self.backend.timeout()).min(last), true);
                }
            }
        }
    }

    /// One claim: reports what is in use and wanted, applies the answer.
    pub(super) async fn claim(&self) -> Result<(), Unavailable> {
        let backend = &self.backend;
        let (floor, wants, block) = {
            let mut state = self.lock();
            let wants = state.peak.max(state.in_use + state.waiting);
            let idle = !state.used && state.in_use == 0 && state.waiting == 0;
            let block = if idle { 0 } else { backend.lease_block() };
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
            state.unreported = false;
            (floor, wants, block)
        };
        let (sent, failures) = (Instant::now(), backend.failed_calls());
        let claim = Claim {
            key: &self.key,
            holder: &self.holder,
            floor,
            wants,
            cap: self.cap,
            block,
        };
        let granted = claim.send(backend).await;
        let mut state = self.lock();
        state.in_flight = None;
        match granted {
            Ok(Grant { allowed, busy }) => {
                // Redis holds max(allowed, floor) for this replica, the
                // floor for reads in flight; new ones only within `allowed`.
                state.allowed = allowed;
                state.valid_until = Some((sent + backend.share_use(), failures));
                state.busy = busy;
                state.recorded = allowed > 0 || floor > 0 || wants > 0;
                // Others turned out short while this claim kept the old
                // allowance as its floor: give back what Redis holds beyond
                // the share and the reads in flight now, not a refresh later.
                if busy && floor > allowed.max(state.in_use) {
                    state.give_back = true;
                    self.wanted.notify_one();
                }
                // Fallback slots taken while it was in flight: Redis holds
                // only the floor; report them now, not a refresh later.
                if state.in_use > allowed.max(floor) {
                    state.unreported = true;
                    self.wanted.notify_one();
                }
                drop(state);
                // A read waiting for a fallback slot may take the allowance.
                self.freed.notify_waiters();
                Ok(())
            }
            Err(error) => {
                // Redis holds at least the floor, or nothing changed.
                state.allowed = state.allowed.min(floor);
                state.valid_until = None;
                // Whether others are short is not known: a fallback slot
                // coming back asks no claim of a Redis that is down.
                state.busy = false;
                state.recorded = true;
                drop(state);
                // The allowance is void: a read waiting for a fallback slot
                // may take one of the share now.
                self.freed.notify_waiters();
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
