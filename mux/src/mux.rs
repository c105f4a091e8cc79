//! [`Mux`], the handle to one session, and [`Serve`], how a binary runs one.

use std::future::{ready, Future, Ready};
use std::sync::Arc;
use std::time::Duration;

use bridgehead_proto::session::{Role, SessionConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::driver::Driver;
use crate::end::SessionEnd;
use crate::stream::{self, DialRequest, MuxStream, OpenFailure};
use crate::websocket::WebSocket;
use crate::Keepalive;

/// Handle to one multiplexed session. Clones share the session.
#[derive(Debug, Clone)]
pub struct Mux {
    driver: Arc<Driver>,
}

/// How [`Mux::serve`] runs a session: its keepalive, the token that shuts it down, what to do
/// when the peer announces DRAIN, and work to run beside it on the session's task.
#[derive(Debug)]
pub struct Serve<D, B> {
    keepalive: Keepalive,
    shutdown: CancellationToken,
    on_peer_drain: D,
    beside: B,
}

impl Serve<Ready<()>, Ready<()>> {
    /// A session pinged as `keepalive` says, closed (code 1001, "going away") once `shutdown`
    /// fires; nothing done on the peer's DRAIN, nothing beside it.
    pub fn new(keepalive: Keepalive, shutdown: CancellationToken) -> Self {
        Serve {
            keepalive,
            shutdown,
            on_peer_drain: ready(()),
            beside: ready(()),
        }
    }
}

impl<D, B> Serve<D, B> {
    /// Runs `work` once the peer announces DRAIN (the server stops routing to a draining
    /// agent; the agent looks for another server). Dropped unfinished if the session ends.
    pub fn on_peer_drain<D2: Future<Output = ()>>(self, work: D2) -> Serve<D2, B> {
        Serve {
            keepalive: self.keepalive,
            shutdown: self.shutdown,
            on_peer_drain: work,
            beside: self.beside,
        }
    }

    /// Runs `work` beside the session on its task (the agent's accept loop and its drain on
    /// shutdown): polled only when its own waker fired, dropped unfinished if the session
    /// ends first. Its end does not end the session.
    pub fn beside<B2: Future<Output = ()>>(self, work: B2) -> Serve<D, B2> {
        Serve {
            keepalive: self.keepalive,
            shutdown: self.shutdown,
            on_peer_drain: self.on_peer_drain,
            beside: work,
        }
    }
}

impl Mux {
    /// A session for `config.role`; [`Mux::serve`] (or [`Mux::run`]) drives it over its
    /// WebSocket.
    pub fn new(config: SessionConfig) -> Mux {
        Mux {
            driver: Arc::new(Driver::new(config)),
        }
    }

    /// A server-side session with default settings.
    pub fn server() -> Mux {
        Mux::new(SessionConfig::new(Role::Server))
    }

    /// An agent-side session with default settings.
    pub fn agent() -> Mux {
        Mux::new(SessionConfig::new(Role::Agent))
    }

    /// Drives the session over `ws` as `serve` says, until it ends (peer gone, protocol
    /// error, keepalive timeout, [`Mux::close`] or the shutdown token). Every stream fails
    /// when it returns. An orderly end (the peer closed, [`Mux::close`], shutdown) is `Ok`;
    /// [`Mux::closed`] tells which.
    pub async fn serve<S, D, B>(
        &self,
        ws: WebSocket<S>,
        serve: Serve<D, B>,
    ) -> Result<(), SessionEnd>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        D: Future<Output = ()>,
        B: Future<Output = ()>,
    {
        let Serve {
            keepalive,
            shutdown,
            on_peer_drain,
            beside,
        } = serve;
        let end = self
            .driver
            .drive(ws, keepalive, &shutdown, on_peer_drain, beside)
            .await;
        if end.is_orderly() {
            Ok(())
        } else {
            Err(end)
        }
    }

    /// [`Mux::serve`] with nothing done on the peer's DRAIN and nothing beside.
    pub async fn run<S>(
        &self,
        ws: WebSocket<S>,
        keepalive: Keepalive,
        shutdown: CancellationToken,
    ) -> Result<(), SessionEnd>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve(ws, Serve::new(keepalive, shutdown)).await
    }

    /// Records the runtime this session's driver runs on (a shard of its own), so that
    /// whoever splices one of its streams can do so on the same thread
    /// ([`MuxStream::home`]). The first call counts.
    pub fn set_home(&self, home: tokio::runtime::Handle) {
        let _ = self.driver.home.set(home);
    }

    /// Streams currently open or dialing: the load the router balances on.
    pub fn open_streams(&self) -> usize {
        self.driver.open_streams()
    }

    /// Streams open or dialing, and of those the dials waiting for the agent's answer.
    pub fn load(&self) -> (usize, usize) {
        self.driver.load()
    }

    /// Whether the peer announced that it drains.
    pub fn peer_draining(&self) -> bool {
        self.driver.peer_draining()
    }

    /// Resolves when the session has ended, with the reason.
    pub async fn closed(&self) -> SessionEnd {
        self.driver.closed().await
    }

    /// Resolves when the peer announces DRAIN (or the session ends).
    pub async fn peer_drained(&self) {
        self.driver.peer_drained().await
    }

    /// Announces DRAIN to the peer.
    pub fn drain(&self) {
        self.driver.drain();
    }

    /// Ends the session now: every stream fails, the driver closes the WebSocket.
    pub fn close(&self, reason: &str) {
        self.driver.close(SessionEnd::Closed(reason.to_owned()));
    }

    /// Server: asks the agent to dial `host:port` and waits for its answer, at most `timeout`.
    pub async fn open(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<MuxStream, OpenFailure> {
        stream::open(&self.driver, host, port, timeout).await
    }

    /// Agent: the next dial the server asks for, or `None` once the session ended. One task
    /// at a time accepts.
    pub async fn accept(&self) -> Option<DialRequest> {
        stream::accept(&self.driver).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use tokio_util::sync::CancellationToken;

    use crate::{Keepalive, Mux, WebSocket, WsRole};

    /// A stream's slot (its wakers) goes with the stream: a session that carried many
    /// tunnels holds nothing of those that ended.
    #[tokio::test]
    async fn a_dropped_stream_leaves_nothing_in_its_session() {
        let shutdown = CancellationToken::new();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (server, agent) = (Mux::server(), Mux::agent());
        let ends = [
            (
                server.clone(),
                WebSocket::new(a, WsRole::Server, Bytes::new()),
            ),
            (
                agent.clone(),
                WebSocket::new(b, WsRole::Client, Bytes::new()),
            ),
        ];
        for (mux, ws) in ends {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { mux.run(ws, Keepalive::default(), shutdown).await });
        }
        let accepting = agent.clone();
        tokio::spawn(async move {
            while let Some(dial) = accepting.accept().await {
                drop(dial.accept());
            }
        });
        let slots = |mux: &Mux| mux.driver.with(|state| state.slots.len());
        let checked = tokio::time::timeout(Duration::from_secs(20), async {
            for _ in 0..5 {
                let stream = server
                    .open("target", 1, Duration::from_secs(5))
                    .await
                    .unwrap();
                assert_eq!(slots(&server), 1);
                drop(stream);
                assert_eq!(slots(&server), 0);
            }
        });
        checked.await.expect("the test took too long");
        shutdown.cancel();
    }
}
