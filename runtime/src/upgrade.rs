//! The agent's side of the WebSocket upgrade (RFC 6455 §4.1): write the request, read the
//! answer's head, check `101` and the accept key, and hand over the bytes the server sent
//! behind the head (the start of its first frames) with the stream.
//!
//! tungstenite's client handshake did this before, but the framing after it is
//! `bridgehead_mux::websocket`'s, and tungstenite keeps what it read past the head to itself.

use crate::http_head::{self, RawHead, MAX_HEADERS};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// Most bytes of a refusal's body read.
const MAX_BODY: usize = 4096;

/// The server's answer.
#[derive(Debug)]
pub enum Answer {
    /// `101`: the headers, and what followed the head.
    Upgraded { headers: HeaderMap, early: Bytes },
    /// Any other status, with the body (up to [`MAX_BODY`]).
    Refused {
        status: StatusCode,
        headers: HeaderMap,
        body: Vec<u8>,
    },
}

/// Why the upgrade did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("writing the upgrade request: {0}")]
    Write(std::io::Error),
    #[error("the server closed the connection before answering")]
    Closed,
    #[error("the answer's head is larger than {} bytes", http_head::MAX_HEAD_BYTES)]
    TooLarge,
    #[error("malformed answer: {0}")]
    Malformed(String),
    #[error("the server's Sec-WebSocket-Accept does not match the key sent")]
    WrongAccept,
    #[error("the request has no Sec-WebSocket-Key")]
    NoKey,
}

/// Sends `request` (built with tungstenite's `IntoClientRequest`, so it carries the upgrade
/// headers and a fresh key) on `io` and reads the answer. The caller bounds the time.
pub async fn upgrade<S>(io: &mut S, request: &Request<()>) -> Result<Answer, UpgradeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let key = request
        .headers()
        .get("sec-websocket-key")
        .ok_or(UpgradeError::NoKey)?
        .as_bytes()
        .to_vec();
    io.write_all(&request_bytes(request))
        .await
        .map_err(UpgradeError::Write)?;
    io.flush().await.map_err(UpgradeError::Write)?;
    let (buf, end) = match http_head::read(io).await {
        RawHead::Complete { buf, end } => (buf, end),
        RawHead::Closed => return Err(UpgradeError::Closed),
        RawHead::TooLarge => return Err(UpgradeError::TooLarge),
    };
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut fields);
    match response.parse(&buf[..end]) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(UpgradeError::Malformed("cut short".into())),
        Err(error) => return Err(UpgradeError::Malformed(error.to_string())),
    }
    let status = response
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| UpgradeError::Malformed("no status".into()))?;
    let mut headers = HeaderMap::new();
    for field in response.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(field.name.as_bytes()),
            HeaderValue::from_bytes(field.value),
        ) else {
            return Err(UpgradeError::Malformed(format!("header {:?}", field.name)));
        };
        headers.append(name, value);
    }
    let rest = buf.freeze().slice(end..);
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let body = body(io, &headers, &rest).await;
        return Ok(Answer::Refused {
            status,
            headers,
            body,
        });
    }
    let accept = headers
        .get("sec-websocket-accept")
        .map(HeaderValue::as_bytes);
    if accept != Some(derive_accept_key(&key).as_bytes()) {
        return Err(UpgradeError::WrongAccept);
    }
    Ok(Answer::Upgraded {
        headers,
        early: rest,
    })
}

/// `GET <path>?<query> HTTP/1.1` and every header of `request`.
fn request_bytes(request: &Request<()>) -> Vec<u8> {
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let mut bytes = format!("{} {target} HTTP/1.1\r\n", request.method()).into_bytes();
    for (name, value) in request.headers() {
        bytes.extend_from_slice(name.as_str().as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"\r\n");
    bytes
}

/// A refusal's body: `Content-Length` bytes (or up to the close), at most [`MAX_BODY`].
async fn body<S: AsyncRead + Unpin>(io: &mut S, headers: &HeaderMap, read: &[u8]) -> Vec<u8> {
    let length = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<usize>().ok())
        .unwrap_or(MAX_BODY)
        .min(MAX_BODY);
    let mut body = read[..read.len().min(length)].to_vec();
    let mut chunk = [0; 1024];
    while body.len() < length {
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n.min(length - body.len())]),
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    use super::*;

    fn request() -> Request<()> {
        "wss://server.example:8132/connect?id=a&host=n1"
            .into_client_request()
            .unwrap()
    }

    /// A server that reads the request head, answers `answer` and keeps the connection open.
    async fn answering(
        answer: impl FnOnce(&str) -> Vec<u8>,
    ) -> (Result<Answer, UpgradeError>, String) {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let request = request();
        let upgrade = tokio::spawn(async move { upgrade(&mut client, &request).await });
        let RawHead::Complete { buf, end } = http_head::read(&mut server).await else {
            panic!("no request head");
        };
        let head = String::from_utf8(buf[..end].to_vec()).unwrap();
        let key = head
            .lines()
            .find_map(|line| line.strip_prefix("sec-websocket-key: "))
            .unwrap()
            .to_owned();
        server.write_all(&answer(&key)).await.unwrap();
        let answer = upgrade.await.unwrap();
        drop(server);
        (answer, head)
    }

    #[tokio::test]
    async fn a_101_with_the_right_accept_key_upgrades_and_keeps_the_bytes_behind_it() {
        let (answer, head) = answering(|key| {
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\nX-Server-Id: s1\r\n\r\n",
                derive_accept_key(key.as_bytes())
            )
            .into_bytes()
            .into_iter()
            .chain(*b"\x82\x01x")
            .collect()
        })
        .await;
        assert!(
            head.starts_with("GET /connect?id=a&host=n1 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nhost: server.example:8132\r\n"), "{head}");
        assert!(head.contains("\r\nupgrade: websocket\r\n"), "{head}");
        match answer.unwrap() {
            Answer::Upgraded { headers, early } => {
                assert_eq!(headers["x-server-id"], "s1");
                assert_eq!(&early[..], b"\x82\x01x");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_wrong_accept_key_is_refused() {
        let (answer, _) = answering(|_| {
            b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: bm90IGl0\r\n\r\n".to_vec()
        })
        .await;
        assert!(
            matches!(answer, Err(UpgradeError::WrongAccept)),
            "{answer:?}"
        );
    }

    #[tokio::test]
    async fn a_refusal_brings_its_status_headers_and_body() {
        let (answer, _) = answering(|_| {
            b"HTTP/1.1 409 Conflict\r\nX-Server-Id: s2\r\nContent-Length: 9\r\n\r\nduplicate"
                .to_vec()
        })
        .await;
        match answer.unwrap() {
            Answer::Refused {
                status,
                headers,
                body,
            } => {
                assert_eq!(status, StatusCode::CONFLICT);
                assert_eq!(headers["x-server-id"], "s2");
                assert_eq!(body, b"duplicate");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn garbage_instead_of_an_answer_is_malformed() {
        let (answer, _) = answering(|_| b"SSH-2.0-OpenSSH\r\n\r\n".to_vec()).await;
        assert!(
            matches!(answer, Err(UpgradeError::Malformed(_))),
            "{answer:?}"
        );
    }
}
