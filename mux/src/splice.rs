//! Splicing a socket to a stream: the data path of every tunnel.
//!
//! A tunnel's splice lives as long as the tunnel, and most tunnels are idle most of the time,
//! so [`Splice`] is a future written by hand rather than an `async fn`: an `async fn` keeps
//! every local live across an await (read buffers, timers, the futures it awaits) inside its
//! state for as long as it runs. Here an idle tunnel holds the socket, the stream and a few
//! flags; buffers exist only while bytes move.

use std::fmt;
use std::future::Future;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bridgehead_proto::frame::MAX_DATA_PAYLOAD;
pub use bridgehead_proto::session::SendWait;
use bridgehead_proto::ErrorCode;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::io::poll_read_buf;

use crate::memory::{EarnedBuffer, EarnedTotal};
use crate::stream::{MuxStream, StreamEnd};

/// Most chunks and bytes one vectored socket write carries.
const WRITE_BATCH_CHUNKS: usize = 16;
const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// Most bytes a read of a tunnel that is not streaming takes (into a buffer on the stack).
const IDLE_READ: usize = 512;
/// Most bytes a read of a streaming tunnel takes: its first read takes [`MAX_DATA_PAYLOAD`],
/// and each read that fills its buffer doubles the next, up to this. A bulk download reads
/// its target in a sixteenth of the calls a frame-sized read took, and the kernel sends the
/// target's window updates as seldom, which costs the server and agent less CPU per byte
/// (docs/benchmark-history.md, "reads that grow"). A tunnel whose reads come back short keeps
/// reading a frame's worth at most, so a trickle pins no large buffer.
const STREAMING_READ: usize = 1024 * 1024;

/// Bytes moved by a finished splice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// From the socket into the stream.
    pub up: u64,
    /// From the stream into the socket.
    pub down: u64,
}

/// Told of bytes as a splice moves them (metrics that count bytes as they flow, not when a
/// tunnel ends: a long `kubectl logs -f` shows up while it runs).
pub trait Meter: Sync {
    /// `up` more bytes went from the socket into the stream, `down` more the other way.
    fn moved(&self, up: u64, down: u64);

    /// The socket had bytes for the stream and the stream could take none: told once when
    /// such a wait begins, with what it waits for.
    fn waited(&self, _why: SendWait) {}
}

/// Why a splice ended abnormally. The stream has been reset; the socket should be closed with
/// a TCP RST so the client sees the failure.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    /// The other end reset the stream.
    #[error(transparent)]
    Stream(#[from] StreamEnd),
    /// Reading or writing the local socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
}

/// Copies bytes both ways between `socket` and `stream` until both directions ended. A socket
/// EOF becomes FIN on the stream and the peer's FIN shuts the socket's write side, so each
/// direction ends on its own. `initial` holds bytes already read from the socket (a CONNECT
/// client's behind its request head, say); they go first. On error the stream is reset (and the caller should end the socket
/// with [`TunnelSocket::abort_on_close`]). `moved` holds the byte counts when it returns.
pub fn splice<'a, S>(
    socket: S,
    stream: &'a MuxStream,
    initial: Bytes,
    moved: &'a mut Moved,
) -> Splice<'a, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    splice_inner(socket, stream, initial, moved, None)
}

/// [`splice`], telling `meter` of the bytes as they move.
pub fn splice_metered<'a, S>(
    socket: S,
    stream: &'a MuxStream,
    initial: Bytes,
    moved: &'a mut Moved,
    meter: &'a dyn Meter,
) -> Splice<'a, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    splice_inner(socket, stream, initial, moved, Some(meter))
}

fn splice_inner<'a, S>(
    socket: S,
    stream: &'a MuxStream,
    initial: Bytes,
    moved: &'a mut Moved,
    meter: Option<&'a dyn Meter>,
) -> Splice<'a, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    moved.up += initial.len() as u64;
    if let Some(meter) = meter {
        meter.moved(initial.len() as u64, 0);
    }
    // An empty `initial` may still pin the HTTP layer's read buffer: let it go now.
    let pending = if initial.is_empty() {
        Bytes::new()
    } else {
        initial
    };
    Splice {
        socket,
        stream,
        moved,
        meter,
        receive: None,
        send: None,
        up: Uplink {
            pending,
            big: BytesMut::new(),
            streaming: false,
            read_size: MAX_DATA_PAYLOAD as u32,
            done: false,
            waiting: false,
        },
        down: Downlink {
            head: Bytes::new(),
            rest: Vec::new(),
            unflushed: false,
            eof: false,
            written: 0,
            sent: 0,
            done: false,
        },
        read_ready: None,
    }
}

/// What a tunnel's owner and its splice ask of the socket beyond reading and writing.
pub trait TunnelSocket {
    /// Makes the socket's close a reset (`SO_LINGER` zero), so that the peer sees a failed
    /// tunnel as a failure and not as a clean end of data. Sockets without resets (Unix
    /// sockets) do nothing: their close is the only end there is.
    fn abort_on_close(&self);

    /// Sets the kernel receive buffer to `bytes` as the tunnel earns it ([`Splice::earning`]),
    /// where that buffer holds what this end has not read: a TCP socket's. A Unix socket has
    /// none (what its server has not read waits in its client's send buffer) and answers
    /// [`io::ErrorKind::Unsupported`]: its tunnel earns nothing.
    fn set_receive_buffer(&self, bytes: u32) -> io::Result<()>;

    /// Sets the kernel send buffer to `bytes` as the tunnel earns it, where that buffer holds
    /// what the peer has not read: a Unix socket's. A TCP socket does nothing: its unsent
    /// bytes are bounded by `TCP_NOTSENT_LOWAT`, and its buffer autotunes with the link.
    fn set_send_buffer(&self, bytes: u32) -> io::Result<()>;

    /// Ready when a read may find bytes (or the end); `Pending`, with `cx` to be woken when
    /// that changes, when a read would find nothing. A splice set to ask
    /// ([`Splice::reading_when_ready`]) does so before it asks the session for credit, which
    /// takes the session's lock: a wake-up for the other direction then costs the uplink no
    /// lock. The default is `Ready` (a read is tried).
    fn poll_read_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl TunnelSocket for TcpStream {
    fn abort_on_close(&self) {
        let _ = self.set_zero_linger();
    }

    fn set_receive_buffer(&self, bytes: u32) -> io::Result<()> {
        socket2::SockRef::from(self).set_recv_buffer_size(bytes as usize)
    }

    fn set_send_buffer(&self, _bytes: u32) -> io::Result<()> {
        Ok(())
    }

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }
}

impl TunnelSocket for UnixStream {
    fn abort_on_close(&self) {}

    fn set_receive_buffer(&self, _bytes: u32) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    fn set_send_buffer(&self, bytes: u32) -> io::Result<()> {
        socket2::SockRef::from(self).set_send_buffer_size(bytes as usize)
    }

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        UnixStream::poll_read_ready(self, cx)
    }
}

impl<T: TunnelSocket + ?Sized> TunnelSocket for Box<T> {
    fn abort_on_close(&self) {
        (**self).abort_on_close();
    }

    fn set_receive_buffer(&self, bytes: u32) -> io::Result<()> {
        (**self).set_receive_buffer(bytes)
    }

    fn set_send_buffer(&self, bytes: u32) -> io::Result<()> {
        (**self).set_send_buffer(bytes)
    }

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (**self).poll_read_ready(cx)
    }
}

impl<T: TunnelSocket + ?Sized> TunnelSocket for &mut T {
    fn abort_on_close(&self) {
        (**self).abort_on_close();
    }

    fn set_receive_buffer(&self, bytes: u32) -> io::Result<()> {
        (**self).set_receive_buffer(bytes)
    }

    fn set_send_buffer(&self, bytes: u32) -> io::Result<()> {
        (**self).set_send_buffer(bytes)
    }

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (**self).poll_read_ready(cx)
    }
}

/// The future [`splice`] returns.
#[must_use = "futures do nothing unless polled"]
pub struct Splice<'a, S> {
    socket: S,
    stream: &'a MuxStream,
    moved: &'a mut Moved,
    meter: Option<&'a dyn Meter>,
    /// The socket's receive buffer as the tunnel earns it by reading ([`Splice::earning`]).
    receive: Option<Earning<'a, S>>,
    /// The socket's send buffer as the tunnel earns it by writing.
    send: Option<Earning<'a, S>>,
    up: Uplink,
    down: Downlink,
    /// Asks the socket whether a read would find anything before asking the session for
    /// credit ([`Splice::reading_when_ready`]).
    read_ready: Option<ReadReady<S>>,
}

/// [`TunnelSocket::poll_read_ready`] of a splice's socket type.
type ReadReady<S> = fn(&mut S, &mut Context<'_>) -> Poll<io::Result<()>>;

/// Where a splice's socket stands in earning one of its buffers.
struct Earning<'a, S> {
    policy: EarnedBuffer,
    /// The buffer the socket has now.
    size: u32,
    /// Sets the socket's buffer ([`TunnelSocket::set_receive_buffer`] or
    /// [`TunnelSocket::set_send_buffer`]).
    set: fn(&S, u32) -> io::Result<()>,
    /// Where what the socket earned beyond its start is taken from, and given back to when
    /// the splice ends.
    total: Option<&'a EarnedTotal>,
}

impl<'a, S> Earning<'a, S> {
    /// Earning by `policy`, the socket's buffer set by `set`; `None` without a policy, or with
    /// one that leaves nothing to earn.
    fn new(policy: Option<EarnedBuffer>, set: fn(&S, u32) -> io::Result<()>) -> Option<Self> {
        let policy = policy.filter(|p| p.max > p.start)?;
        Some(Earning {
            policy,
            size: policy.start,
            set,
            total: None,
        })
    }

    /// Gives `socket` the buffer `moved` bytes earned, if that is larger than its own, as far
    /// as the total has room: one doubling at a time.
    fn grow(&mut self, socket: &S, moved: u64) {
        // Once at the largest, every later read or write costs one comparison.
        if self.size >= self.policy.max {
            return;
        }
        let earned = self.policy.size(moved);
        let mut size = self.size;
        while size < earned {
            let next = size.saturating_mul(2).min(earned);
            if self
                .total
                .is_some_and(|total| !total.take(u64::from(next - size)))
            {
                break;
            }
            size = next;
        }
        if size > self.size {
            // A socket that refuses keeps the buffer it has, and is not asked again: slower,
            // never wrong.
            if let Err(error) = (self.set)(socket, size) {
                // (A Unix socket has no receive buffer: nothing to say.)
                if error.kind() != io::ErrorKind::Unsupported {
                    tracing::debug!(%error, size, "growing a tunnel socket's buffer");
                }
                if let Some(total) = self.total {
                    total.give(u64::from(size - self.size));
                }
                self.policy.max = self.size;
                return;
            }
            self.size = size;
        }
    }
}

impl<S> Drop for Earning<'_, S> {
    fn drop(&mut self) {
        if let Some(total) = self.total {
            total.give(u64::from(self.size - self.policy.start));
        }
    }
}

/// Socket to stream, reading only as much as the stream's credit allows.
///
/// A read of an idle tunnel goes into a small buffer on the stack, which is copied out; only
/// a read that fills it switches to large reads into `big`, which is let go as soon as a read
/// is small or finds nothing, so idle tunnels hold no read buffers.
#[derive(Debug)]
struct Uplink {
    /// Bytes taken from the socket (or the client's early bytes) that the stream has not
    /// accepted yet.
    pending: Bytes,
    /// The read buffer of a streaming uplink; empty and unallocated otherwise.
    big: BytesMut,
    /// The last read filled its buffer: more is likely waiting.
    streaming: bool,
    /// What the next streaming read takes at most ([`STREAMING_READ`]).
    read_size: u32,
    /// The socket reached EOF and the stream was finished.
    done: bool,
    /// The stream has taken none of the socket's bytes since the last poll that found it
    /// without credit ([`Meter::waited`] was told).
    waiting: bool,
}

/// Stream to socket; the peer's FIN shuts the socket's write side. Chunks that are already
/// buffered when one arrives go out with it in one vectored write.
#[derive(Debug)]
struct Downlink {
    /// The chunk being written.
    head: Bytes,
    /// The chunks of a burst behind `head`; unallocated between bursts.
    rest: Vec<Bytes>,
    /// Bytes were written since the last completed flush.
    unflushed: bool,
    /// The peer finished: shut the socket's write side once everything is written.
    eof: bool,
    /// Bytes the socket took since the stream was last told.
    written: usize,
    /// Bytes the socket took in all: what it earns its send buffer with.
    sent: u64,
    /// The socket's write side is shut.
    done: bool,
}

impl<S> fmt::Debug for Splice<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Splice")
            .field("stream", &self.stream)
            .field("moved", &self.moved)
            .field("receive_buffer", &self.receive.as_ref().map(|e| e.size))
            .field("send_buffer", &self.send.as_ref().map(|e| e.size))
            .field("up", &self.up)
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

impl<'a, S: TunnelSocket> Splice<'a, S> {
    /// Grows the socket's receive buffer as the tunnel reads and its send buffer as the
    /// tunnel writes, each from its policy's `start` (which the socket must already have) to
    /// its `max`, as far as the socket has such a buffer ([`TunnelSocket`]); `None` leaves a
    /// buffer alone.
    pub fn earning(self, receive: Option<EarnedBuffer>, send: Option<EarnedBuffer>) -> Self {
        self.earning_within(receive, send, None)
    }

    /// [`Splice::earning`], what the receive buffer earns beyond its start taken from `total`
    /// (and given back when the splice ends).
    pub fn earning_within(
        mut self,
        receive: Option<EarnedBuffer>,
        send: Option<EarnedBuffer>,
        total: Option<&'a EarnedTotal>,
    ) -> Self {
        self.receive = Earning::new(receive, |socket: &S, bytes| {
            socket.set_receive_buffer(bytes)
        });
        if let Some(earn) = &mut self.receive {
            earn.total = total;
        }
        self.send = Earning::new(send, |socket: &S, bytes| socket.set_send_buffer(bytes));
        // Bytes handed in ahead of the socket's own count as read.
        if let Some(earn) = &mut self.receive {
            earn.grow(&self.socket, self.moved.up);
        }
        self
    }

    /// The uplink waits for the socket to be readable ([`TunnelSocket::poll_read_ready`])
    /// before it asks the session for credit. Without it every wake-up of the splice, most of
    /// them for the downlink (a chunk arrived, the socket took bytes), takes the session's lock
    /// for the uplink's credit and then finds the socket empty: two of the three such lookups a
    /// round trip made in each process.
    pub fn reading_when_ready(mut self) -> Self {
        self.read_ready = Some(|socket: &mut S, cx| socket.poll_read_ready(cx));
        self
    }
}

impl<S> Future for Splice<'_, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    type Output = Result<(), SpliceError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // The uplink goes first: a socket whose writes wait for its reads (the frontend's
        // hold) may then write in the same poll.
        let result = match this.poll_up(cx).and_then(|()| this.poll_down(cx)) {
            Ok(()) if this.up.done && this.down.done => Ok(()),
            Ok(()) => return Poll::Pending,
            Err(error) => Err(error),
        };
        if let Err(error) = &result {
            let (code, reason) = match error {
                SpliceError::Stream(end) => (end.code, end.reason.clone()),
                SpliceError::Io(io) => (ErrorCode::ConnectionReset, io.to_string()),
            };
            this.stream.reset(code, &reason);
        }
        Poll::Ready(result)
    }
}

impl<S> Splice<'_, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// Moves socket bytes into the stream until the socket or the stream's credit has nothing
    /// more for now, or the uplink is done.
    fn poll_up(&mut self, cx: &mut Context<'_>) -> Result<(), SpliceError> {
        while !self.up.done {
            if !self.up.pending.is_empty() {
                let before = self.up.pending.len();
                // A streaming socket has more to read: its frames wait for the writer, which
                // batches them; a short read (an interactive exchange) goes out at once.
                self.stream.send(&mut self.up.pending, !self.up.streaming)?;
                if self.up.pending.len() < before {
                    self.up.waiting = false;
                }
                if !self.up.pending.is_empty() && self.stream.poll_writable(cx)?.is_pending() {
                    self.wait_begins();
                    return Ok(());
                }
                continue;
            }
            if let Some(ready) = self.read_ready {
                if ready(&mut self.socket, cx)?.is_pending() {
                    // Drained: wait without the read buffer, as a read that found nothing would.
                    self.up.streaming = false;
                    self.up.big = BytesMut::new();
                    return Ok(());
                }
            }
            let Poll::Ready(credit) = self.stream.poll_writable(cx)? else {
                // Waiting for credit, perhaps for long (the peer's reader stalled): without
                // the read buffer.
                self.up.big = BytesMut::new();
                self.wait_begins();
                return Ok(());
            };
            self.up.waiting = false;
            let Poll::Ready(chunk) = self.up.poll_read(&mut self.socket, cx, credit)? else {
                return Ok(());
            };
            if chunk.is_empty() {
                self.stream.finish()?;
                self.up.done = true;
            } else {
                self.moved.up += chunk.len() as u64;
                if let Some(meter) = self.meter {
                    meter.moved(chunk.len() as u64, 0);
                }
                self.up.pending = chunk;
                if let Some(earn) = &mut self.receive {
                    earn.grow(&self.socket, self.moved.up);
                }
            }
        }
        Ok(())
    }

    /// The uplink found no credit: the meter learns what it waits for, once per wait (a task
    /// woken for the downlink polls the uplink too).
    fn wait_begins(&mut self) {
        let Some(meter) = self.meter else {
            return;
        };
        if std::mem::replace(&mut self.up.waiting, true) {
            return;
        }
        if let Some(why) = self.stream.send_wait() {
            meter.waited(why);
        }
    }

    /// Moves stream chunks into the socket until the stream or the socket has nothing more for
    /// now, or the downlink is done.
    fn poll_down(&mut self, cx: &mut Context<'_>) -> Result<(), SpliceError> {
        while !self.down.done {
            let written = self.down.poll_write(&mut self.socket, cx);
            let took = std::mem::take(&mut self.down.written);
            self.stream.release(took);
            self.down.sent += took as u64;
            if let Some(earn) = self.send.as_mut().filter(|_| took > 0) {
                earn.grow(&self.socket, self.down.sent);
            }
            if written?.is_pending() {
                return Ok(());
            }
            if self.down.eof {
                if Pin::new(&mut self.socket).poll_shutdown(cx)?.is_pending() {
                    return Ok(());
                }
                self.down.done = true;
                break;
            }
            // Chunks are held, not read: until the socket took their bytes they stay in the
            // stream's window and the memory budget, so a socket that stopped taking them
            // stops the peer instead of piling up here.
            let Poll::Ready(chunk) = self.stream.poll_read_held(cx)? else {
                // Nothing more for now. A socket may still hold written bytes: a TLS stream
                // whose TCP socket was full keeps its last records until a flush, and without
                // one they would wait for the next chunk, which may never come.
                if self.down.unflushed && Pin::new(&mut self.socket).poll_flush(cx)?.is_ready() {
                    self.down.unflushed = false;
                }
                return Ok(());
            };
            self.down.unflushed = true;
            let Some(first) = chunk else {
                self.down.eof = true;
                continue;
            };
            let mut size = first.len();
            // A burst: the chunks already buffered go out with this one.
            while self.down.rest.len() + 1 < WRITE_BATCH_CHUNKS && size < WRITE_BATCH_BYTES {
                let Some(chunk) = self.stream.try_read_held() else {
                    break;
                };
                size += chunk.len();
                self.down.rest.reserve_exact(WRITE_BATCH_CHUNKS - 1);
                self.down.rest.push(chunk);
            }
            self.moved.down += size as u64;
            if let Some(meter) = self.meter {
                meter.moved(0, size as u64);
            }

            self.down.head = first;
        }
        Ok(())
    }
}

impl Uplink {
    /// Reads at most `credit` bytes; an empty chunk is EOF.
    fn poll_read<S: AsyncRead + Unpin>(
        &mut self,
        socket: &mut S,
        cx: &mut Context<'_>,
        credit: usize,
    ) -> Poll<io::Result<Bytes>> {
        if self.streaming {
            let want = credit.min(self.read_size as usize);
            self.big.reserve(want);
            let read = poll_read_buf(Pin::new(socket), cx, &mut (&mut self.big).limit(want));
            let Poll::Ready(n) = read? else {
                // Drained after all: wait without the buffer.
                self.streaming = false;
                self.big = BytesMut::new();
                return Poll::Pending;
            };
            // Sources that return whole records (TLS) seldom fill the buffer exactly: keep
            // streaming while reads are large, so a burst is not read through the small
            // buffer every other time.
            self.streaming = n > IDLE_READ;
            self.read_size = if n == self.read_size as usize {
                (self.read_size * 2).min(STREAMING_READ as u32)
            } else if n < want {
                // Drained: the next burst starts small again.
                MAX_DATA_PAYLOAD as u32
            } else {
                // Held to the credit: what the socket has is not known.
                self.read_size
            };
            let chunk = self.big.split().freeze();
            if !self.streaming {
                self.big = BytesMut::new();
            }
            Poll::Ready(Ok(chunk))
        } else {
            let want = credit.min(IDLE_READ);
            let mut small = [MaybeUninit::<u8>::uninit(); IDLE_READ];
            let mut buf = ReadBuf::uninit(&mut small[..want]);
            ready!(Pin::new(socket).poll_read(cx, &mut buf))?;
            self.streaming = buf.filled().len() == want;
            // A burst begins: its reads start at a frame's worth.
            self.read_size = MAX_DATA_PAYLOAD as u32;
            Poll::Ready(Ok(Bytes::copy_from_slice(buf.filled())))
        }
    }
}

impl Downlink {
    /// Writes `head` and `rest`, in as few calls as the socket allows.
    fn poll_write<S: AsyncWrite + Unpin>(
        &mut self,
        socket: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.head.is_empty() {
                if self.rest.is_empty() {
                    // Let go of the buffers the chunks were cut from, and of the burst's list.
                    self.head = Bytes::new();
                    self.rest = Vec::new();
                    return Poll::Ready(Ok(()));
                }
                self.head = self.rest.remove(0);
                continue;
            }
            let socket = Pin::new(&mut *socket);
            let written = if self.rest.is_empty() {
                ready!(socket.poll_write(cx, &self.head))?
            } else {
                let mut slices = [IoSlice::new(&[]); WRITE_BATCH_CHUNKS];
                slices[0] = IoSlice::new(&self.head);
                for (slice, chunk) in slices[1..].iter_mut().zip(&self.rest) {
                    *slice = IoSlice::new(chunk);
                }
                let count = (1 + self.rest.len()).min(WRITE_BATCH_CHUNKS);
                ready!(socket.poll_write_vectored(cx, &slices[..count]))?
            };
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += written;
            self.consume(written);
        }
    }

    /// Drops the first `written` bytes of `head` and `rest`.
    fn consume(&mut self, mut written: usize) {
        while written > 0 {
            if written < self.head.len() {
                self.head.advance(written);
                return;
            }
            written -= self.head.len();
            self.head = if self.rest.is_empty() {
                Bytes::new()
            } else {
                self.rest.remove(0)
            };
        }
    }
}

#[cfg(test)]
mod tests;
