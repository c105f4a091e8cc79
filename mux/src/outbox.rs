//! A session's sending side: the WebSocket's writing half and the message in flight.
//!
//! The driver keeps it behind a lock of its own, beside the session's state, so that whichever
//! task finds it free sends: the driver's task, or a stream's task that just queued frames
//! ([`crate::driver::Driver::with_sending`]). Whoever takes it carries on where the last one
//! left off.

use std::io;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bridgehead_proto::session::Session;
use bridgehead_proto::Frame;
use tokio::io::AsyncWrite;

use crate::websocket::{Message, Writer, WsError, PING, PONG};

/// The writer batches frames into messages of about this size.
const BATCH_BYTES: usize = 256 * 1024;
/// The TLS records a session's connection may hold that its socket has not taken yet
/// (`rustls::ConnectionCommon::set_buffer_limit`; rustls' default is 64 KiB): room for a whole
/// message, which then goes to the socket in one write instead of four (the CPU it saves per
/// GiB is in docs/benchmarks.md). It is per session, not per tunnel: a session whose peer
/// stopped reading holds at most this beyond what its kernel socket holds.
pub const SESSION_TLS_BUFFER: usize = 2 * BATCH_BYTES;
/// DATA payloads this large or larger go out from where they lie instead of being copied into
/// the message (a vectored write); smaller ones cost less copied than as a slice of their own.
const SPLICE_MIN: usize = 512;
/// The writer's message buffer: frame headers and small frames of a batch. Kept for the
/// session's life and reused for every message; a batch of small frames that outgrows it
/// grows it.
const MESSAGE_BUFFER: usize = 16 * 1024;

/// The WebSocket's writing half, type-erased: the session's state does not name its transport.
pub(crate) type Sink = Box<dyn AsyncWrite + Send + Unpin>;

/// See the module documentation.
pub(crate) struct Outbox {
    sink: Writer<Sink>,
    /// The message being sent or assembled ([`MESSAGE_BUFFER`]).
    message: Message,
    /// Bytes of `message` written, while it is in flight.
    in_flight: Option<usize>,
    /// The last batch left frames queued: take the next once the message is out.
    more: bool,
    /// Control frames waiting, and how much of them is written.
    control: Vec<u8>,
    control_written: usize,
    /// Bytes were written since the last flush.
    unflushed: bool,
    /// A close frame is queued: no message follows it.
    closing: bool,
    failed: Option<Arc<WsError>>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("in_flight", &self.in_flight)
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

impl Outbox {
    pub(crate) fn new(sink: Writer<Sink>) -> Outbox {
        Outbox {
            sink,
            message: Message::default(),
            in_flight: None,
            more: false,
            control: Vec::new(),
            control_written: 0,
            unflushed: false,
            closing: false,
            failed: None,
        }
    }

    /// Sends the control frames and the message in flight, then, with `look` (or while the
    /// last batch left frames behind), every frame `batch` takes off the session, and flushes;
    /// ready once all of it is written. The transport wakes `cx` when it takes more. An error
    /// stays: every later call returns it.
    ///
    /// `batch` locks the session and runs [`encode_batch`] on it.
    pub(crate) fn poll_transmit(
        &mut self,
        cx: &mut Context<'_>,
        look: bool,
        batch: impl FnMut(&mut Message) -> (usize, bool),
    ) -> Poll<Result<(), Arc<WsError>>> {
        if let Some(error) = &self.failed {
            return Poll::Ready(Err(error.clone()));
        }
        self.more |= look;
        match ready!(self.poll_send(cx, batch)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(error) => {
                let error = Arc::new(WsError::from(error));
                self.failed = Some(error.clone());
                Poll::Ready(Err(error))
            }
        }
    }

    /// A ping goes out next, between messages.
    pub(crate) fn ping(&mut self) {
        self.sink.control(&mut self.control, PING, &[]);
    }

    /// A pong answering a ping with `payload` goes out next, between messages.
    pub(crate) fn pong(&mut self, payload: &[u8]) {
        self.sink.control(&mut self.control, PONG, payload);
    }

    /// A close frame goes out next; no message follows it.
    pub(crate) fn close(&mut self, code: u16, reason: &str) {
        self.sink.close(&mut self.control, code, reason);
        self.closing = true;
    }

    /// Encodes queued frames into messages of up to [`BATCH_BYTES`] and writes them.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        mut batch: impl FnMut(&mut Message) -> (usize, bool),
    ) -> Poll<io::Result<()>> {
        loop {
            if let Some(written) = &mut self.in_flight {
                ready!(self.sink.poll_write_message(cx, &self.message, written))?;
                self.in_flight = None;
                self.unflushed = true;
                continue;
            }
            // Control frames go between messages, never into one.
            if self.control_written < self.control.len() {
                ready!(self
                    .sink
                    .poll_write_bytes(cx, &self.control, &mut self.control_written))?;
                self.control.clear();
                self.control_written = 0;
                self.unflushed = true;
                continue;
            }
            if !self.more || self.closing {
                break;
            }
            self.message.clear(MESSAGE_BUFFER);
            let (frames, more) = batch(&mut self.message);
            // Frames queued while this message goes out wake the writer, or are sent by
            // whoever queued them: no second look under the lock that would find the queue
            // empty.
            self.more = more;
            if frames == 0 {
                break;
            }
            self.sink.seal(&mut self.message);
            self.in_flight = Some(0);
        }
        if self.unflushed {
            ready!(self.sink.poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}

/// Takes the next batch of `session`'s queued frames into `message`: up to [`BATCH_BYTES`],
/// DATA of one stream ([`Session::transmit_batch`]). DATA payloads of [`SPLICE_MIN`] bytes or
/// more are not copied into the message: they go out from the buffer the splice read them
/// into. One stream to a message is for the receiving end's memory: there a message's payloads
/// are handed on as slices of the buffer it was read into, and one chunk held for a client that
/// stopped reading keeps the whole buffer, which then holds only that tunnel's bytes (small
/// payloads are copied out, `crate::driver`). Returns the frames taken and whether more wait.
pub(crate) fn encode_batch(session: &mut Session, message: &mut Message) -> (usize, bool) {
    let frames = session.transmit_batch(BATCH_BYTES, |frame| match frame {
        Frame::Data { ref payload, .. } if payload.len() >= SPLICE_MIN => {
            frame.encode_header(message.bytes());
            if let Frame::Data { payload, .. } = frame {
                message.splice(payload);
            }
        }
        frame => frame.encode(message.bytes()),
    });
    (frames, session.has_transmit())
}
