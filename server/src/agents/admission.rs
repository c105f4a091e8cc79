//! The pre-authentication admission of the agent port and of the peer port (each its own
//! instance): at most `limit` connections in their TLS handshake and upgrade request at once,
//! and room made by cutting a stalled handshake, never one that is making progress.
//!
//! After a server restart every agent of the fleet comes back within a second or two. Each
//! handshake the server starts costs it a signature; cutting one that was about to finish
//! throws that work away and sends the agent into its backoff, so a storm feeds itself. So the
//! accept loop takes a [`Place`] *before* it accepts: while every place is held by a
//! handshake that is making progress, new connections wait in the listen backlog (the
//! kernel's queue, served in order, and TCP's own back-pressure past it). A handshake is
//! *stalled* when the server has been waiting for its peer's bytes for the stall time or
//! longer; a stalled one is cut when a newcomer needs its place, so a flood of connections
//! that never speak (a slowloris) holds the server to `limit` descriptors without keeping
//! honest agents out for longer than the stall time. Time the server spends on its own work
//! (a handshake accepted but not yet polled, a signature being computed) never counts against
//! the peer.
//!
//! A slow agent (a busy node, a long lossy link) answers every step late but answers; a
//! slowloris never does. One fixed stall time cannot tell them apart when a slow fleet's steps
//! take longer than it: a fleet whose every step is a few seconds late looks, step by step,
//! exactly like a slowloris, and cutting it for room is the livelock above (each cut agent
//! comes back to wait and to be cut again). So the stall time learns from the peers that did
//! answer ([`pace`]): it is `stall` (`--agent-handshake-stall`, the floor) or one and a half
//! times what the recent answered waits stayed within (their 99th percentile), whichever is
//! longer, and at most half the endpoint's total bound. A slowloris never answers, so it never
//! lengthens the stall time: against silent floods and a fast fleet the floor holds. A slow
//! fleet lengthens it for itself within its first answered step: at any moment of a storm the
//! waits that ended are those up to now, so the learnt stall time stays ahead of the waits
//! still running. An attacker who answers slowly on purpose can lengthen it to the cap; that
//! buys no more than trickling already does (the total bound below), and costs it a TLS
//! handshake per connection instead of an idle socket. What it cannot do: a fleet whose
//! *every* first step is later than the floor has nothing answered to learn from in its first
//! seconds, so at the start of a storm it can lose a handshake per newcomer waiting then.
//! Measured, with the agent's own bound that this needs (the agent counts its TLS time from
//! the server's first answer, not from its wait in the listen backlog): docs/benchmarks.md,
//! "Slow agents".
//!
//! A peer that trickles a byte every stall time less a little never counts as stalled: the
//! endpoint's total bound (`--agent-handshake-timeout`) is the backstop for it, set past what
//! an agent itself waits, so that it never cuts a handshake whose agent still answers.
//!
//! What this leaves out: that total bound (applied by the endpoint) and authentication, which
//! runs after the place is given back.

mod pace;

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use pace::Pace;

/// How far past the recent answered waits the stall time lies: room for the one slower step
/// of an agent that is slow like its fleet.
const PACE_MARGIN: f64 = 1.5;

/// The handshakes in progress on one listener: the agent port's, or the peer port's (each its
/// own instance).
#[derive(Debug, Clone)]
pub struct HandshakeAdmission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    /// The shortest stall time (`--agent-handshake-stall`).
    stall: Duration,
    /// The longest: half the endpoint's total bound.
    max_stall: Duration,
    /// What the peers that answered made the server wait lately.
    pace: Mutex<Pace>,
    /// The zero of every handshake's waiting stamp.
    epoch: Instant,
    state: Mutex<State>,
    /// A place was given back.
    freed: Notify,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    running: HashMap<u64, Running>,
}

#[derive(Debug)]
struct Running {
    cut: CancellationToken,
    progress: Arc<Progress>,
}

/// Since when the server has been waiting for the peer: milliseconds after the epoch plus one,
/// 0 while it is not waiting.
#[derive(Debug, Default)]
struct Progress {
    waiting_since: AtomicU64,
}

/// What [`HandshakeAdmission::place`] did to find room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// A place was free.
    Free,
    /// A stalled handshake was cut for it.
    Cut,
}

/// One connection's place in the handshake set; released on drop.
#[derive(Debug)]
pub struct Place {
    id: u64,
    cut: CancellationToken,
    progress: Arc<Progress>,
    admission: Arc<Inner>,
}

impl HandshakeAdmission {
    /// At most `limit` handshakes; a peer that owes bytes for the stall time may be cut for
    /// room. The stall time is `stall` or longer when the peers that answered lately kept the
    /// server waiting longer, up to half of `backstop` (the endpoint's total bound).
    pub fn new(limit: usize, stall: Duration, backstop: Duration) -> HandshakeAdmission {
        let now = Instant::now();
        HandshakeAdmission {
            inner: Arc::new(Inner {
                limit: limit.max(1),
                stall,
                max_stall: (backstop / 2).max(stall),
                pace: Mutex::new(Pace::new(now)),
                epoch: now,
                state: Mutex::new(State::default()),
                freed: Notify::new(),
            }),
        }
    }

    /// A place for the next connection: at once when one is free, after cutting a stalled
    /// handshake, or once one of either comes.
    pub async fn place(&self) -> (Place, Room) {
        loop {
            let freed = self.inner.freed.notified();
            let recheck = match self.try_place() {
                Ok(placed) => return placed,
                Err(recheck) => recheck,
            };
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep_until(recheck) => {}
            }
        }
    }

    /// A place now, or the earliest moment one of the running handshakes may count as
    /// stalled.
    fn try_place(&self) -> Result<(Place, Room), Instant> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut room = Room::Free;
        if state.running.len() >= self.inner.limit {
            let stall = self.inner.stall_time(now);
            let longest = state
                .running
                .iter()
                .filter_map(|(id, running)| Some((running.progress.since(&self.inner)?, *id)))
                .min();
            let Some((since, id)) = longest.filter(|(since, _)| now >= *since + stall) else {
                let recheck = longest.map_or(now, |(since, _)| since) + stall;
                return Err(recheck.max(now + Duration::from_millis(1)));
            };
            debug_assert!(now >= since);
            if let Some(stalled) = state.running.remove(&id) {
                stalled.cut.cancel();
            }
            room = Room::Cut;
        }
        let id = state.next;
        state.next += 1;
        let place = Place {
            id,
            cut: CancellationToken::new(),
            progress: Arc::new(Progress::default()),
            admission: self.inner.clone(),
        };
        state.running.insert(
            id,
            Running {
                cut: place.cut.clone(),
                progress: place.progress.clone(),
            },
        );
        Ok((place, room))
    }

    /// How long a handshake's peer may owe bytes now before its place may go to a newcomer.
    pub fn stall_time(&self) -> Duration {
        self.inner.stall_time(Instant::now())
    }

    /// Handshakes in progress.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().running.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn stall_time(&self, now: Instant) -> Duration {
        let answered = self
            .pace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .quantile(now);
        let learnt = answered.map_or(Duration::ZERO, |waited| waited.mul_f64(PACE_MARGIN));
        learnt.clamp(self.stall, self.max_stall)
    }
}

impl Progress {
    fn since(&self, inner: &Inner) -> Option<Instant> {
        match self.waiting_since.load(Ordering::Relaxed) {
            0 => None,
            stamp => Some(inner.epoch + Duration::from_millis(stamp - 1)),
        }
    }

    fn waiting(&self, inner: &Inner) {
        if self.waiting_since.load(Ordering::Relaxed) == 0 {
            let stamp = inner.epoch.elapsed().as_millis() as u64 + 1;
            self.waiting_since.store(stamp, Ordering::Relaxed);
        }
    }

    /// The peer moved bytes; if the server had been waiting for it, that wait is a sample of
    /// how long answering peers take.
    fn progressed(&self, inner: &Inner) {
        let stamp = self.waiting_since.swap(0, Ordering::Relaxed);
        if stamp == 0 {
            return;
        }
        let since = inner.epoch + Duration::from_millis(stamp - 1);
        let now = Instant::now();
        inner
            .pace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .record(now, now.saturating_duration_since(since));
    }
}

impl Place {
    /// Resolves when a newcomer needed this place because the handshake had stalled.
    pub async fn cut(&self) {
        self.cut.cancelled().await;
    }

    /// `io`, reporting to this place whether its peer keeps the handshake moving.
    pub fn watch<S>(&self, io: S) -> Watched<S> {
        Watched {
            io,
            watch: Some(Watch {
                progress: self.progress.clone(),
                admission: self.admission.clone(),
            }),
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self
            .admission
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.running.remove(&self.id).is_some() {
            self.admission.freed.notify_one();
        }
    }
}

/// A socket whose reads and writes tell its handshake's place whether the peer is keeping
/// up: a read or write that has to wait starts the stall clock, one that moves bytes stops it.
/// Once the handshake is over, [`Watched::release`] makes it a plain pass-through.
#[derive(Debug)]
pub struct Watched<S> {
    io: S,
    watch: Option<Watch>,
}

#[derive(Debug)]
struct Watch {
    progress: Arc<Progress>,
    admission: Arc<Inner>,
}

impl<S> Watched<S> {
    /// Stops reporting: the handshake is over.
    pub fn release(&mut self) {
        self.watch = None;
    }

    fn note<T>(&self, poll: &Poll<io::Result<T>>, moved: impl FnOnce(&T) -> bool) {
        let Some(watch) = &self.watch else { return };
        match poll {
            Poll::Pending => watch.progress.waiting(&watch.admission),
            Poll::Ready(Ok(done)) if moved(done) => watch.progress.progressed(&watch.admission),
            Poll::Ready(_) => {}
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        this.note(&poll, |()| moved);
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.note(&poll, |n| *n > 0);
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.note(&poll, |n| *n > 0);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const STALL: Duration = Duration::from_secs(2);
    /// The endpoint's total bound.
    const BACKSTOP: Duration = Duration::from_secs(20);

    fn admission(limit: usize) -> HandshakeAdmission {
        HandshakeAdmission::new(limit, STALL, BACKSTOP)
    }

    #[tokio::test(start_paused = true)]
    async fn free_places_are_given_at_once_and_given_back_on_drop() {
        let admission = admission(2);
        let (first, room) = admission.place().await;
        assert_eq!(room, Room::Free);
        let (_second, _) = admission.place().await;
        assert_eq!(admission.len(), 2);
        drop(first);
        assert_eq!(admission.len(), 1);
        let (_third, room) = admission.place().await;
        assert_eq!(room, Room::Free);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handshake_making_progress_is_never_cut_a_newcomer_waits_for_its_place() {
        let admission = admission(1);
        let (busy, _) = admission.place().await;
        // Never polled for the peer's bytes: the server's own delay, not the peer's.
        let waiter = tokio::spawn({
            let admission = admission.clone();
            async move { admission.place().await }
        });
        tokio::time::sleep(STALL * 5).await;
        assert!(
            !waiter.is_finished(),
            "a newcomer took a busy handshake's place"
        );
        assert!(!busy.cut.is_cancelled());
        drop(busy);
        let (_place, room) = waiter.await.unwrap();
        assert_eq!(room, Room::Free);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_owes_bytes_for_the_stall_time_is_cut_for_a_newcomer() {
        let admission = admission(1);
        let (stalled, _) = admission.place().await;
        let (ours, _peer) = tokio::io::duplex(64);
        let mut io = stalled.watch(ours);
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(1), io.read(&mut byte)).await;
        assert!(read.is_err(), "the peer sent nothing");
        let started = Instant::now();
        let (_newcomer, room) = admission.place().await;
        assert_eq!(room, Room::Cut);
        assert!(stalled.cut.is_cancelled());
        let waited = started.elapsed();
        assert!(
            waited >= STALL - Duration::from_millis(2) && waited <= STALL,
            "cut after {waited:?}"
        );
        assert_eq!(admission.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_from_the_peer_restart_its_stall_clock() {
        let admission = admission(1);
        let (place, _) = admission.place().await;
        let (ours, mut peer) = tokio::io::duplex(64);
        let mut io = place.watch(ours);
        let waiter = tokio::spawn({
            let admission = admission.clone();
            async move { admission.place().await }
        });
        let mut byte = [0u8; 1];
        for _ in 0..5 {
            // A read that waits, then the peer speaks just before the stall time.
            let read = io.read(&mut byte);
            tokio::pin!(read);
            assert!(futures_poll_once(&mut read).await.is_none());
            tokio::time::sleep(STALL - Duration::from_millis(100)).await;
            peer.write_all(b"x").await.unwrap();
            assert_eq!(read.await.unwrap(), 1);
        }
        assert!(!waiter.is_finished(), "a peer that kept talking was cut");
        // Released after the handshake: waiting no longer counts.
        io.release();
        let read = tokio::time::timeout(STALL * 3, io.read(&mut byte)).await;
        assert!(read.is_err());
        assert!(!waiter.is_finished(), "a released socket's wait counted");
        drop(place);
        assert_eq!(waiter.await.unwrap().1, Room::Free);
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_stalled_goes_first() {
        let admission = admission(2);
        let (older, _) = admission.place().await;
        let (newer, _) = admission.place().await;
        let (a, _pa) = tokio::io::duplex(64);
        let (b, _pb) = tokio::io::duplex(64);
        let (mut a, mut b) = (older.watch(a), newer.watch(b));
        let mut byte = [0u8; 1];
        // `newer` starts waiting first: it is the longer stalled, though it came later.
        let _ = tokio::time::timeout(Duration::from_millis(1), b.read(&mut byte)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = tokio::time::timeout(Duration::from_millis(1), a.read(&mut byte)).await;
        let (_third, room) = admission.place().await;
        assert_eq!(room, Room::Cut);
        assert!(newer.cut.is_cancelled() && !older.cut.is_cancelled());
    }

    /// One step of a slow peer: the server reads and waits, the peer answers after `late`.
    async fn answer_late(
        io: &mut Watched<tokio::io::DuplexStream>,
        peer: &mut tokio::io::DuplexStream,
        late: Duration,
    ) {
        let mut byte = [0u8; 1];
        let read = io.read(&mut byte);
        tokio::pin!(read);
        assert!(futures_poll_once(&mut read).await.is_none());
        tokio::time::sleep(late).await;
        peer.write_all(b"x").await.unwrap();
        assert_eq!(read.await.unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_fleet_is_kept_while_a_silent_peer_is_cut_for_room() {
        // Each step of this fleet's handshakes comes 3 s late, past the 2 s floor.
        let late = Duration::from_secs(3);
        let admission = admission(2);
        {
            // An earlier agent of the fleet answered its steps that late.
            let (earlier, _) = admission.place().await;
            let (ours, mut peer) = tokio::io::duplex(64);
            let mut io = earlier.watch(ours);
            answer_late(&mut io, &mut peer, late).await;
            answer_late(&mut io, &mut peer, late).await;
        }
        // Every place taken: a slow agent, then, half a second later, a peer that never speaks.
        let (slow, _) = admission.place().await;
        let (ours, mut slow_peer) = tokio::io::duplex(64);
        let mut slow_io = slow.watch(ours);
        let slow_step = tokio::spawn(async move {
            for _ in 0..3 {
                answer_late(&mut slow_io, &mut slow_peer, late).await;
            }
            slow_io
        });
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (silent, _) = admission.place().await;
        let (ours, _silent_peer) = tokio::io::duplex(64);
        let mut silent_io = silent.watch(ours);
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(1), silent_io.read(&mut byte)).await;
        assert!(read.is_err(), "the peer sent nothing");
        let started = Instant::now();
        let (_newcomer, room) = admission.place().await;
        assert_eq!(room, Room::Cut);
        assert!(
            !slow.cut.is_cancelled(),
            "a slow agent that kept answering was cut after {:?}",
            started.elapsed()
        );
        assert!(silent.cut.is_cancelled());
        // Cut once its silence passed the learnt stall time, not the floor.
        assert!(
            started.elapsed() >= late,
            "cut after {:?}",
            started.elapsed()
        );
        let _slow_io = slow_step.await.unwrap();
        assert!(!slow.cut.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn silence_teaches_nothing_and_the_stall_time_stays_under_half_the_backstop() {
        let admission = admission(8);
        let mut silent = Vec::new();
        for _ in 0..4 {
            let (place, _) = admission.place().await;
            let (ours, peer) = tokio::io::duplex(64);
            let mut io = place.watch(ours);
            let mut byte = [0u8; 1];
            let _ = tokio::time::timeout(Duration::from_millis(1), io.read(&mut byte)).await;
            silent.push((place, io, peer));
        }
        tokio::time::sleep(BACKSTOP).await;
        assert_eq!(admission.stall_time(), STALL);
        // A fleet answering 40 s late raises it no further than half the backstop.
        let (place, _) = admission.place().await;
        let (ours, mut peer) = tokio::io::duplex(64);
        let mut io = place.watch(ours);
        answer_late(&mut io, &mut peer, Duration::from_secs(40)).await;
        assert_eq!(admission.stall_time(), BACKSTOP / 2);
        // And it forgets once the storm is over.
        tokio::time::sleep(pace::WINDOW * 2 + Duration::from_millis(1)).await;
        assert_eq!(admission.stall_time(), STALL);
    }

    /// Polls `future` once: its output if it was ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(
        future: &mut F,
    ) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut *future).poll(cx) {
                Poll::Ready(output) => Some(output),
                Poll::Pending => None,
            })
        })
        .await
    }
}
