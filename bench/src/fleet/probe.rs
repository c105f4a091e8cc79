//! Traffic through the server's frontend to the simulated agents: a trickle of short tunnels
//! while the fleet runs (each routed by destHost to a random agent, 64 bytes echoed through
//! it), and the routing-latency probe (CONNECTs one after another, each timed to its `200`).
//! Both go through the Unix-socket frontend, plain CONNECT as kube-apiserver on the same node
//! sends it, so the time is the server's routing and the dial's round trip to the agent, not a
//! frontend TLS handshake.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::identity::{ipv4, TARGET_PORT};
use crate::route::Route;

/// Most trickle tunnels in flight at once (a restart holds some until their timeout).
const TRICKLE_IN_FLIGHT: usize = 64;
/// Bytes echoed through each tunnel.
const ECHO: usize = 64;

/// The address of a random agent among `agents`, as a CONNECT target.
pub fn random_target(agents: usize) -> SocketAddr {
    let index = rand::rng().random_range(0..agents.max(1));
    SocketAddr::from((ipv4(index), TARGET_PORT))
}

/// Opens a tunnel to `target`, echoes [`ECHO`] bytes through it and closes it: the time to
/// the `200`, or the kind of failure (`http:503`, `frontend:refused`, `timeout`, `echo`, ...).
pub async fn tunnel(route: &Route, target: SocketAddr) -> Result<Duration, String> {
    let started = Instant::now();
    let mut conn = match route.open(target).await {
        Ok(conn) => conn,
        Err(error) => return Err(kind_of(&error)),
    };
    let opened = started.elapsed();
    let message: [u8; ECHO] = rand::random();
    let mut back = [0u8; ECHO];
    let echoed = tokio::time::timeout(crate::route::OPEN_TIMEOUT, async {
        conn.write_all(&message).await?;
        conn.flush().await?;
        conn.read_exact(&mut back).await?;
        conn.shutdown().await?;
        std::io::Result::Ok(())
    })
    .await;
    match echoed {
        Ok(Ok(())) if back == message => Ok(opened),
        _ => Err("echo".to_owned()),
    }
}

/// `http:NNN` for a refused CONNECT; for a frontend that did not take it, what the socket
/// said (`frontend:refused` while no server listens, `frontend:reset`, ...); `timeout`.
fn kind_of(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    if let Some(status) = text
        .split_once("CONNECT refused: HTTP/1.")
        .and_then(|(_, rest)| rest.get(2..5))
    {
        return format!("http:{status}");
    }
    if error.chain().any(|e| e.is::<tokio::time::error::Elapsed>()) {
        return "timeout".to_owned();
    }
    let io = error
        .chain()
        .find_map(|e| e.downcast_ref::<std::io::Error>());
    match io.map(std::io::Error::kind) {
        Some(std::io::ErrorKind::ConnectionRefused) => "frontend:refused",
        Some(std::io::ErrorKind::NotFound) => "frontend:missing",
        Some(
            std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof,
        ) => "frontend:reset",
        _ => "frontend:other",
    }
    .to_owned()
}

/// Tunnels of the trickle, by outcome (`ok`, or a failure's kind).
pub type Outcomes = BTreeMap<String, u64>;

/// A trickle of tunnels, one every `interval`, until stopped.
#[derive(Debug)]
pub struct Trickle {
    stop: CancellationToken,
    outcomes: Arc<Mutex<Outcomes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Trickle {
    /// Starts the trickle on `runtime` to random agents among `agents`.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        route: Route,
        agents: usize,
        interval: Duration,
    ) -> Trickle {
        let stop = CancellationToken::new();
        let outcomes = Arc::new(Mutex::new(Outcomes::new()));
        let task = runtime.spawn(pace(
            route,
            agents,
            interval,
            stop.clone(),
            outcomes.clone(),
        ));
        Trickle {
            stop,
            outcomes,
            task,
        }
    }

    /// The outcomes so far.
    pub fn outcomes(&self) -> Outcomes {
        self.outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the trickle and waits for the tunnels in flight.
    pub async fn stop(self) -> Outcomes {
        self.stop.cancel();
        let _ = self.task.await;
        let outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.clone()
    }
}

async fn pace(
    route: Route,
    agents: usize,
    interval: Duration,
    stop: CancellationToken,
    outcomes: Arc<Mutex<Outcomes>>,
) {
    let route = Arc::new(route);
    let room = Arc::new(Semaphore::new(TRICKLE_IN_FLIGHT));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let record = |outcomes: &Mutex<Outcomes>, kind: String| {
        *outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_default() += 1;
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => break,
        }
        let Ok(permit) = room.clone().try_acquire_owned() else {
            record(&outcomes, "skipped: too many in flight".to_owned());
            continue;
        };
        let (route, outcomes) = (route.clone(), outcomes.clone());
        tokio::spawn(async move {
            let kind = match tunnel(&route, random_target(agents)).await {
                Ok(_) => "ok".to_owned(),
                Err(kind) => kind,
            };
            record(&outcomes, kind);
            drop(permit);
        });
    }
    // Every permit back: every tunnel in flight finished.
    let _ = room.acquire_many(TRICKLE_IN_FLIGHT as u32).await;
}

/// `ok 120, http:503 4` (most first), or `none`.
pub fn outcomes_text(outcomes: &Outcomes) -> String {
    let mut kinds: Vec<(&String, &u64)> = outcomes.iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if kinds.is_empty() {
        return "none".to_owned();
    }
    kinds
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connect_is_counted_by_its_status() {
        let refused = anyhow::anyhow!("CONNECT refused: HTTP/1.1 503 Service Unavailable");
        assert_eq!(kind_of(&refused), "http:503");
        let down = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::NotFound))
            .context("connecting to /tmp/x.sock");
        assert_eq!(kind_of(&down), "frontend:missing");
        let closed = anyhow::anyhow!("frontend closed before the response head ended");
        assert_eq!(kind_of(&closed), "frontend:other");
    }
}
