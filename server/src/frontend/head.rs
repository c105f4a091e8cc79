//! Reading and checking the CONNECT head, and the bytes of every answer. Each connection
//! carries one request: a tunnel, or a refusal with a one-line reason and `Connection: close`.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use bridgehead_proto::frame::MAX_REASON_LEN as MAX_REASON;
use bridgehead_proto::text::Printable;

use crate::refusal::Refusal;
use crate::router::Target;

/// Largest CONNECT head (request line and headers) accepted.
pub(super) const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

/// What the first bytes of a connection turned out to be.
#[derive(Debug)]
pub(super) enum Head {
    /// `CONNECT target`, and the bytes the client sent behind the head: the tunnel's first.
    Connect(Target, Bytes),
    /// The client closed or failed before sending a whole head.
    Closed,
    /// A request to refuse.
    Refused(Refusal),
}

/// Reads until the end of the head (`\r\n\r\n`), at most [`MAX_HEAD_BYTES`], and checks the
/// request line. The caller bounds the time.
pub(super) async fn read<S: AsyncRead + Unpin>(socket: &mut S) -> Head {
    let mut buf = BytesMut::with_capacity(1024);
    let mut searched: usize = 0;
    loop {
        match socket.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return Head::Closed,
            Ok(_) => {}
        }
        let from = searched.saturating_sub(3);
        if let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            return check(buf, from + end + 4);
        }
        searched = buf.len();
        if buf.len() > MAX_HEAD_BYTES {
            return Head::Refused(Refusal::HeadTooLarge(MAX_HEAD_BYTES));
        }
        buf.reserve(1024);
    }
}

fn check(buf: BytesMut, end: usize) -> Head {
    if end > MAX_HEAD_BYTES {
        return Head::Refused(Refusal::HeadTooLarge(MAX_HEAD_BYTES));
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(&buf[..end]) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Head::Refused(Refusal::Incomplete),
        Err(httparse::Error::TooManyHeaders) => {
            return Head::Refused(Refusal::TooManyHeaders(MAX_HEADERS))
        }
        Err(error) => return Head::Refused(Refusal::Malformed(error)),
    }
    if request.method != Some("CONNECT") {
        return Head::Refused(Refusal::NotConnect);
    }
    match Target::parse(request.path.unwrap_or("")) {
        Ok(target) => Head::Connect(target, buf.freeze().slice(end..)),
        Err(error) => Head::Refused(error.into()),
    }
}

/// The answer to a CONNECT whose dial succeeded: no body, no length headers; what follows is
/// the tunnel.
pub(super) const ESTABLISHED: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";

/// Longest reason phrase in a refusal's status line, in characters.
const MAX_PHRASE: usize = 200;

/// The bytes of a refusal: the reason in the status line's reason phrase (kube-apiserver
/// reports a proxy's status line and drops its body) and again as the `text/plain` body, then
/// `Connection: close` (405 also names the one method served). Text from peers in the reason
/// (an agent's dial error) is escaped.
pub(super) fn refusal(refusal: &Refusal) -> Vec<u8> {
    answer(refusal.status().as_u16(), &refusal.to_string())
}

fn answer(status: u16, reason: &str) -> Vec<u8> {
    let phrase = Printable::cut(reason, MAX_PHRASE).ascii();
    let allow = if status == 405 {
        "allow: CONNECT\r\n"
    } else {
        ""
    };
    let body = format!("{}\n", Printable::cut(reason, MAX_REASON));
    format!(
        "HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n{allow}connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every async test fails after this long instead of hanging the suite.
    const TEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

    /// Runs a test body under [`TEST_TIMEOUT`].
    async fn bounded<F: std::future::Future>(body: F) -> F::Output {
        tokio::time::timeout(TEST_TIMEOUT, body)
            .await
            .expect("test timed out")
    }

    async fn head_of(input: &[u8]) -> Head {
        let mut socket = input;
        read(&mut socket).await
    }

    #[tokio::test]
    async fn heads() {
        bounded(async {
        assert!(
            matches!(head_of(b"CONNECT 10.0.0.5:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nEARLY").await, Head::Connect(t, early) if t.port == 10250 && early == "EARLY")
        );
        assert!(matches!(
            head_of(b"CONNECT [fd00::1]:80 HTTP/1.0\r\n\r\n").await,
            Head::Connect(t, early) if t.dial_host() == "fd00::1" && early.is_empty()
        ));
        assert!(matches!(
            head_of(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await,
            Head::Refused(r) if r.status() == 405
        ));
        for bad in [
            &b"CONNECT fd00::1:80 HTTP/1.1\r\n\r\n"[..],
            b"CONNECT %%%garbage HTTP/1.1\r\n\r\n",
            b"CONNECT host name:80 HTTP/1.1\r\n\r\n",
            b"CONNECT 10.0.0.5 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(head_of(bad).await, Head::Refused(r) if r.status() == 400),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            head_of(b"CONNECT 10.0.0.5:1 HTTP/1.1\r\n").await,
            Head::Closed
        ));
        let huge = [
            b"CONNECT a:1 HTTP/1.1\r\nX: ".as_slice(),
            &vec![b'a'; 20_000],
            b"\r\n\r\n",
        ]
        .concat();
        assert!(matches!(head_of(&huge).await, Head::Refused(r) if r.status() == 431));
        let text = String::from_utf8(answer(400, "bad target")).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 400 bad target\r\n")
                && text.ends_with("\r\n\r\nbad target\n"),
            "{text}"
        );
        // A reason carrying a peer's text cannot break out of the status line or the body.
        let text = String::from_utf8(answer(502, "refused\r\nset-cookie: x=1\n\x1b[2J")).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 502 refused\\r\\nset-cookie: x=1\\n\\x1b[2J\r\n"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\nrefused\\r\\nset-cookie: x=1\\n\\x1b[2J\n"), "{text}");
        let text = String::from_utf8(answer(405, "no")).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 405 no\r\n")
                && text.contains("\r\nallow: CONNECT\r\n"),
            "{text}"
        );
        })
        .await
    }
}
