//! Drives one session's WebSocket: a reader, a writer and the keepalive.

use std::time::Duration;

use bridgehead_proto::Frame;
use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::Mux;

/// Largest WebSocket message either end accepts; the writer batches frames up to a quarter
/// of it.
pub const MAX_MESSAGE: usize = 1024 * 1024;

/// The WebSocket limits both ends use: messages up to [`MAX_MESSAGE`].
pub fn websocket_config() -> WebSocketConfig {
    // tungstenite zero-fills up to `read_buffer_size` bytes before every read attempt
    // (three per message), whatever arrives: the 128 KiB default cost a 128 KiB memset per
    // record.
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}
/// The writer batches frames into messages of about this size.
const BATCH_BYTES: usize = 256 * 1024;
/// Most bytes tungstenite reads (and zero-fills first) per read call. Control frames and
/// small DATA (dials, round trips) are a few dozen bytes; a large message's reads are served
/// from the TLS stream's decrypted record without a syscall each, so small reads cost bulk
/// nothing measurable. Callgrind, 20 KiB → 4 KiB: round trip 67.9 k → 62.8 k instructions,
/// Unix-socket setup 136.8 k → 128.9 k, bulk within 0.5 % (docs/benchmarks.md).
const READ_BUFFER: usize = 4 * 1024;
/// How long a closing session may take to flush frames queued before the close.
const CLOSE_FLUSH: Duration = Duration::from_secs(1);

/// How often to ping and how long silence may last before the session is declared dead.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// Interval between pings.
    pub interval: Duration,
    /// Silence (no message, no pong) after which the session is dead.
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Keepalive {
        Keepalive {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
        }
    }
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Nothing heard from the peer for the keepalive timeout.
    #[error("peer silent for {0:?}")]
    KeepaliveTimeout(Duration),
    /// The WebSocket failed.
    #[error("websocket: {0}")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
    /// The peer closed the WebSocket.
    #[error("closed by peer")]
    ClosedByPeer,
    /// This end shut the session down.
    #[error("shut down")]
    Shutdown,
}

impl Mux {
    /// Drives the session over `ws` until it ends (peer gone, protocol error, keepalive
    /// timeout, [`Mux::close`] or `shutdown`). Every stream fails when it returns.
    pub async fn run<S>(
        &self,
        ws: WebSocketStream<S>,
        keepalive: Keepalive,
        shutdown: CancellationToken,
    ) -> Result<(), MuxError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut sink, mut source) = ws.split();
        let shared = &self.shared;
        let mut last_heard = Instant::now();
        let mut ping = tokio::time::interval(keepalive.interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.reset();

        let reader = async {
            // One timer for the session, not one per message: when it fires, the deadline is
            // recomputed from the last message heard and the timer set again if that is later.
            let silence = tokio::time::sleep(keepalive.timeout);
            tokio::pin!(silence);
            loop {
                let message = tokio::select! {
                    message = source.next() => message,
                    () = &mut silence => {
                        let deadline = last_heard + keepalive.timeout;
                        if Instant::now() >= deadline {
                            return Err(MuxError::KeepaliveTimeout(keepalive.timeout));
                        }
                        silence.as_mut().reset(deadline);
                        continue;
                    }
                };
                last_heard = Instant::now();
                match message {
                    None => return Err(MuxError::ClosedByPeer),
                    Some(Err(error)) => return Err(error.into()),
                    Some(Ok(Message::Binary(bytes))) => {
                        shared.with(|state| {
                            for frame in Frame::decode_all(bytes) {
                                let frame = frame.map_err(|e| MuxError::Protocol(e.to_string()))?;
                                state
                                    .session
                                    .handle_frame(frame)
                                    .map_err(|e| MuxError::Protocol(e.to_string()))?;
                            }
                            Ok::<(), MuxError>(())
                        })?;
                    }
                    Some(Ok(Message::Close(_))) => return Err(MuxError::ClosedByPeer),
                    Some(Ok(Message::Text(_))) => {
                        return Err(MuxError::Protocol("text message".to_owned()))
                    }
                    // Pings are answered by tungstenite; pongs only prove liveness.
                    Some(Ok(_)) => {}
                }
            }
        };

        let writer = async {
            let mut buf = BytesMut::new();
            loop {
                let notified = shared.transmit.notified();
                if let Some(reason) = shared.closed_reason() {
                    // A last DATA and FIN queued before the close still go out, briefly.
                    let flush = send_queued(&mut sink, shared, &mut buf);
                    let _ = tokio::time::timeout(CLOSE_FLUSH, flush).await;
                    return Err::<(), _>((reason, true));
                }
                send_queued(&mut sink, shared, &mut buf)
                    .await
                    .map_err(|error| (error, false))?;
                tokio::select! {
                    // Queued frames go out before a ping or a shutdown.
                    biased;
                    () = notified => {}
                    _ = ping.tick() => {
                        if let Err(error) = sink.send(Message::Ping(Default::default())).await {
                            return Err((error.to_string(), false));
                        }
                    }
                    () = shutdown.cancelled() => {
                        // Frames queued before the shutdown (a last DATA and FIN) still go out.
                        let flush = send_queued(&mut sink, shared, &mut buf);
                        let _ = tokio::time::timeout(CLOSE_FLUSH, flush).await;
                        return Err(("shutting down".to_owned(), true));
                    }
                }
            }
        };

        let result = tokio::select! {
            result = reader => result,
            result = writer => match result {
                Ok(()) => Ok(()),
                Err((_, true)) => Err(MuxError::Shutdown),
                Err((reason, false)) => Err(MuxError::Protocol(format!("writing: {reason}"))),
            },
        };
        let reason = match &result {
            Ok(()) => "session ended".to_owned(),
            Err(error) => error.to_string(),
        };
        debug!(%reason, "session ending");
        shared.close(&reason);
        let code = match &result {
            Err(MuxError::Protocol(_)) => CloseCode::Protocol,
            Err(MuxError::Shutdown) => CloseCode::Away,
            _ => CloseCode::Normal,
        };
        if !matches!(result, Err(MuxError::ClosedByPeer | MuxError::WebSocket(_))) {
            let close = CloseFrame {
                code,
                reason: reason.chars().take(100).collect::<String>().into(),
            };
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                sink.send(Message::Close(Some(close))),
            )
            .await;
        }
        match result {
            Err(MuxError::Shutdown) | Err(MuxError::ClosedByPeer) => Ok(()),
            other => other,
        }
    }
}

/// Encodes every queued frame into messages of up to [`BATCH_BYTES`], writes and flushes them.
async fn send_queued<S>(
    sink: &mut futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    shared: &crate::shared::Shared,
    buf: &mut BytesMut,
) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut sent = false;
    loop {
        buf.reserve(BATCH_BYTES);
        let frames = shared.with(|state| state.session.encode_transmit(buf, BATCH_BYTES));
        if frames == 0 {
            break;
        }
        let message = Message::Binary(buf.split().freeze());
        sink.feed(message)
            .await
            .map_err(|error| error.to_string())?;
        sent = true;
    }
    if sent {
        sink.flush().await.map_err(|error| error.to_string())?;
    }
    Ok(())
}
