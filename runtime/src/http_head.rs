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

/// Where a head ends in the bytes received so far ([`find_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadEnd {
    /// The head is the first this many bytes (its `\r\n\r\n` included).
    At(usize),
    /// No end yet, and room for more.
    NotYet,
    /// More than [`MAX_HEAD_BYTES`] without an end, or an end past them.
    TooLarge,
}

/// Finds the end of the head (`\r\n\r\n`) in `buf`, whose first `searched` bytes were looked
/// at before and held no end (so only the last three of them are looked at again). The one
/// rule [`read`] applies as bytes arrive, and what reads a head that is all in memory.
pub fn find_end(buf: &[u8], searched: usize) -> HeadEnd {
    let from = searched.saturating_sub(3).min(buf.len());
    if let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
        let end = from + end + 4;
        if end > MAX_HEAD_BYTES {
            return HeadEnd::TooLarge;
        }
        return HeadEnd::At(end);
    }
    if buf.len() > MAX_HEAD_BYTES {
        return HeadEnd::TooLarge;
    }
    HeadEnd::NotYet
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
        match find_end(&buf, searched) {
            HeadEnd::At(end) => return RawHead::Complete { buf, end },
            HeadEnd::TooLarge => return RawHead::TooLarge,
            HeadEnd::NotYet => {}
        }
        searched = buf.len();
        buf.reserve(1024);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end is found wherever the search resumes, an end past 16 KiB or 16 KiB and one byte
    /// without an end is too large, and a head all in memory reads as one that came in reads.
    #[test]
    fn the_end_is_found_from_where_the_search_stopped() {
        let head = b"CONNECT a:1 HTTP/1.1\r\n\r\nrest";
        // Searched up to the end's last byte (not yet seen): the end is found.
        for searched in 0..24 {
            assert_eq!(find_end(head, searched), HeadEnd::At(24), "{searched}");
        }
        assert_eq!(find_end(b"CONNECT a:1 HTTP/1.1\r\n", 0), HeadEnd::NotYet);
        assert_eq!(find_end(b"", 5), HeadEnd::NotYet);
        let long = vec![b'a'; MAX_HEAD_BYTES];
        assert_eq!(find_end(&long, 0), HeadEnd::NotYet);
        assert_eq!(find_end(&[&long[..], b"a"].concat(), 0), HeadEnd::TooLarge);
        let late = [&long[..], b"\r\n\r\n"].concat();
        assert_eq!(find_end(&late, 0), HeadEnd::TooLarge);
        let just = [&long[..MAX_HEAD_BYTES - 4], b"\r\n\r\n"].concat();
        assert_eq!(find_end(&just, 0), HeadEnd::At(MAX_HEAD_BYTES));
    }
}
