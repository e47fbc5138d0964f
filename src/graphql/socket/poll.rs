//! One upstream poll shared by every subscriber that wants the same thing.
//!
//! A subscription that follows an upstream resource polls it. 1,000
//! subscribers of one resource polling it each would cost 1,000 reads per
//! interval; a [`SharedPoll`] makes it one per key per interval on this
//! replica, as coalescing makes identical reads in flight one:
//!
//! - **One task per key**, started by the first subscriber, stopped when the
//!   last one leaves — at once if it waits for its next tick, else after the
//!   read under way (charged, so finished, never cut). It reads once at once, then once per interval, and
//!   publishes each answer; a subscriber that joins meanwhile gets the last
//!   answer at once. A subscriber slower than the answers gets the newest
//!   (a `tokio::sync::watch`: nothing queues per subscriber).
//! - **Paid by one subscriber at a time**, round-robin: each poll's read
//!   runs in a scope opened on the next subscriber's connection whose budget
//!   has a read left ([`FanoutConnection::open_event`]: every request the
//!   read sends is charged to that connection, and to its client's read
//!   quota when it has one), so the reads charged across all connections
//!   add up to the requests sent. When no subscriber can pay, the poll runs
//!   on the next one in turn anyway and its read is refused before anything
//!   is sent (`FANOUT_BUDGET_EXHAUSTED`): every subscriber is told, through
//!   the answer, that the poll could not be paid.
//!   A subscriber whose client's read quota is empty is passed over too
//!   (up to eight asked per poll), so it never makes the poll fail for the
//!   others.
//! - A subscriber whose own budget is empty still receives what the others
//!   paid for: an answer is the resource's state, whoever paid to learn it.
//! - A read that panics costs that poll only (logged); the next runs at the
//!   next tick.
//! - Each poll is a trace of its own, rooted at its `upstream.poll` span,
//!   sampled on its own: its read is for subscribers of many connections,
//!   none of whose events it belongs to.

use super::connection::FanoutConnection;
use crate::request::Operation;
use futures::stream::{Stream, StreamExt};
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// One upstream poll per key, shared by its subscribers (see the module docs).
///
/// ```
/// use fanout_budget::graphql::SharedPoll;
/// use std::time::Duration;
///
/// // Keyed by the URL polled; each answer is the response's status.
/// let polls: SharedPoll<String, Option<u16>> = SharedPoll::new(Duration::from_secs(5));
/// # drop(polls);
/// ```
pub struct SharedPoll<K, T> {
    inner: Arc<Polls<K, T>>,
}

impl<K, T> Clone for SharedPoll<K, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K, T> std::fmt::Debug for SharedPoll<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPoll")
            .field("every", &self.inner.every)
            .finish_non_exhaustive()
    }
}

struct Polls<K, T> {
    every: Duration,
    keys: Mutex<HashMap<K, Weak<Shared<T>>>>,
}

/// One key's poll: its subscribers (the payers) and its last answer.
struct Shared<T> {
    latest: watch::Sender<Option<T>>,
    payers: Mutex<Payers>,
    /// Told when the last subscriber leaves (`Drop`): the task stops.
    gone: Arc<Notify>,
}

/// The subscribers' connections, in turn.
#[derive(Default)]
struct Payers {
    next_id: u64,
    /// Subscriber id and connection.
    all: Vec<(u64, FanoutConnection)>,
    /// Who is asked first next time.
    turn: usize,
}

impl Payers {
    /// The next subscriber in turn whose connection has a read left, else
    /// the next in turn.
    fn next(&mut self) -> Option<FanoutConnection> {
        let n = self.all.len();
        if n == 0 {
            return None;
        }
        let first = self.turn % n;
        let at = (0..n)
            .map(|k| (first + k) % n)
            .find(|&at| self.all[at].1.remaining() > 0)
            .unwrap_or(first);
        self.turn = at + 1;
        Some(self.all[at].1.clone())
    }
}

impl<K, T> SharedPoll<K, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    /// Polls that read once per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            inner: Arc::new(Polls {
                every,
                keys: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Subscribes `connection` to `key`'s poll: its answers, the last one
    /// at once if there is one. The first subscriber of a key starts its
    /// poll with `read`, which reads through the operation it is given (a
    /// scope on the paying subscriber's connection) and makes the answer;
    /// the poll stops when the last stream is dropped.
    pub fn subscribe<F, Fut>(
        &self,
        key: K,
        connection: &FanoutConnection,
        read: F,
    ) -> impl Stream<Item = T> + Send + 'static
    where
        F: Fn(Arc<Operation>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let shared = self.shared(key, read);
        let id = {
            let mut payers = lock(&shared.payers);
            payers.next_id += 1;
            let id = payers.next_id;
            payers.all.push((id, connection.clone()));
            id
        };
        let mut answers = shared.latest.subscribe();
        answers.mark_changed();
        let subscriber = Subscriber { shared, id };
        futures::stream::unfold(
            (answers, subscriber),
            |(mut answers, subscriber)| async move {
                loop {
                    answers.changed().await.ok()?;
                    let answer = answers.borrow_and_update().clone();
                    if let Some(answer) = answer {
                        return Some((answer, (answers, subscriber)));
                    }
                }
            },
        )
        .boxed()
    }

    /// Keys polled now: a subscriber or more each, or a last read still
    /// under way (a poll's read in flight when its last subscriber left is
    /// finished, not cut: it was charged).
    pub fn keys(&self) -> usize {
        lock(&self.inner.keys).len()
    }

    /// `key`'s poll, started with `read` if none runs.
    fn shared<F, Fut>(&self, key: K, read: F) -> Arc<Shared<T>>
    where
        F: Fn(Arc<Operation>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let mut keys = lock(&self.inner.keys);
        if let Some(shared) = keys.get(&key).and_then(Weak::upgrade) {
            return shared;
        }
        let polls = Arc::downgrade(&self.inner);
        let forgotten = key.clone();
        let forget = move || {
            if let Some(polls) = polls.upgrade() {
                let mut keys = lock(&polls.keys);
                if keys.get(&forgotten).is_some_and(|w| w.strong_count() == 0) {
                    keys.remove(&forgotten);
                }
            }
        };
        let gone = Arc::new(tokio::sync::Notify::new());
        let shared = Arc::new(Shared {
            latest: watch::Sender::new(None),
            payers: Mutex::new(Payers::default()),
            gone: gone.clone(),
        });
        keys.insert(key, Arc::downgrade(&shared));
        drop(keys);
        let every = self.inner.every;
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            run(weak, every, read, gone).await;
            forget();
        });
        shared
    }
}

/// The poll of one key, for as long as it has a subscriber: when the last
/// one leaves (`gone`), it stops at once if it is waiting for its next
/// tick, or after the read under way.
async fn run<T, F, Fut>(shared: Weak<Shared<T>>, every: Duration, read: F, gone: Arc<Notify>)
where
    F: Fn(Arc<Operation>) -> Fut,
    Fut: Future<Output = T>,
{
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = gone.notified() => return,
        }
        let Some(event) = paid_event(&shared).await else {
            return;
        };
        // A read that panics costs its poll, not the key's: the next one
        // runs at the next tick.
        // Each poll a trace of its own (`server_span::poll`).
        let polled = crate::graphql::server_span::poll(|| read(event.operation()));
        let answer = std::panic::AssertUnwindSafe(polled);
        let Ok(answer) = futures::FutureExt::catch_unwind(answer).await else {
            tracing::error!("a shared poll's read panicked; polling again at the next tick");
            continue;
        };
        let paid = event.budget().used() > 0;
        crate::metrics::shared_poll(if paid { "paid" } else { "unpaid" });
        drop(event);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.latest.send_replace(Some(answer));
    }
}

/// Subscribers asked at most, for one poll, before it runs unpaid.
const MAX_ASKED: usize = 8;

/// The scope of one poll's read, opened on the next subscriber in turn
/// that can pay: a read left in its connection's budget and in its client's
/// read quota (one whose quota is empty would make the poll fail for every
/// subscriber). After [`MAX_ASKED`] that cannot, the last one asked: its
/// read is refused. `None`: no subscriber is left.
async fn paid_event<T>(shared: &Weak<Shared<T>>) -> Option<crate::request::FanoutRequest> {
    let mut asked = 0;
    loop {
        let (payer, payers) = {
            let shared = shared.upgrade()?;
            let mut payers = lock(&shared.payers);
            (payers.next()?, payers.all.len())
        };
        let event = payer.open_event().await;
        asked += 1;
        if event.budget().remaining() > 0 || asked >= payers.min(MAX_ASKED) {
            return Some(event);
        }
        // Dropped, the scope gives its (empty) reservation back.
    }
}

/// A subscriber's place among the payers, left when its stream is dropped.
struct Subscriber<T> {
    shared: Arc<Shared<T>>,
    id: u64,
}

impl<T> Drop for Subscriber<T> {
    fn drop(&mut self) {
        lock(&self.shared.payers)
            .all
            .retain(|(id, _)| *id != self.id);
    }
}

impl<T> Drop for Shared<T> {
    /// The last subscriber left: the poll stops (after a read under way,
    /// which was charged and is finished), and forgets its key.
    fn drop(&mut self) {
        self.gone.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::Engine;
    use crate::inbound::identity::Caller;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    fn connection(engine: &Engine) -> FanoutConnection {
        let (parts, ()) = http::Request::new(()).into_parts();
        let memory = engine.socket_share(&parts);
        FanoutConnection::open(engine, Caller::Public, &parts, memory)
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_panics_costs_its_poll_not_the_key() {
        let engine = Engine::new(Config::default());
        let polls: SharedPoll<&str, u64> = SharedPoll::new(Duration::from_secs(1));
        let runs = Arc::new(AtomicU64::new(0));
        let counted = runs.clone();
        let mut answers = polls.subscribe("key", &connection(&engine), move |_operation| {
            let run = counted.fetch_add(1, SeqCst) + 1;
            async move {
                assert!(run > 1, "the first poll's read panics");
                run
            }
        });
        let second = tokio::time::timeout(Duration::from_secs(10), answers.next()).await;
        assert_eq!(second, Ok(Some(2)), "the second poll answers");
        assert_eq!(polls.keys(), 1);
        drop(answers);
        // The task stops at once (it waits for its next tick) and forgets
        // the key: a few turns of the scheduler.
        for _ in 0..100 {
            if polls.keys() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            polls.keys(),
            0,
            "the last subscriber gone, the key is forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscriber_that_joins_gets_the_last_answer_at_once_and_one_poll_serves_both() {
        let engine = Engine::new(Config::default());
        let polls: SharedPoll<&str, u64> = SharedPoll::new(Duration::from_secs(60));
        let runs = Arc::new(AtomicU64::new(0));
        let read = {
            let runs = runs.clone();
            move |_operation| {
                let run = runs.fetch_add(1, SeqCst) + 1;
                async move { run }
            }
        };
        let mut first = polls.subscribe("key", &connection(&engine), read.clone());
        assert_eq!(first.next().await, Some(1));
        let mut second = polls.subscribe("key", &connection(&engine), read);
        assert_eq!(second.next().await, Some(1), "the last answer, at once");
        assert_eq!(runs.load(SeqCst), 1, "no read of its own");
    }
}
