//! Reading and checking the CONNECT head, and the bytes of every answer. Each connection
//! carries one request: a tunnel, or a refusal with a one-line reason and `Connection: close`.

use bytes::Bytes;
use tokio::io::AsyncRead;

use crate::process::http_head::{self, HeadEnd, RawHead, MAX_HEADERS, MAX_HEAD_BYTES};
use crate::routing::refusal::Refusal;
use crate::routing::router::Target;

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

/// Reads the head ([`http_head::read`]) and checks the request line. The caller bounds the
/// time.
pub(super) async fn read<S: AsyncRead + Unpin>(socket: &mut S) -> Head {
    match http_head::read(socket).await {
        RawHead::Complete { buf, end } => match check(&buf[..end]) {
            Ok(target) => Head::Connect(target, buf.freeze().slice(end..)),
            Err(refusal) => Head::Refused(refusal),
        },
        RawHead::Closed => Head::Closed,
        RawHead::TooLarge => Head::Refused(too_large()),
    }
}

/// What `bytes`, all a client sent, make of its head, without a socket: the same end
/// ([`http_head::find_end`]) and checks as [`read`]. `Ok` holds the target and where the
/// tunnel's bytes start; `Ok(None)`, bytes that end before the head does.
pub(super) fn parse(bytes: &[u8]) -> Result<Option<(Target, usize)>, Refusal> {
    match http_head::find_end(bytes, 0) {
        HeadEnd::At(end) => check(&bytes[..end]).map(|target| Some((target, end))),
        HeadEnd::NotYet => Ok(None),
        HeadEnd::TooLarge => Err(too_large()),
    }
}

fn too_large() -> Refusal {
    Refusal::HeadTooLarge(MAX_HEAD_BYTES)
}

/// Checks a whole head: a CONNECT whose request target is a [`Target`].
fn check(head: &[u8]) -> Result<Target, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(Refusal::Incomplete),
        Err(httparse::Error::TooManyHeaders) => return Err(Refusal::TooManyHeaders(MAX_HEADERS)),
        Err(error) => return Err(Refusal::Malformed(error)),
    }
    if request.method != Some("CONNECT") {
        return Err(Refusal::NotConnect);
    }
    Target::parse(request.path.unwrap_or("")).map_err(Refusal::from)
}

/// The answer to a CONNECT whose dial succeeded: no body, no length headers; what follows is
/// the tunnel.
pub(super) const ESTABLISHED: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";

/// The bytes of a refusal ([`http_head::answer`]); 405 also names the one method served.
pub(super) fn refusal(refusal: &Refusal) -> Vec<u8> {
    let status = refusal.status().as_u16();
    let allow = if status == 405 {
        "allow: CONNECT\r\n"
    } else {
        ""
    };
    http_head::answer(status, &refusal.to_string(), allow)
}

#[cfg(test)]
mod tests {
    use super::*;

    use bridgehead_test_support::bounded;

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
        let text = String::from_utf8(http_head::answer(400, "bad target", "")).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 400 bad target\r\n")
                && text.ends_with("\r\n\r\nbad target\n"),
            "{text}"
        );
        // A reason carrying a peer's text cannot break out of the status line or the body.
        let text = String::from_utf8(http_head::answer(502, "refused\r\nset-cookie: x=1\n\x1b[2J", "")).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 502 refused\\r\\nset-cookie: x=1\\n\\x1b[2J\r\n"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\nrefused\\r\\nset-cookie: x=1\\n\\x1b[2J\n"), "{text}");
        let text = String::from_utf8(refusal(&Refusal::NotConnect)).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 405 only CONNECT is served here\r\n")
                && text.contains("\r\nallow: CONNECT\r\n"),
            "{text}"
        );
        })
        .await
    }
}
