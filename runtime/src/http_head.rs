//! Reading one HTTP/1 head off a connection: the server's listeners take exactly one request
//! per connection (a CONNECT on the frontend, a WebSocket upgrade on the agent endpoint), and
//! the agent reads exactly one response (its upgrade's), so none of them needs an HTTP
//! implementation, only this and httparse.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest head (request or status line and headers) accepted.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most header fields parsed.
pub const MAX_HEADERS: usize = 64;

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
