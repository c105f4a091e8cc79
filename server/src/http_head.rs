//! Reading one HTTP/1 request head off a connection. Both listeners take exactly one request
//! per connection — a CONNECT on the frontend, a WebSocket upgrade on the agent endpoint — so
//! neither needs an HTTP server, only this and httparse.

use bridgehead_proto::frame::MAX_REASON_LEN;
use bridgehead_proto::text::Printable;
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most header fields parsed.
pub const MAX_HEADERS: usize = 64;

/// Longest reason phrase in a refusal's status line, in characters.
const MAX_PHRASE: usize = 200;

/// What came in before the head's end.
#[derive(Debug)]
pub enum RawHead {
    /// The head is `buf[..end]`; what follows it is the peer's first payload.
    Complete { buf: BytesMut, end: usize },
    /// The peer closed or failed first.
    Closed,
    /// More than [`MAX_HEAD_BYTES`] without an end.
    TooLarge,
}

/// Reads until the end of the head (`\r\n\r\n`), at most [`MAX_HEAD_BYTES`]. The caller bounds
/// the time.
pub async fn read<S: AsyncRead + Unpin>(socket: &mut S) -> RawHead {
    let mut buf = BytesMut::with_capacity(1024);
    let mut searched: usize = 0;
    loop {
        match socket.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return RawHead::Closed,
            Ok(_) => {}
        }
        let from = searched.saturating_sub(3);
        if let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + end + 4;
            if end > MAX_HEAD_BYTES {
                return RawHead::TooLarge;
            }
            return RawHead::Complete { buf, end };
        }
        searched = buf.len();
        if buf.len() > MAX_HEAD_BYTES {
            return RawHead::TooLarge;
        }
        buf.reserve(1024);
    }
}

/// The bytes of a refusal: the reason in the status line's reason phrase (kube-apiserver
/// reports a proxy's status line and drops its body) and again as the `text/plain` body, then
/// `extra_headers` (each ending in CRLF) and `Connection: close`. Text from peers in the reason
/// (an agent's dial error) is escaped: it cannot end the line or forge a header.
pub fn answer(status: u16, reason: &str, extra_headers: &str) -> Vec<u8> {
    let phrase = Printable::cut(reason, MAX_PHRASE).ascii();
    let body = format!("{}\n", Printable::cut(reason, MAX_REASON_LEN));
    format!(
        "HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n{extra_headers}connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
