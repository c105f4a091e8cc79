//! HTTP/1 heads on the server's listeners: reading one ([`read`], shared with the agent in
//! `bridgehead_runtime::http_head`) and the bytes of a refusal ([`answer`]).

use bridgehead_proto::frame::MAX_REASON_LEN;
use bridgehead_proto::text::Printable;

pub use bridgehead_runtime::http_head::{
    find_end, read, HeadEnd, RawHead, MAX_HEADERS, MAX_HEAD_BYTES,
};

/// Longest reason phrase in a refusal's status line, in characters.
const MAX_PHRASE: usize = 200;

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

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, ReadBuf};

    use super::*;

    use bridgehead_test_support::bounded;

    /// A peer that sends `data` at most `chunk` bytes per read, then closes.
    struct Chunked {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let n = this
                .chunk
                .min(buf.remaining())
                .min(this.data.len() - this.at);
            buf.put_slice(&this.data[this.at..this.at + n]);
            this.at += n;
            Poll::Ready(Ok(()))
        }
    }

    async fn read_in(data: &[u8], chunk: usize) -> RawHead {
        let mut peer = Chunked {
            data: data.to_vec(),
            at: 0,
            chunk,
        };
        read(&mut peer).await
    }

    /// A head of `len` bytes in all (request line, one padding header, the empty line).
    fn head_of_len(len: usize) -> Vec<u8> {
        let start = b"CONNECT a:1 HTTP/1.1\r\nX: ";
        let end = b"\r\n\r\n";
        let padding = len - start.len() - end.len();
        [&start[..], &vec![b'a'; padding], &end[..]].concat()
    }

    /// The head's end is found wherever the reads split it, the empty line included, and what
    /// follows it is kept.
    #[tokio::test]
    async fn the_end_of_the_head_is_found_across_reads() {
        bounded(async {
            let input = b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\nearly bytes";
            let head_len = input.len() - b"early bytes".len();
            for chunk in [1, 2, 3, 5, 7, input.len()] {
                match read_in(input, chunk).await {
                    RawHead::Complete { buf, end } => {
                        assert_eq!(end, head_len, "chunk {chunk}");
                        assert_eq!(&buf[..], &input[..buf.len()], "chunk {chunk}");
                    }
                    other => panic!("chunk {chunk}: {other:?}"),
                }
            }
        })
        .await
    }

    /// Heads of up to 16 KiB are taken, whether they come in one read or many; one byte more
    /// is too large.
    #[tokio::test]
    async fn heads_up_to_16_kib_are_taken() {
        bounded(async {
            assert_eq!(MAX_HEAD_BYTES, 16 * 1024);
            for chunk in [1000, 1024, MAX_HEAD_BYTES + 1] {
                for len in [2048, MAX_HEAD_BYTES] {
                    assert!(
                        matches!(read_in(&head_of_len(len), chunk).await, RawHead::Complete { end, .. } if end == len),
                        "{len} bytes in reads of {chunk}"
                    );
                }
                assert!(
                    matches!(
                        read_in(&head_of_len(MAX_HEAD_BYTES + 1), chunk).await,
                        RawHead::TooLarge
                    ),
                    "{} bytes in reads of {chunk}",
                    MAX_HEAD_BYTES + 1
                );
            }
        })
        .await
    }

    /// A peer that sends more than 16 KiB without ending its head is cut off there, however its
    /// reads fall; one that sends exactly 16 KiB and closes just closed.
    #[tokio::test]
    async fn an_endless_head_is_cut_off_after_16_kib() {
        bounded(async {
            let endless = vec![b'a'; 4 * MAX_HEAD_BYTES];
            for chunk in [1, 1000, 1024, 3 * MAX_HEAD_BYTES] {
                assert!(
                    matches!(read_in(&endless, chunk).await, RawHead::TooLarge),
                    "reads of {chunk}"
                );
                assert!(
                    matches!(
                        read_in(&endless[..MAX_HEAD_BYTES], chunk).await,
                        RawHead::Closed
                    ),
                    "reads of {chunk}"
                );
            }
        })
        .await
    }

    /// A refusal's answer: the status line with the reason, the headers asked for, `connection:
    /// close`, and a body of exactly `content-length` bytes.
    #[test]
    fn an_answer_is_a_whole_response() {
        let answer = String::from_utf8(answer(503, "no agent", "retry-after: 1\r\n")).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        assert_eq!(lines.next(), Some("HTTP/1.1 503 no agent"));
        let headers: Vec<&str> = lines.collect();
        assert_eq!(
            headers,
            [
                "content-type: text/plain; charset=utf-8",
                "retry-after: 1",
                "connection: close",
                "content-length: 9",
            ]
        );
        assert_eq!(body, "no agent\n");
    }
}
