//! TLS for CONNECT clients on rustls' unbuffered API.
//!
//! Every idle tunnel holds one client TLS connection, so what a connection keeps while idle is
//! what 10,000 idle tunnels cost. rustls' buffered `ServerConnection` keeps a 4 KiB
//! incoming-record buffer for the connection's whole life. Here the stream owns its record
//! buffers and lets each go as soon as it is empty: an idle connection holds only rustls'
//! state (keys and the handshake's leftovers). Busy connections read up to [`READ_SIZE`] bytes
//! per syscall, several records at a time.
//!
//! Semantics follow tokio-rustls, which the agent endpoint still uses: `poll_write` encrypts
//! and sends what the socket takes, keeping the rest for the next write or flush; `shutdown`
//! sends `close_notify` and then shuts the TCP write side; the peer's `close_notify` is EOF,
//! while a TCP EOF without it is an `UnexpectedEof` error (the data may be truncated).

use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bridgehead_proto::budget::Budget;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, InsufficientSizeError};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::io::poll_read_buf;

/// Most bytes one socket read takes: four full records.
const READ_SIZE: usize = 64 * 1024;
/// Room a read needs at least: one whole record (16 KiB payload, expansion, header).
const RECORD_ROOM: usize = 16 * 1024 + 256 + 5;
/// Plaintext encrypted per `poll_write` at most; more waits for the socket to take some.
const WRITE_SIZE: usize = 64 * 1024;
/// Per-record expansion of TLS 1.3 AES-GCM (header, content type, tag); a first guess at the
/// output size, corrected by rustls' `InsufficientSize` when it is wrong.
const RECORD_OVERHEAD: usize = 5 + 1 + 16;
const MAX_FRAGMENT: usize = 16 * 1024;

thread_local! {
    /// The records one write encrypts, before its socket takes them (one buffer per thread:
    /// the tunnels of a worker take turns). A stream keeps in `outgoing` only what its socket
    /// did not take; a reading client's records never need a buffer of their own, which
    /// each write would otherwise allocate and zero.
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            buf: Vec::new(),
            end: 0,
        })
    };
    /// A read buffer given back by a connection whose socket ran dry, for the next connection
    /// on this thread that reads. Without it, every wake-up of a connection that is idle
    /// between messages (a round trip, a watch) allocated and freed 64 KiB: past the
    /// allocator's thread cache, about 4 k instructions, a ninth of what a 64-byte round
    /// trip costs the server. At most one per thread, and empty: idle connections still hold
    /// no read buffer of their own.
    static SPARE_READ: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Records encrypted for one write: `buf[..end]`. `buf` keeps its length (all of it
/// initialized) between writes, so a write zeroes nothing it did not need before.
struct Scratch {
    buf: Vec<u8>,
    end: usize,
}

impl TlsStream {
    /// Runs the server's side of the handshake on `io` with `config`. A failed handshake sends
    /// the peer rustls' alert before the error is returned.
    pub async fn accept(config: Arc<ServerConfig>, io: TcpStream) -> io::Result<TlsStream> {
        let conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
        let mut stream = TlsStream {
            io,
            conn,
            incoming: Incoming::default(),
            plaintext: Pending::default(),
            outgoing: Pending::default(),
            read_eof: false,
            io_eof: false,
            write_closed: false,
            counted: Counted::default(),
        };
        match stream.handshake().await {
            Ok(()) => Ok(stream),
            Err(error) => {
                stream.send_alert().await;
                Err(error)
            }
        }
    }
}

/// A server-side TLS connection over TCP whose buffers are released while empty. Its socket
/// is a tokio one but while it moves between runtimes ([`TlsStream::detach`]).
pub struct TlsStream<IO = TcpStream> {
    io: IO,
    conn: UnbufferedServerConnection,
    incoming: Incoming,
    plaintext: Pending,
    outgoing: Pending,
    /// The peer's `close_notify` was processed: reads return EOF once `plaintext` is empty.
    read_eof: bool,
    /// The socket returned EOF.
    io_eof: bool,
    /// Our `close_notify` is queued: no more writes.
    write_closed: bool,
    /// Where the records in `outgoing` count as tunnel data held ([`TlsStream::count_against`]).
    counted: Counted,
}

/// The bytes of a stream's `outgoing` buffer counted in a budget now; given back when the
/// stream goes.
#[derive(Default)]
struct Counted {
    budget: Option<Budget>,
    bytes: usize,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release(self.bytes as u64);
        }
    }
}

/// A [`TlsStream`] taken off its runtime's reactor, to be registered with another's.
pub(super) type DetachedTls = TlsStream<std::net::TcpStream>;

impl<IO> TlsStream<IO> {
    fn map_io<T>(self, f: impl FnOnce(IO) -> io::Result<T>) -> io::Result<TlsStream<T>> {
        let TlsStream {
            io,
            conn,
            incoming,
            plaintext,
            outgoing,
            read_eof,
            io_eof,
            write_closed,
            counted,
        } = self;
        Ok(TlsStream {
            io: f(io)?,
            conn,
            incoming,
            plaintext,
            outgoing,
            read_eof,
            io_eof,
            write_closed,
            counted,
        })
    }
}

impl TlsStream {
    /// The stream with its socket taken off this runtime's reactor (the TLS state, buffers
    /// and budget count go along), for [`TlsStream::attach`] on another runtime.
    pub fn detach(self) -> io::Result<DetachedTls> {
        self.map_io(TcpStream::into_std)
    }

    /// A detached stream, its socket registered with the current runtime's reactor.
    pub fn attach(detached: DetachedTls) -> io::Result<TlsStream> {
        detached.map_io(TcpStream::from_std)
    }
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("io", &self.io)
            .field("incoming", &self.incoming.unprocessed().len())
            .field("plaintext", &self.plaintext.len())
            .field("outgoing", &self.outgoing.len())
            .finish_non_exhaustive()
    }
}

/// What one call into rustls led to.
enum Step {
    /// Progress that needs no socket I/O: call again.
    Again,
    /// Application data was delivered (or stashed in `plaintext`).
    Data,
    /// The write callback ran.
    Wrote,
    /// No complete record left: read more from the socket.
    NeedData,
    /// The peer's `close_notify` (reported once).
    PeerClosed,
    /// Both sides sent `close_notify`.
    Closed,
}

/// Received ciphertext: `buf[start..]` is not yet processed.
#[derive(Default)]
struct Incoming {
    buf: Vec<u8>,
    start: usize,
}

impl Incoming {
    fn unprocessed(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn unprocessed_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..]
    }

    fn discard(&mut self, n: usize) {
        self.start += n;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
    }

    /// Makes room for one more socket read, moving a partial record to the front if needed.
    fn prepare_read(&mut self) {
        if self.buf.capacity() == 0 {
            self.buf = SPARE_READ.take();
        }
        if self.buf.capacity() - self.buf.len() >= RECORD_ROOM {
            return;
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf
            .reserve(READ_SIZE.max(RECORD_ROOM + self.buf.len()) - self.buf.len());
    }

    /// Called when the socket has nothing more for now.
    fn release_if_empty(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            let buf = std::mem::take(&mut self.buf);
            // One grown past a read's size (a partial record at its end) is not kept.
            if buf.capacity() <= 2 * READ_SIZE {
                SPARE_READ.set(buf);
            }
        }
    }
}

/// Bytes waiting to be taken, `buf[pos..]`: decrypted bytes the reader has not taken yet (a
/// record larger than its buffer), or encrypted bytes the socket has not taken yet. The
/// buffer is released as soon as everything was taken.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    pos: usize,
}

impl Pending {
    fn len(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn consumed(&mut self, n: usize) {
        self.pos += n;
        if self.pos == self.buf.len() {
            self.buf = Vec::new();
            self.pos = 0;
        }
    }

    /// Lets go of room beyond what still waits, when that is most of the buffer: a buffer
    /// sized for a whole write, kept for the few records its socket did not take, is what a
    /// client that stopped reading would otherwise hold.
    fn compact(&mut self) {
        if self.buf.capacity() > 2 * self.len() {
            self.buf = self.bytes().to_vec();
            self.pos = 0;
        }
    }

    /// Copies what fits into `out`.
    fn take_into(&mut self, out: &mut ReadBuf<'_>) {
        let n = self.len().min(out.remaining());
        out.put_slice(&self.bytes()[..n]);
        self.consumed(n);
    }

    /// Appends what `encode` writes into a slice of the size it asks for.
    fn append<E>(
        &mut self,
        guess: usize,
        encode: impl FnMut(&mut [u8]) -> Result<usize, E>,
        too_small: impl Fn(&E) -> Option<usize>,
    ) -> Result<(), E> {
        let at = self.buf.len();
        let end = encode_at(&mut self.buf, at, guess, encode, too_small);
        self.buf.truncate(*end.as_ref().unwrap_or(&at));
        end.map(|_| ())
    }
}

/// Runs `encode` on `buf[at..]`, grown (zero-filled) to at least `guess` bytes, or to what
/// `encode` says it needs; returns where what it wrote ends. `buf` may end up longer.
fn encode_at<E>(
    buf: &mut Vec<u8>,
    at: usize,
    guess: usize,
    mut encode: impl FnMut(&mut [u8]) -> Result<usize, E>,
    too_small: impl Fn(&E) -> Option<usize>,
) -> Result<usize, E> {
    let mut size = guess;
    loop {
        if buf.len() < at + size {
            buf.resize(at + size, 0);
        }
        match encode(&mut buf[at..]) {
            Ok(n) => return Ok(at + n),
            Err(error) => match too_small(&error) {
                Some(required) if required > buf.len() - at => size = required,
                _ => return Err(error),
            },
        }
    }
}

fn tls_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

fn encode_too_small(error: &EncodeError) -> Option<usize> {
    match error {
        EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => {
            Some(*required_size)
        }
        _ => None,
    }
}

fn encrypt_too_small(error: &EncryptError) -> Option<usize> {
    match error {
        EncryptError::InsufficientSize(InsufficientSizeError { required_size }) => {
            Some(*required_size)
        }
        _ => None,
    }
}

fn encrypt_error(error: EncryptError) -> io::Error {
    io::Error::other(error.to_string())
}

impl TlsStream {
    /// One call into rustls, with every state but "may write" handled. Decrypted data goes
    /// into `out` as far as it fits, the rest into `plaintext`. With `write`, the writable
    /// state runs it (encrypting into `outgoing`) and the step is [`Step::Wrote`].
    fn step(
        &mut self,
        mut out: Option<&mut ReadBuf<'_>>,
        write: Option<&mut WriteFn<'_>>,
    ) -> io::Result<Step> {
        let TlsStream {
            conn,
            incoming,
            plaintext,
            outgoing,
            read_eof,
            ..
        } = self;
        let status = conn.process_tls_records(incoming.unprocessed_mut());
        let discard = status.discard;
        let step = match status.state.map_err(tls_error)? {
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    let record = record.map_err(tls_error)?;
                    let payload = record.payload;
                    let direct = match out.as_deref_mut() {
                        Some(out) if plaintext.len() == 0 => {
                            let n = payload.len().min(out.remaining());
                            out.put_slice(&payload[..n]);
                            n
                        }
                        _ => 0,
                    };
                    plaintext.buf.extend_from_slice(&payload[direct..]);
                }
                Step::Data
            }
            ConnectionState::EncodeTlsData(mut data) => {
                outgoing
                    .append(4096, |buf| data.encode(buf), encode_too_small)
                    .map_err(|error| io::Error::other(error.to_string()))?;
                Step::Again
            }
            // The encoded records sit in `outgoing`, which is sent in order before anything
            // encrypted later; that counts as transmitted.
            ConnectionState::TransmitTlsData(data) => {
                data.done();
                Step::Again
            }
            ConnectionState::PeerClosed => {
                *read_eof = true;
                Step::PeerClosed
            }
            ConnectionState::Closed => {
                *read_eof = true;
                Step::Closed
            }
            ConnectionState::BlockedHandshake => Step::NeedData,
            // Writes only happen once the handshake is done; while it runs, this state means
            // the server may already send (0.5-RTT) but still waits for the client's flight.
            ConnectionState::WriteTraffic(mut traffic) => match write {
                Some(write) => {
                    write(&mut traffic, outgoing)?;
                    Step::Wrote
                }
                None => Step::NeedData,
            },
            ConnectionState::ReadEarlyData(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unexpected early data",
                ))
            }
            _ => {
                return Err(io::Error::other("unexpected TLS connection state"));
            }
        };
        incoming.discard(discard);
        Ok(step)
    }

    /// The socket's read readiness; while it has nothing, the read buffer goes if it holds
    /// nothing either.
    fn poll_socket_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let ready = self.io.poll_read_ready(cx);
        if ready.is_pending() {
            self.incoming.release_if_empty();
        }
        ready
    }

    /// Reads more ciphertext from the socket; `Ok(0)` is EOF.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.io_eof {
            return Poll::Ready(Ok(0));
        }
        // Readiness first, so that an idle connection takes no read buffer, and lets go of
        // the one it has when the socket has nothing more.
        ready!(self.poll_socket_readable(cx))?;
        self.incoming.prepare_read();
        // Through `AsyncRead`, which takes a read that did not fill the buffer as the socket
        // drained and waits for readiness next time, where `try_read_buf` keeps the readiness
        // and the next read is a `recvfrom` that finds nothing: one per request on an
        // interactive tunnel, one per burst on a bulk one.
        match poll_read_buf(Pin::new(&mut self.io), cx, &mut self.incoming.buf) {
            Poll::Ready(Ok(0)) => {
                self.io_eof = true;
                Poll::Ready(Ok(0))
            }
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => {
                // Nothing there after all.
                self.incoming.release_if_empty();
                Poll::Pending
            }
        }
    }

    /// Sends everything in `outgoing`.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.outgoing.len() > 0 {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, self.outgoing.bytes()))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.outgoing.consumed(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Sends what the socket takes now, without waiting (and without registering a waker).
    fn send_some(&mut self) -> io::Result<()> {
        while self.outgoing.len() > 0 {
            match self.io.try_write(self.outgoing.bytes()) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.outgoing.consumed(n),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    async fn handshake(&mut self) -> io::Result<()> {
        while self.conn.is_handshaking() {
            match self.step(None, None)? {
                Step::Again | Step::Data | Step::Wrote => {}
                Step::PeerClosed | Step::Closed => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "client closed the connection during the TLS handshake",
                    ))
                }
                Step::NeedData => {
                    std::future::poll_fn(|cx| self.poll_send(cx)).await?;
                    if std::future::poll_fn(|cx| self.poll_fill(cx)).await? == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "client closed the connection during the TLS handshake",
                        ));
                    }
                }
            }
        }
        // The server's last records (session tickets) go out before the first response;
        // application data that came with the client's last flight waits in `plaintext`.
        while let Step::Again | Step::Data | Step::Wrote = self.step(None, None)? {}
        self.incoming.release_if_empty();
        std::future::poll_fn(|cx| self.poll_send(cx)).await
    }

    /// After a failed handshake: sends the alert rustls queued, if the socket takes it now.
    async fn send_alert(&mut self) {
        let TlsStream { conn, outgoing, .. } = self;
        if let Ok(ConnectionState::EncodeTlsData(mut data)) =
            conn.process_tls_records(&mut []).state
        {
            let _ = outgoing.append(64, |buf| data.encode(buf), encode_too_small);
        }
        let _ = self.send_some();
        let _ = self.io.shutdown().await;
    }

    /// Encrypts `plaintext` (at most [`WRITE_SIZE`] bytes of it, starting with the first
    /// non-empty slice) and sends what the socket takes at once; the rest waits in `outgoing`.
    /// Returns how many plaintext bytes it took.
    fn encrypt(&mut self, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.end = 0;
            let mut taken = 0;
            {
                let mut write = |traffic: &mut WriteTraffic<'_>, _: &mut Pending| {
                    for slice in slices {
                        let chunk = &slice[..slice.len().min(WRITE_SIZE - taken)];
                        if chunk.is_empty() {
                            continue;
                        }
                        let records = chunk.len().div_ceil(MAX_FRAGMENT);
                        // The scratch buffer keeps its length: nothing is zeroed twice.
                        scratch.end = encode_at(
                            &mut scratch.buf,
                            scratch.end,
                            chunk.len() + records * RECORD_OVERHEAD,
                            |buf| traffic.encrypt(chunk, buf),
                            encrypt_too_small,
                        )
                        .map_err(encrypt_error)?;
                        taken += chunk.len();
                        if taken == WRITE_SIZE {
                            break;
                        }
                    }
                    Ok(())
                };
                self.until_written(&mut write)?;
            }
            let records = &scratch.buf[..scratch.end];
            // Records rustls queued before these (a key update, tickets) go first.
            let sent = if self.outgoing.len() == 0 {
                match self.io.try_write(records) {
                    Ok(n) => n,
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(error) => return Err(error),
                }
            } else {
                0
            };
            // Exactly the rest: a client that stops reading keeps this buffer.
            self.outgoing.buf.reserve_exact(records.len() - sent);
            self.outgoing.buf.extend_from_slice(&records[sent..]);
            Ok(taken)
        })
    }

    /// Steps until `write` ran; records that arrive meanwhile wait in `plaintext`.
    fn until_written(&mut self, write: &mut WriteFn<'_>) -> io::Result<()> {
        loop {
            match self.step(None, Some(&mut *write))? {
                Step::Wrote => return Ok(()),
                Step::Again | Step::Data | Step::PeerClosed => {}
                Step::NeedData | Step::Closed => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the TLS connection cannot send any more",
                    ))
                }
            }
        }
    }

    fn poll_write_slices(
        &mut self,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS write side already closed",
            )));
        }
        if slices.iter().all(|s| s.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        // Earlier records first; while any still wait for the socket, so does the caller: a
        // client that stopped reading holds at most one write's worth of records here.
        let sent = self.poll_send(cx);
        self.recount();
        if sent?.is_pending() {
            return Poll::Pending;
        }
        let taken = self.encrypt(slices)?;
        // Whatever the socket does not take now goes with the next write, flush or shutdown.
        let sent = self.poll_send(cx);
        if sent.is_pending() {
            self.outgoing.compact();
        }
        self.recount();
        if let Poll::Ready(Err(error)) = sent {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(taken))
    }

    /// Counts the encrypted records this stream holds for a client that has not taken them
    /// (up to one write's worth, [`WRITE_SIZE`]) as tunnel data held in `budget`, beside what
    /// the sessions hold: a tunnel whose client stopped reading holds both.
    pub fn count_against(&mut self, budget: Budget) {
        self.counted.budget = Some(budget);
        self.recount();
    }

    /// Brings the budget's count of `outgoing` up to date: the memory its buffer takes.
    fn recount(&mut self) {
        let counted = &mut self.counted;
        let Some(budget) = &counted.budget else {
            return;
        };
        let now = self.outgoing.buf.capacity();
        if now > counted.bytes {
            budget.hold((now - counted.bytes) as u64);
        } else {
            budget.release((counted.bytes - now) as u64);
        }
        counted.bytes = now;
    }

    /// The TCP socket, for socket options.
    /// The client's certificate chain, as the handshake verified it.
    pub fn peer_certificates(&self) -> Option<&[rustls::pki_types::CertificateDer<'static>]> {
        self.conn.peer_certificates()
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.io
    }

    /// Bytes of record buffers this stream holds allocated (0 while idle).
    pub fn buffered(&self) -> usize {
        self.incoming.buf.capacity() + self.plaintext.buf.capacity() + self.outgoing.buf.capacity()
    }
}

type WriteTraffic<'c> = rustls::unbuffered::WriteTraffic<'c, ServerConnectionData>;
/// What runs in the writable state: encrypts into `outgoing`.
type WriteFn<'f> = dyn FnMut(&mut WriteTraffic<'_>, &mut Pending) -> io::Result<()> + 'f;

impl bridgehead_mux::splice::TunnelSocket for TlsStream {
    fn abort_on_close(&self) {
        bridgehead_mux::splice::TunnelSocket::abort_on_close(&self.io);
    }

    fn set_receive_buffer(&self, bytes: u32) -> io::Result<()> {
        bridgehead_mux::splice::TunnelSocket::set_receive_buffer(&self.io, bytes)
    }

    fn set_send_buffer(&self, bytes: u32) -> io::Result<()> {
        bridgehead_mux::splice::TunnelSocket::set_send_buffer(&self.io, bytes)
    }

    /// Ready while anything received waits here (plaintext, ciphertext, the end); otherwise
    /// the socket's readiness, letting go of the read buffer when the socket has nothing, as
    /// a read would.
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.plaintext.len() > 0
            || !self.incoming.unprocessed().is_empty()
            || self.read_eof
            || self.io_eof
        {
            return Poll::Ready(Ok(()));
        }
        self.poll_socket_readable(cx)
    }
}

impl AsyncRead for TlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let start = buf.filled().len();
        // Every complete record already received goes out in this read, as far as `buf`
        // holds: a reader that takes one record per call would leave partial records behind
        // (copied once more) whenever its next read is smaller.
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.plaintext.len() > 0 {
                this.plaintext.take_into(buf);
                continue;
            }
            if this.read_eof {
                return Poll::Ready(Ok(()));
            }
            match this.step(Some(buf), None)? {
                Step::Data | Step::Wrote => {}
                Step::PeerClosed | Step::Closed => return Poll::Ready(Ok(())),
                // A post-handshake message's answer (a key update): send it along if the
                // socket takes it; otherwise the next write or flush does.
                Step::Again => this.send_some()?,
                // Bytes delivered already: return them rather than wait for more. (An empty
                // record delivers nothing; an empty read would mean EOF.)
                Step::NeedData if buf.filled().len() > start => return Poll::Ready(Ok(())),
                Step::NeedData => {
                    if ready!(this.poll_fill(cx))? == 0 {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "peer closed connection without sending TLS close_notify",
                        )));
                    }
                }
            }
        }
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_slices(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_slices(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let sent = this.poll_send(cx);
        this.recount();
        ready!(sent)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_closed {
            let mut close = |traffic: &mut WriteTraffic<'_>, outgoing: &mut Pending| {
                outgoing
                    .append(64, |buf| traffic.queue_close_notify(buf), encrypt_too_small)
                    .map_err(encrypt_error)
            };
            this.until_written(&mut close)?;
            this.write_closed = true;
        }
        ready!(this.poll_send(cx))?;
        match ready!(Pin::new(&mut this.io).poll_shutdown(cx)) {
            Err(error) if error.kind() != io::ErrorKind::NotConnected => Poll::Ready(Err(error)),
            _ => Poll::Ready(Ok(())),
        }
    }
}
