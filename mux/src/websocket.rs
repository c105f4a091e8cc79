//! The WebSocket framing (RFC 6455 §5) a session runs on, after the HTTP upgrade.
//!
//! Written for this one job instead of going through tungstenite's message API, which cost
//! every byte two extra passes on each side: the writer's payload was copied from the batch
//! into tungstenite's out buffer (and masked there by the agent, the WebSocket client), and
//! the reader's was zero-filled, copied out of the TLS stream into tungstenite's buffer,
//! copied again when the buffer grew, and unmasked by the server. Here:
//!
//! - the writer encodes a batch of frames behind room left for the WebSocket header, fills the
//!   header in once the length is known, and writes it to the TLS stream in one vectored write
//!   with the larger DATA payloads taken from where they lie (the TLS stream copies each byte
//!   once, into its record);
//! - the client masks with the all-zero key. Masking exists so that script in a browser cannot
//!   choose the bytes a client puts on the wire (RFC 6455 §10.3); the agent is no browser and
//!   its link is TLS. The frames stay valid WebSocket frames (mask bit set, a key given), so
//!   any RFC 6455 server or proxy reads them; a receiver skips the XOR for the zero key;
//! - the reader reads into a buffer it owns, sized to the frame being read (the TLS stream
//!   copies its plaintext straight into the spare capacity, nothing is zero-filled), and hands
//!   each binary message on as a `Bytes` of that buffer, unmasked in place where the peer used
//!   a key.
//!
//! Fragmented messages, pings (answered by the driver), pongs and close frames are handled as
//! the RFC says; text messages are passed up for the session to refuse.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// Largest WebSocket message either end accepts; the session's writer batches frames up to a
/// quarter of it.
pub const MAX_MESSAGE: usize = 1024 * 1024;

/// Which end of the WebSocket this is: the client (the agent) masks what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// A WebSocket after its HTTP upgrade: the transport, this end's role, and the bytes the peer
/// sent behind the upgrade's head (the start of its first frames).
#[derive(Debug)]
pub struct WebSocket<S> {
    pub(crate) io: S,
    pub(crate) role: Role,
    pub(crate) early: Bytes,
}

impl<S> WebSocket<S> {
    /// The WebSocket on `io`, upgraded, with `early` the bytes already read past the upgrade.
    pub fn new(io: S, role: Role, early: Bytes) -> WebSocket<S> {
        WebSocket { io, role, early }
    }
}

/// How the WebSocket failed.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A message larger than [`MAX_MESSAGE`].
    #[error("message of {0} bytes or more, larger than the limit of {MAX_MESSAGE}")]
    TooLarge(u64),
    /// The peer broke RFC 6455's framing rules.
    #[error("websocket framing: {0}")]
    Framing(&'static str),
    /// The connection ended without a close frame.
    #[error("connection ended without a closing handshake")]
    EndedWithoutClose,
}

/// The opcodes (RFC 6455 §5.2).
const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
pub(crate) const PING: u8 = 0x9;
pub(crate) const PONG: u8 = 0xA;
/// The FIN bit of the first header byte; the mask bit of the second.
const FIN: u8 = 0x80;
const MASKED: u8 = 0x80;
/// Longest header: 2 bytes, a 64-bit length, a mask key.
pub(crate) const MAX_HEADER: usize = 14;
/// Largest control frame payload.
const MAX_CONTROL: usize = 125;
/// The buffer a reader waits with between messages; a larger frame gets a buffer of its size.
pub(crate) const READ_BUFFER: usize = 4 * 1024;

/// What the reader took off the WebSocket.
#[derive(Debug)]
pub(crate) enum Incoming {
    Binary(Bytes),
    Text,
    Ping(Bytes),
    Pong,
    Close,
}

/// One frame's header, parsed.
#[derive(Debug, Clone, Copy)]
struct Header {
    fin: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    /// Header length.
    start: usize,
    /// Header plus payload.
    end: usize,
}

/// The header at the start of `buf`, `None` if `buf` does not hold all of it yet.
fn parse_header(buf: &[u8], role: Role) -> Result<Option<Header>, WsError> {
    let [first, second, ..] = *buf else {
        return Ok(None);
    };
    if first & 0x70 != 0 {
        return Err(WsError::Framing(
            "reserved bits set (no extension was agreed)",
        ));
    }
    let (fin, opcode) = (first & FIN != 0, first & 0x0F);
    let masked = second & MASKED != 0;
    match (role, masked) {
        (Role::Server, false) => return Err(WsError::Framing("unmasked frame from a client")),
        (Role::Client, true) => return Err(WsError::Framing("masked frame from a server")),
        _ => {}
    }
    let (len, mut at) = match second & 0x7F {
        126 => match buf.get(2..4) {
            Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 4),
            None => return Ok(None),
        },
        127 => match buf.get(2..10) {
            Some(b) => (u64::from_be_bytes(b.try_into().unwrap_or_default()), 10),
            None => return Ok(None),
        },
        len => (u64::from(len), 2),
    };
    let mask = if masked {
        let Some(key) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        at += 4;
        Some([key[0], key[1], key[2], key[3]])
    } else {
        None
    };
    if opcode >= CLOSE {
        if !fin {
            return Err(WsError::Framing("fragmented control frame"));
        }
        if len > MAX_CONTROL as u64 {
            return Err(WsError::Framing("control frame longer than 125 bytes"));
        }
    }
    if len > MAX_MESSAGE as u64 {
        return Err(WsError::TooLarge(len));
    }
    Ok(Some(Header {
        fin,
        opcode,
        mask,
        start: at,
        end: at + len as usize,
    }))
}

/// XORs `payload` with `key` (RFC 6455 §5.3); nothing to do for the all-zero key.
pub(crate) fn unmask(payload: &mut [u8], key: [u8; 4]) {
    if key == [0; 4] {
        return;
    }
    let wide = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut chunks = payload.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(word) ^ wide).to_ne_bytes());
    }
    for (i, byte) in chunks.into_remainder().iter_mut().enumerate() {
        *byte ^= key[i % 4];
    }
}

/// The reading half: frames in, messages out.
#[derive(Debug)]
pub(crate) struct Reader<R> {
    io: R,
    role: Role,
    /// Read and not yet taken; reads go into its spare capacity.
    buf: BytesMut,
    /// A fragmented message so far: its opcode and payload.
    fragments: Option<(u8, BytesMut)>,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub(crate) fn new(io: R, role: Role, early: &[u8]) -> Reader<R> {
        let mut buf = BytesMut::with_capacity(early.len().max(READ_BUFFER));
        buf.extend_from_slice(early);
        Reader {
            io,
            role,
            buf,
            fragments: None,
        }
    }

    /// The next message: binary data, a ping or pong, a text message (for the session to
    /// refuse) or the peer's close; an error when the framing is broken or the connection
    /// ended without a close frame.
    pub(crate) async fn next(&mut self) -> Result<Incoming, WsError> {
        loop {
            let (header, payload) = self.next_frame().await?;
            match header.opcode {
                PING => return Ok(Incoming::Ping(payload)),
                PONG => return Ok(Incoming::Pong),
                CLOSE => return Ok(Incoming::Close),
                CONTINUATION => {
                    let Some((opcode, mut message)) = self.fragments.take() else {
                        return Err(WsError::Framing("continuation without a message"));
                    };
                    if message.len() + payload.len() > MAX_MESSAGE {
                        return Err(WsError::TooLarge((message.len() + payload.len()) as u64));
                    }
                    message.put_slice(&payload);
                    if header.fin {
                        return Ok(complete(opcode, message.freeze()));
                    }
                    self.fragments = Some((opcode, message));
                }
                BINARY | TEXT => {
                    if self.fragments.is_some() {
                        return Err(WsError::Framing("new message inside a fragmented one"));
                    }
                    if header.fin {
                        return Ok(complete(header.opcode, payload));
                    }
                    self.fragments = Some((header.opcode, BytesMut::from(&payload[..])));
                }
                _ => return Err(WsError::Framing("unknown opcode")),
            }
        }
    }

    /// The next frame: its header and unmasked payload.
    async fn next_frame(&mut self) -> Result<(Header, Bytes), WsError> {
        loop {
            let header = parse_header(&self.buf, self.role)?;
            let need = match header {
                Some(header) if self.buf.len() >= header.end => {
                    let mut frame = self.buf.split_to(header.end);
                    let mut payload = frame.split_off(header.start);
                    if let Some(key) = header.mask {
                        unmask(&mut payload, key);
                    }
                    if self.buf.is_empty() && self.buf.capacity() > READ_BUFFER {
                        // Between messages: let the last one's buffer go with its payload
                        // instead of holding what is left of it.
                        self.buf = BytesMut::with_capacity(READ_BUFFER);
                    }
                    return Ok((header, payload.freeze()));
                }
                Some(header) => header.end,
                None => self.buf.len() + 1,
            };
            // Room for the whole frame, with what was read of it so far, in a buffer of
            // exactly that size when the one at hand is too small: payloads are handed on as
            // slices of it and keep it alive, so it holds nothing beyond the frame (a
            // `reserve` would size it after earlier, larger buffers). The reads fill
            // uninitialised capacity: a TLS stream copies its plaintext in without zeroing it
            // first.
            let want = need.max(READ_BUFFER);
            if self.buf.capacity() < want {
                let mut fresh = BytesMut::with_capacity(want);
                fresh.extend_from_slice(&self.buf);
                self.buf = fresh;
            }
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return Err(WsError::EndedWithoutClose);
            }
        }
    }
}

fn complete(opcode: u8, payload: Bytes) -> Incoming {
    if opcode == TEXT {
        Incoming::Text
    } else {
        Incoming::Binary(payload)
    }
}

/// One binary message being assembled: encoded bytes behind room for the WebSocket header,
/// and payloads that go out from where they lie (a vectored write), each at its offset in the
/// encoded bytes. Reused from message to message.
#[derive(Debug, Default)]
pub(crate) struct Message {
    bytes: BytesMut,
    spliced: Vec<(usize, Bytes)>,
    spliced_len: usize,
    /// Where the frame begins in `bytes` once its header is written ([`Writer::seal`]).
    start: usize,
}

impl Message {
    /// Empties the message, keeping its buffer; `capacity` is what the buffer should hold.
    pub(crate) fn clear(&mut self, capacity: usize) {
        self.bytes.clear();
        self.bytes.reserve(MAX_HEADER + capacity);
        self.bytes.put_bytes(0, MAX_HEADER);
        self.spliced.clear();
        self.spliced_len = 0;
        self.start = MAX_HEADER;
    }

    /// Where encoded bytes go.
    pub(crate) fn bytes(&mut self) -> &mut BytesMut {
        &mut self.bytes
    }

    /// `payload` goes next, sent from where it lies.
    pub(crate) fn splice(&mut self, payload: Bytes) {
        self.spliced_len += payload.len();
        self.spliced.push((self.bytes.len(), payload));
    }

    /// The message's payload length so far.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len() - MAX_HEADER + self.spliced_len
    }

    /// The sealed frame's slices from byte `skip` of it on, in order.
    fn slices(&self, mut skip: usize) -> Vec<IoSlice<'_>> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * self.spliced.len() + 1);
        let mut from = self.start;
        for (at, payload) in &self.spliced {
            parts.push(&self.bytes[from..*at]);
            parts.push(payload);
            from = *at;
        }
        parts.push(&self.bytes[from..]);
        parts
            .into_iter()
            .filter_map(|part| {
                if skip >= part.len() {
                    skip -= part.len();
                    return None;
                }
                let rest = &part[skip..];
                skip = 0;
                Some(IoSlice::new(rest))
            })
            .collect()
    }

    /// Length of the sealed frame, header included.
    fn frame_len(&self) -> usize {
        self.bytes.len() - self.start + self.spliced_len
    }
}

/// The writing half. Its writes are polls that take how far the frame got, so whichever task
/// finds the session's sending side free can carry a frame on where another left it
/// (`crate::outbox`).
#[derive(Debug)]
pub(crate) struct Writer<W> {
    io: W,
    role: Role,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub(crate) fn new(io: W, role: Role) -> Writer<W> {
        Writer { io, role }
    }

    /// Writes the WebSocket header of `message` (one binary message) in front of it.
    pub(crate) fn seal(&self, message: &mut Message) {
        let (header, end) = self.header(BINARY, message.len());
        let start = MAX_HEADER - end;
        message.bytes[start..MAX_HEADER].copy_from_slice(&header[..end]);
        message.start = start;
    }

    /// Writes the sealed `message` from its byte `*written` on, advancing `*written`; ready
    /// once all of it is written. Not flushed.
    pub(crate) fn poll_write_message(
        &mut self,
        cx: &mut Context<'_>,
        message: &Message,
        written: &mut usize,
    ) -> Poll<io::Result<()>> {
        let total = message.frame_len();
        while *written < total {
            let n = if message.spliced.is_empty() {
                // Small frames only (a round trip, window grants): one plain write.
                let bytes = &message.bytes[message.start + *written..];
                ready!(Pin::new(&mut self.io).poll_write(cx, bytes))?
            } else {
                let slices = message.slices(*written);
                ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Appends a control frame (ping, pong, close) to `out`, its payload cut to what a control
    /// frame may carry.
    pub(crate) fn control(&self, out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
        let payload = &payload[..payload.len().min(MAX_CONTROL)];
        let (header, end) = self.header(opcode, payload.len());
        out.extend_from_slice(&header[..end]);
        out.extend_from_slice(payload);
    }

    /// Appends a close frame with `code` and `reason` (cut to fit a control frame) to `out`.
    pub(crate) fn close(&self, out: &mut Vec<u8>, code: u16, reason: &str) {
        let mut payload = code.to_be_bytes().to_vec();
        let mut cut = reason.len().min(MAX_CONTROL - 2);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        payload.extend_from_slice(&reason.as_bytes()[..cut]);
        self.control(out, CLOSE, &payload);
    }

    /// Writes `bytes` from `*written` on, advancing `*written`. Not flushed.
    pub(crate) fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        bytes: &[u8],
        written: &mut usize,
    ) -> Poll<io::Result<()>> {
        while *written < bytes.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    pub(crate) fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Sends `message` as one binary message. Not flushed.
    #[cfg(test)]
    pub(crate) async fn send_binary(&mut self, message: &mut Message) -> Result<(), WsError> {
        self.seal(message);
        let mut written = 0;
        std::future::poll_fn(|cx| self.poll_write_message(cx, message, &mut written)).await?;
        Ok(())
    }

    /// Sends a ping and flushes.
    #[cfg(test)]
    pub(crate) async fn ping(&mut self) -> Result<(), WsError> {
        let mut frame = Vec::new();
        self.control(&mut frame, PING, &[]);
        self.send_flushed(&frame).await
    }

    /// Sends a close frame and flushes.
    #[cfg(test)]
    pub(crate) async fn send_close(&mut self, code: u16, reason: &str) -> Result<(), WsError> {
        let mut frame = Vec::new();
        self.close(&mut frame, code, reason);
        self.send_flushed(&frame).await
    }

    #[cfg(test)]
    async fn send_flushed(&mut self, bytes: &[u8]) -> Result<(), WsError> {
        let mut written = 0;
        std::future::poll_fn(|cx| self.poll_write_bytes(cx, bytes, &mut written)).await?;
        self.flush().await
    }

    #[cfg(test)]
    pub(crate) async fn flush(&mut self) -> Result<(), WsError> {
        std::future::poll_fn(|cx| self.poll_flush(cx)).await?;
        Ok(())
    }

    /// A final frame's header for `len` payload bytes, `header[..end]`; the client's carries
    /// the zero mask key. On the stack: one allocation per message less.
    fn header(&self, opcode: u8, len: usize) -> ([u8; MAX_HEADER], usize) {
        let mask = if self.role == Role::Client { MASKED } else { 0 };
        let mut header = [0; MAX_HEADER];
        header[0] = FIN | opcode;
        let mut end = match len {
            0..=125 => {
                header[1] = mask | len as u8;
                2
            }
            126..=0xFFFF => {
                header[1] = mask | 126;
                header[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                4
            }
            _ => {
                header[1] = mask | 127;
                header[2..10].copy_from_slice(&(len as u64).to_be_bytes());
                10
            }
        };
        if mask != 0 {
            // The key is zero, and so are these bytes already.
            end += 4;
        }
        (header, end)
    }
}

/// The close codes the session sends (RFC 6455 §7.4.1).
pub(crate) mod close_code {
    pub(crate) const NORMAL: u16 = 1000;
    pub(crate) const AWAY: u16 = 1001;
    pub(crate) const PROTOCOL: u16 = 1002;
}

#[cfg(test)]
mod tests;
