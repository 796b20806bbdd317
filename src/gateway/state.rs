//! Shared gateway state: engine availability, the slot semaphore and its bounded queue,
//! in-flight accounting for the drain.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use super::config::GatewayConfig;
use super::count::Counter;
use super::metrics::Metrics;
use super::restart::Timing;

/// What the gateway knows about the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineState {
    /// Serving: requests are proxied.
    Ready,
    /// Starting or restarting: new requests get 503 + Retry-After.
    Unavailable,
    /// Stopping: new requests get 503, in-flight ones finish.
    Draining,
}

impl EngineState {
    const fn code(self) -> u8 {
        match self {
            EngineState::Ready => 0,
            EngineState::Unavailable => 1,
            EngineState::Draining => 2,
        }
    }
    const fn of(code: u8) -> Self {
        match code {
            0 => EngineState::Ready,
            1 => EngineState::Unavailable,
            _ => EngineState::Draining,
        }
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every in-flight request finished.
    Idle,
    /// The drain timeout passed; this many were still in flight (their streams are then cut).
    TimedOut(usize),
}

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotRefusal {
    QueueFull,
    QueueTimeout,
}

/// One request's place in its key's count (`max_in_flight=N` in the key file), released on drop.
#[derive(Debug)]
pub(crate) struct KeyHold {
    gw: Arc<Gateway>,
    key: usize,
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        if let Some(n) = self.gw.per_key.get(self.key) {
            n.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// One request's hold on the engine: a slot and the in-flight count (and its key's), released
/// on drop.
#[derive(Debug)]
pub(crate) struct InFlight {
    _permit: OwnedSemaphorePermit,
    _key: Option<KeyHold>,
    gw: Arc<Gateway>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gw.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.gw.idle.notify_waiters();
    }
}

/// One request's place in the queue: counted in `queued` from `enter` until dropped.
struct Queued<'a> {
    count: &'a AtomicUsize,
    /// Requests that were already waiting.
    ahead: usize,
}

impl<'a> Queued<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        Self { ahead: count.fetch_add(1, Ordering::SeqCst), count }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The gateway: configuration, HTTP client to the engine, and live state.
#[derive(Debug)]
pub struct Gateway {
    pub(crate) cfg: GatewayConfig,
    pub(crate) client: reqwest::Client,
    pub(crate) metrics: Metrics,
    state: AtomicU8,
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
    in_flight: AtomicUsize,
    /// Requests of each key (index into `cfg.keys`) queued or in flight.
    per_key: Vec<AtomicUsize>,
    idle: Notify,
    /// Set when the drain timed out: open streams end with the error event.
    pub(crate) cut: watch::Sender<bool>,
    /// The in-process prompt counter: the config's, or loaded from `cfg.tokenizer` once the
    /// engine is first ready (a model made on the first start); `Err` = why the engine's
    /// `/tokenize` counts instead.
    counter: OnceLock<Result<Arc<Counter>, String>>,
    /// Boot timing (for `Retry-After`) and the engine-death latch.
    timing: Mutex<Timing>,
}

impl Gateway {
    /// A gateway in state `initial`.
    pub fn new(cfg: GatewayConfig, initial: EngineState) -> Result<Arc<Self>, reqwest::Error> {
        // No overall timeout: streams last as long as generation does. Connecting is bounded.
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(k) = &cfg.upstream_key {
            // Not a valid header value (a control character): sent without, the engine says 401.
            if let Ok(mut v) = reqwest::header::HeaderValue::from_str(&format!("Bearer {k}")) {
                v.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, v);
            }
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .no_proxy()
            .default_headers(headers)
            .build()?;
        let gw = Arc::new(Self {
            slots: Arc::new(Semaphore::new(cfg.max_in_flight)),
            per_key: cfg.keys.iter().map(|_| AtomicUsize::new(0)).collect(),
            cfg,
            client,
            metrics: Metrics::default(),
            state: AtomicU8::new(initial.code()),
            queued: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            cut: watch::channel(false).0,
            counter: OnceLock::new(),
            timing: Mutex::new(Timing::new(initial, Instant::now())),
        });
        if matches!(gw.cfg.counter, Some(Ok(_))) || initial == EngineState::Ready {
            gw.load_counter();
        }
        Ok(gw)
    }

    /// Settle the prompt counter (once): the config's, else `cfg.tokenizer` loaded now.
    fn load_counter(&self) {
        self.counter.get_or_init(|| {
            if let Some(Ok(c)) = &self.cfg.counter {
                return Ok(Arc::clone(c));
            }
            let why = match self.cfg.tokenizer.as_deref().map(Counter::load) {
                Some(Ok(c)) => return Ok(Arc::new(c)),
                Some(Err(e)) => e.to_string(),
                None => "the checkpoint's directory is not known".to_string(),
            };
            Err(format!("prompts are counted by the engine's /tokenize: {why}"))
        });
    }

    /// The in-process prompt counter, once settled and loaded.
    pub(crate) fn counter(&self) -> Option<&Counter> {
        self.counter.get().and_then(|c| c.as_deref().ok())
    }

    #[must_use]
    pub fn config(&self) -> &GatewayConfig {
        &self.cfg
    }

    /// Tell the gateway the engine's state (the supervisor calls this on every change).
    /// Draining is sticky: once draining, only [`Gateway::drain`] ends it.
    pub fn set_engine_state(&self, s: EngineState) {
        if s == EngineState::Ready {
            // The checkpoint exists once the engine serves it.
            self.load_counter();
        }
        let _ = self.state.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
            (EngineState::of(cur) != EngineState::Draining).then_some(s.code())
        });
        self.with_timing(|t| t.observe(s, Instant::now()));
    }

    fn with_timing<T>(&self, f: impl FnOnce(&mut Timing) -> T) -> T {
        // A poisoned lock only means another thread panicked mid-update: the timing stays usable.
        f(&mut self.timing.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// The engine's state as the gateway answers for it: the supervisor's, or `Unavailable`
    /// while an engine error has shown the engine died and the supervisor has not said so yet.
    #[must_use]
    pub fn engine_state(&self) -> EngineState {
        match EngineState::of(self.state.load(Ordering::SeqCst)) {
            EngineState::Ready if self.with_timing(|t| t.dead()) => EngineState::Unavailable,
            s => s,
        }
    }

    /// An engine error said the engine core died: unavailable at once (503 + Retry-After) until
    /// the supervisor's restart has made it ready again, or its `/health` answers 200.
    pub(crate) fn engine_died(&self) {
        self.with_timing(|t| t.died(Instant::now()));
    }

    /// `Retry-After` seconds for a 503 while the engine is unavailable: the last boot's duration
    /// less the time this restart has already taken (the configured value when unknown).
    #[must_use]
    pub fn retry_after_s(&self) -> u64 {
        self.with_timing(|t| t.retry_after(Instant::now(), self.cfg.retry_after_s))
    }

    /// With a latched death and the supervisor still saying ready: ask the engine's `/health`
    /// (at most once a second); a 200 means it was no death, and the latch is cleared.
    pub(crate) async fn recheck_death(&self) {
        let due = self.with_timing(|t| {
            let now = Instant::now();
            let due = t.dead() && t.probed.is_none_or(|p| now.duration_since(p) >= Duration::from_secs(1));
            if due {
                t.probed = Some(now);
            }
            due
        });
        if !due || EngineState::of(self.state.load(Ordering::SeqCst)) != EngineState::Ready {
            return;
        }
        let url = format!("{}/health", self.cfg.upstream);
        let ok = self.client.get(url).timeout(Duration::from_secs(1)).send().await.is_ok_and(|r| r.status() == 200);
        if ok {
            self.with_timing(Timing::alive);
        }
    }

    /// Requests holding an engine slot.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Requests waiting for a slot.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Prometheus text of the gateway's own series.
    #[must_use]
    pub fn metrics_text(&self) -> String {
        let mut snap = self.metrics.snapshot(self.queued() as u64, self.in_flight() as u64);
        snap.counting_note = self.counter.get().and_then(|c| c.as_ref().err().cloned());
        super::metrics::render(&snap)
    }

    /// Every slot busy and the queue full: a request now would get 429 (checked before
    /// admission, so a refused request costs the engine no `/tokenize`).
    #[must_use]
    pub(crate) fn saturated(&self) -> bool {
        self.slots.available_permits() == 0 && self.queued() >= self.cfg.queue_len
    }

    /// Count one more request of key `key` (index into `cfg.keys`), or None when its
    /// `max_in_flight` is reached.
    pub(crate) fn hold_key(self: &Arc<Self>, key: usize) -> Option<KeyHold> {
        let limit = self.cfg.keys.get(key)?.policy.max_in_flight.unwrap_or(usize::MAX);
        let n = self.per_key.get(key)?;
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| (c < limit).then_some(c + 1)).ok()?;
        Some(KeyHold { gw: self.clone(), key })
    }

    /// Take a slot, waiting in the bounded queue when all are busy; `key` travels with it.
    pub(crate) async fn slot(self: &Arc<Self>, key: Option<KeyHold>) -> Result<InFlight, SlotRefusal> {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Counted while waiting, and uncounted however the wait ends: a client that goes
                // away drops this future mid-wait, and the guard's drop takes it off the queue.
                let place = Queued::enter(&self.queued);
                if place.ahead >= self.cfg.queue_len {
                    return Err(SlotRefusal::QueueFull);
                }
                let got = tokio::time::timeout(self.cfg.queue_wait, self.slots.clone().acquire_owned()).await;
                drop(place);
                match got {
                    Ok(Ok(p)) => p,
                    // The semaphore is never closed; a closed one reads as a queue timeout.
                    Ok(Err(_)) | Err(_) => return Err(SlotRefusal::QueueTimeout),
                }
            }
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Ok(InFlight { _permit: permit, _key: key, gw: self.clone() })
    }

    /// Stop admitting (503 from now on) and wait up to the drain timeout for in-flight requests.
    /// On timeout, open streams are ended with the terminal error event.
    pub async fn drain(&self) -> DrainOutcome {
        self.state.store(EngineState::Draining.code(), Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + self.cfg.drain_timeout;
        loop {
            let notified = self.idle.notified();
            let n = self.in_flight();
            if n == 0 {
                return DrainOutcome::Idle;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let n = self.in_flight();
                if n == 0 {
                    return DrainOutcome::Idle;
                }
                let _ = self.cut.send(true);
                return DrainOutcome::TimedOut(n);
            }
        }
    }
}
