//! Raw bytes as the first bytes of a CONNECT client, through the server frontend's head
//! reading (`bridgehead_server::frontend::read_head`: the end of the head, httparse, the method,
//! the target).
//!
//! Checks: nothing panics; an accepted head ends with CRLF CRLF where the tunnel's bytes start,
//! and its target prints as an authority that parses back to itself; a refusal's answer is one
//! well-formed HTTP response with the refusal's status, the reason on one line in the status
//! line, and only the answer's own header fields (a client's bytes cannot forge a header).

#![no_main]

use bridgehead_server::frontend::{read_head, ReadHead};
use bridgehead_server::routing::router::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match read_head(data) {
        ReadHead::Connect { target, start } => {
            assert!(
                start >= 4 && start <= data.len(),
                "start {start} of {}",
                data.len()
            );
            assert_eq!(&data[start - 4..start], b"\r\n\r\n");
            let printed = target.to_string();
            let again = Target::parse(&printed)
                .unwrap_or_else(|e| panic!("{printed:?} does not parse back: {e}"));
            assert_eq!(again.to_string(), printed);
        }
        ReadHead::Incomplete => {}
        ReadHead::Refused { refusal, answer } => {
            let mut headers = [httparse::EMPTY_HEADER; 8];
            let mut response = httparse::Response::new(&mut headers);
            let parsed = response.parse(&answer);
            assert!(
                matches!(parsed, Ok(httparse::Status::Complete(_))),
                "{parsed:?}: {:?}",
                String::from_utf8_lossy(&answer)
            );
            assert_eq!(response.code, Some(refusal.status().as_u16()));
            for header in response.headers.iter() {
                assert!(
                    ["content-type", "content-length", "connection", "allow"]
                        .contains(&header.name.to_ascii_lowercase().as_str()),
                    "a header the answer does not write: {:?}",
                    header.name
                );
            }
        }
    }
});
