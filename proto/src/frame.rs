//! Frames: the unit of the wire protocol, carried inside WebSocket binary messages.
//!
//! Every frame is a 9-byte header (`type: u8`, `stream: u32 BE`, `length: u32 BE`) followed by
//! `length` bytes of body whose layout depends on the type. `docs/protocol.md` is the byte-level
//! specification; the golden tests quote it.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error_code::ErrorCode;

/// Identifies one tunnel within a session. `0` is the session itself.
pub type StreamId = u32;

/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 9;
/// Largest DATA payload a frame may carry.
pub const MAX_DATA_PAYLOAD: usize = 64 * 1024;
/// Longest host name a DIAL frame may carry (DNS names are at most 253 octets).
pub const MAX_HOST_LEN: usize = 255;
/// Longest human-readable reason carried by DIAL_ERR and RESET.
pub const MAX_REASON_LEN: usize = 1024;
/// Largest body of any frame.
pub const MAX_BODY_LEN: usize = MAX_DATA_PAYLOAD;

/// Frame type bytes, as they appear on the wire.
pub mod kind {
    /// Server asks the agent to dial `host:port`.
    pub const DIAL: u8 = 0x01;
    /// Agent's dial succeeded.
    pub const DIAL_OK: u8 = 0x02;
    /// Agent's dial failed.
    pub const DIAL_ERR: u8 = 0x03;
    /// Stream payload.
    pub const DATA: u8 = 0x04;
    /// Flow-control credit grant.
    pub const WINDOW: u8 = 0x05;
    /// The sender's direction of the stream ended (TCP half-close).
    pub const FIN: u8 = 0x06;
    /// Abort the stream in both directions.
    pub const RESET: u8 = 0x07;
    /// Session-level: the sender is draining.
    pub const DRAIN: u8 = 0x08;
}

/// One protocol frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Server to agent: open `stream` by dialing `host:port` within `timeout_ms`. `window` is the
    /// number of DATA bytes the agent may send on the stream before it receives a WINDOW frame.
    Dial {
        stream: StreamId,
        timeout_ms: u32,
        window: u32,
        port: u16,
        host: String,
    },
    /// Agent to server: the dial succeeded. `window` is the number of DATA bytes the server may
    /// send before it receives a WINDOW frame.
    DialOk { stream: StreamId, window: u32 },
    /// Agent to server: the dial failed; the stream is closed.
    DialErr {
        stream: StreamId,
        code: ErrorCode,
        message: String,
    },
    /// Stream payload, 1 to [`MAX_DATA_PAYLOAD`] bytes.
    Data { stream: StreamId, payload: Bytes },
    /// The receiver of this frame may send `increment` more DATA bytes on `stream`.
    Window { stream: StreamId, increment: u32 },
    /// The sender will send no more DATA on `stream`; the other direction stays open.
    Fin { stream: StreamId },
    /// Abort `stream` in both directions.
    Reset {
        stream: StreamId,
        code: ErrorCode,
        reason: String,
    },
    /// Session-level: the sender is shutting down. From an agent: route no new streams to me.
    Drain,
}

/// Why bytes could not be decoded as frames. Every variant is a session-level protocol error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated frame: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    #[error("frame body of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("frame type {kind:#04x} has a body of {len} bytes, expected {expected}")]
    BadLength {
        kind: u8,
        len: usize,
        expected: &'static str,
    },
    #[error("frame type {kind:#04x} on stream {stream}: {expected}")]
    BadStream {
        kind: u8,
        stream: StreamId,
        expected: &'static str,
    },
    #[error("DATA frame with an empty payload")]
    EmptyData,
    #[error("WINDOW frame with a zero increment")]
    ZeroWindow,
    #[error("DIAL frame with an empty host")]
    EmptyHost,
    #[error("text field is not valid UTF-8")]
    InvalidUtf8,
    #[error("{0} bytes of trailing data after the frame")]
    TrailingBytes(usize),
}

impl Frame {
    /// The stream this frame belongs to (`0` for session frames).
    pub fn stream(&self) -> StreamId {
        match self {
            Frame::Dial { stream, .. }
            | Frame::DialOk { stream, .. }
            | Frame::DialErr { stream, .. }
            | Frame::Data { stream, .. }
            | Frame::Window { stream, .. }
            | Frame::Fin { stream }
            | Frame::Reset { stream, .. } => *stream,
            Frame::Drain => 0,
        }
    }

    fn kind(&self) -> u8 {
        match self {
            Frame::Dial { .. } => kind::DIAL,
            Frame::DialOk { .. } => kind::DIAL_OK,
            Frame::DialErr { .. } => kind::DIAL_ERR,
            Frame::Data { .. } => kind::DATA,
            Frame::Window { .. } => kind::WINDOW,
            Frame::Fin { .. } => kind::FIN,
            Frame::Reset { .. } => kind::RESET,
            Frame::Drain => kind::DRAIN,
        }
    }

    /// Appends only the frame's [`HEADER_LEN`]-byte header (kind, stream, body length) to `dst`:
    /// a writer that sends a DATA payload from where it lies (a vectored write) puts it right
    /// behind. [`Frame::encode`] is this header and then the body.
    pub fn encode_header(&self, dst: &mut BytesMut) {
        dst.put_u8(self.kind());
        dst.put_u32(self.stream());
        dst.put_u32(self.body_len() as u32);
    }

    /// Bytes this frame occupies on the wire.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.body_len()
    }

    fn body_len(&self) -> usize {
        match self {
            Frame::Dial { host, .. } => 4 + 4 + 2 + 1 + cut(host, MAX_HOST_LEN).len(),
            Frame::DialOk { .. } | Frame::Window { .. } => 4,
            Frame::DialErr { message: text, .. } | Frame::Reset { reason: text, .. } => {
                1 + truncated(text).len()
            }
            Frame::Data { payload, .. } => payload.len(),
            Frame::Fin { .. } | Frame::Drain => 0,
        }
    }

    /// Appends the frame to `dst`. Text fields longer than their limit are cut at a character
    /// boundary; a DATA payload must already be within [`MAX_DATA_PAYLOAD`] (the session splits).
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.reserve(self.encoded_len());
        self.encode_header(dst);
        match self {
            Frame::Dial {
                timeout_ms,
                window,
                port,
                host,
                ..
            } => {
                let host = cut(host, MAX_HOST_LEN);
                dst.put_u32(*timeout_ms);
                dst.put_u32(*window);
                dst.put_u16(*port);
                dst.put_u8(host.len() as u8);
                dst.put_slice(host.as_bytes());
            }
            Frame::DialOk { window, .. } => dst.put_u32(*window),
            Frame::DialErr {
                code,
                message: text,
                ..
            }
            | Frame::Reset {
                code, reason: text, ..
            } => {
                dst.put_u8(code.to_u8());
                dst.put_slice(truncated(text).as_bytes());
            }
            Frame::Data { payload, .. } => dst.put_slice(payload),
            Frame::Window { increment, .. } => dst.put_u32(*increment),
            Frame::Fin { .. } | Frame::Drain => {}
        }
    }

    /// Decodes exactly one frame; bytes after it are an error.
    pub fn decode(mut src: Bytes) -> Result<Frame, DecodeError> {
        let frame = Frame::decode_one(&mut src)?;
        if src.is_empty() {
            Ok(frame)
        } else {
            Err(DecodeError::TrailingBytes(src.len()))
        }
    }

    /// Decodes the first frame of `src` and advances `src` past it. DATA payloads are slices of
    /// `src`, not copies.
    pub fn decode_one(src: &mut Bytes) -> Result<Frame, DecodeError> {
        let (kind, stream, len) = Frame::decode_header(src)?;
        src.advance(HEADER_LEN);
        Frame::decode_body(kind, stream, src.split_to(len))
    }

    /// The header's type, stream and body length, checked against each other and against
    /// what `src` holds; `src` is not advanced.
    #[inline]
    fn decode_header(src: &Bytes) -> Result<(u8, u32, usize), DecodeError> {
        if src.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                needed: HEADER_LEN,
                available: src.len(),
            });
        }
        let kind = src[0];
        let stream = u32::from_be_bytes([src[1], src[2], src[3], src[4]]);
        let len = u32::from_be_bytes([src[5], src[6], src[7], src[8]]) as usize;
        if !(kind::DIAL..=kind::DRAIN).contains(&kind) {
            return Err(DecodeError::UnknownType(kind));
        }
        if len > MAX_BODY_LEN {
            return Err(DecodeError::TooLarge {
                len,
                max: MAX_BODY_LEN,
            });
        }
        if src.len() < HEADER_LEN + len {
            return Err(DecodeError::Truncated {
                needed: HEADER_LEN + len,
                available: src.len(),
            });
        }
        let expected = match (kind, stream) {
            (kind::DRAIN, 0) => None,
            (kind::DRAIN, _) => Some("session frames use stream 0"),
            (_, 0) => Some("stream frames need a non-zero stream id"),
            _ => None,
        };
        match expected {
            Some(expected) => Err(DecodeError::BadStream {
                kind,
                stream,
                expected,
            }),
            None => Ok((kind, stream, len)),
        }
    }

    /// The frame of type `kind` on `stream` from its whole `body`.
    #[inline]
    fn decode_body(kind: u8, stream: u32, mut body: Bytes) -> Result<Frame, DecodeError> {
        let len = body.len();
        let exact = |expected: usize, name: &'static str| {
            if len == expected {
                Ok(())
            } else {
                Err(DecodeError::BadLength {
                    kind,
                    len,
                    expected: name,
                })
            }
        };
        let frame = match kind {
            kind::DIAL => Frame::decode_dial(stream, body)?,
            kind::DIAL_OK => {
                exact(4, "4")?;
                Frame::DialOk {
                    stream,
                    window: body.get_u32(),
                }
            }
            kind::DIAL_ERR | kind::RESET => Frame::decode_error(kind, stream, body)?,
            kind::DATA => {
                if len == 0 {
                    return Err(DecodeError::EmptyData);
                }
                Frame::Data {
                    stream,
                    payload: body,
                }
            }
            kind::WINDOW => {
                exact(4, "4")?;
                let increment = body.get_u32();
                if increment == 0 {
                    return Err(DecodeError::ZeroWindow);
                }
                Frame::Window { stream, increment }
            }
            kind::FIN => {
                exact(0, "0")?;
                Frame::Fin { stream }
            }
            _ => {
                exact(0, "0")?;
                Frame::Drain
            }
        };
        Ok(frame)
    }

    /// DIAL's body: timeout, window, port, the host's length and the host.
    fn decode_dial(stream: u32, mut body: Bytes) -> Result<Frame, DecodeError> {
        let len = body.len();
        let bad_length = || DecodeError::BadLength {
            kind: kind::DIAL,
            len,
            expected: "11 + host length",
        };
        if len < 11 {
            return Err(bad_length());
        }
        let timeout_ms = body.get_u32();
        let window = body.get_u32();
        let port = body.get_u16();
        let host_len = body.get_u8() as usize;
        if len != 11 + host_len {
            return Err(bad_length());
        }
        if host_len == 0 {
            return Err(DecodeError::EmptyHost);
        }
        Ok(Frame::Dial {
            stream,
            timeout_ms,
            window,
            port,
            host: text(body)?,
        })
    }

    /// DIAL_ERR's or RESET's body: the code and the reason.
    fn decode_error(kind: u8, stream: u32, mut body: Bytes) -> Result<Frame, DecodeError> {
        let len = body.len();
        if !(1..=1 + MAX_REASON_LEN).contains(&len) {
            return Err(DecodeError::BadLength {
                kind,
                len,
                expected: "1 to 1025",
            });
        }
        let code = ErrorCode::from_u8(body.get_u8());
        let reason = text(body)?;
        Ok(if kind == kind::DIAL_ERR {
            Frame::DialErr {
                stream,
                code,
                message: reason,
            }
        } else {
            Frame::Reset {
                stream,
                code,
                reason,
            }
        })
    }

    /// Iterates over the frames of one WebSocket message. After the first error the iterator
    /// ends (the session must close: frame boundaries are lost).
    pub fn decode_all(src: Bytes) -> Frames {
        Frames { src, failed: false }
    }
}

/// Iterator returned by [`Frame::decode_all`].
#[derive(Debug)]
pub struct Frames {
    src: Bytes,
    failed: bool,
}

impl Iterator for Frames {
    type Item = Result<Frame, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.src.is_empty() {
            return None;
        }
        let item = Frame::decode_one(&mut self.src);
        self.failed = item.is_err();
        Some(item)
    }
}

fn text(body: Bytes) -> Result<String, DecodeError> {
    String::from_utf8(body.to_vec()).map_err(|_| DecodeError::InvalidUtf8)
}

fn truncated(text: &str) -> &str {
    cut(text, MAX_REASON_LEN)
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
