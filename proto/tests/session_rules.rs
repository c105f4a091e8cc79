//! The session's rules one at a time, each at its boundary: the property tests (`session.rs`)
//! show that correct peers never trip them, these show what each rule does when it is tripped
//! or just not: the default window, the 16 MiB credit limit, when WINDOW is granted and for how
//! much, drain in both directions, what a reset drops and what an abort keeps readable, and how
//! queued frames are batched into one message.

use bridgehead_proto::budget::{Budget, EARN_DIVISOR, MIN_WINDOW};
use bridgehead_proto::frame::{Frame, HEADER_LEN};
use bridgehead_proto::session::{
    Event, OpenError, ReadOutcome, Role, SendWait, Session, SessionConfig, StreamError,
    DEFAULT_MAX_WINDOW,
};
use bridgehead_proto::{ErrorCode, StreamId};
use bytes::{Bytes, BytesMut};

/// The most credit a peer may hold on a stream, as `docs/protocol.md` states it (16 MiB).
const LIMIT: u32 = 16_777_216;

/// A session announcing `window`, its transmit queue large enough that `send_credit` is the
/// stream's credit.
fn session(role: Role, window: u32) -> Session {
    Session::new(SessionConfig {
        initial_window: window,
        max_window: window,
        max_queued: 2 * LIMIT as usize,
        ..SessionConfig::new(role)
    })
}

fn events(session: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| session.poll_event()).collect()
}

fn frames(session: &mut Session) -> Vec<Frame> {
    std::iter::from_fn(|| session.poll_transmit()).collect()
}

fn data(stream: StreamId, len: usize) -> Frame {
    Frame::Data {
        stream,
        payload: Bytes::from(vec![b'x'; len]),
    }
}

fn dial(stream: StreamId, window: u32) -> Frame {
    Frame::Dial {
        stream,
        timeout_ms: 1000,
        window,
        port: 1,
        host: "target".into(),
    }
}

/// A server session (receive window `window`) with one stream the agent answered with
/// `credit`; its DIAL and events are already taken.
fn open_server(window: u32, credit: u32) -> (Session, StreamId) {
    let mut server = session(Role::Server, window);
    let id = open_one(&mut server, credit);
    (server, id)
}

/// Opens one more stream on `server`, answered with `credit`; takes its frames and events.
fn open_one(server: &mut Session, credit: u32) -> StreamId {
    let id = server.open("target", 1, 1000, 0).unwrap();
    server
        .handle_frame(Frame::DialOk {
            stream: id,
            window: credit,
        })
        .unwrap();
    frames(server);
    events(server);
    id
}

fn is_reset(frame: &Frame, id: StreamId, want: ErrorCode) -> bool {
    matches!(frame, Frame::Reset { stream, code, .. } if *stream == id && *code == want)
}

#[test]
fn the_default_window_is_64_kib_in_dial_and_dial_ok() {
    let mut server = Session::new(SessionConfig::new(Role::Server));
    let id = server.open("target", 1, 1000, 0).unwrap();
    let sent = frames(&mut server);
    assert!(
        matches!(&sent[..], [Frame::Dial { window: 65_536, .. }]),
        "{sent:?}"
    );
    let mut agent = Session::new(SessionConfig::new(Role::Agent));
    for frame in sent {
        agent.handle_frame(frame).unwrap();
    }
    agent.dial_succeeded(id).unwrap();
    let answer = frames(&mut agent);
    assert_eq!(
        answer,
        [Frame::DialOk {
            stream: id,
            window: 65_536
        }]
    );
}

#[test]
fn a_dial_may_grant_up_to_16_mib() {
    for (window, accepted) in [(LIMIT, true), (LIMIT + 1, false), (u32::MAX, false)] {
        let mut agent = session(Role::Agent, 1000);
        agent.handle_frame(dial(1, window)).unwrap();
        let got = events(&mut agent);
        let answer = frames(&mut agent);
        if accepted {
            assert!(
                matches!(&got[..], [Event::DialRequested { stream: 1, .. }]),
                "{window}: {got:?}"
            );
            assert!(answer.is_empty(), "{window}: {answer:?}");
            agent.dial_succeeded(1).unwrap();
            assert_eq!(agent.send_credit(1), Ok(LIMIT as usize));
        } else {
            assert!(got.is_empty(), "{window}: {got:?}");
            assert!(
                matches!(
                    &answer[..],
                    [Frame::DialErr {
                        stream: 1,
                        code: ErrorCode::FlowControl,
                        ..
                    }]
                ),
                "{window}: {answer:?}"
            );
            assert!(!agent.contains(1));
        }
    }
}

#[test]
fn a_dial_ok_may_grant_up_to_16_mib() {
    for (window, accepted) in [(LIMIT, true), (LIMIT + 1, false)] {
        let mut server = session(Role::Server, 1000);
        let id = server.open("target", 1, 1000, 0).unwrap();
        frames(&mut server);
        server
            .handle_frame(Frame::DialOk { stream: id, window })
            .unwrap();
        let got = events(&mut server);
        if accepted {
            assert_eq!(got, [Event::Opened { stream: id }], "{window}");
            assert_eq!(server.send_credit(id), Ok(LIMIT as usize));
        } else {
            assert!(
                matches!(
                    &got[..],
                    [
                        ..,
                        Event::DialFailed {
                            code: ErrorCode::FlowControl,
                            expired: false,
                            ..
                        }
                    ]
                ),
                "{window}: {got:?}"
            );
            let sent = frames(&mut server);
            assert!(
                sent.iter().any(|f| is_reset(f, id, ErrorCode::FlowControl)),
                "{sent:?}"
            );
            assert!(!server.contains(id));
        }
    }
}

#[test]
fn windows_may_add_credit_up_to_16_mib() {
    let (mut server, id) = open_server(1000, 1);
    server
        .handle_frame(Frame::Window {
            stream: id,
            increment: LIMIT - 1,
        })
        .unwrap();
    assert_eq!(server.send_credit(id), Ok(LIMIT as usize));
    assert!(frames(&mut server).is_empty());
    server
        .handle_frame(Frame::Window {
            stream: id,
            increment: 1,
        })
        .unwrap();
    let sent = frames(&mut server);
    assert!(
        matches!(&sent[..], [f] if is_reset(f, id, ErrorCode::FlowControl)),
        "{sent:?}"
    );
    assert!(!server.contains(id));
}

#[test]
fn data_beyond_the_granted_window_resets_even_when_split_across_frames() {
    let (mut server, id) = open_server(100, 0);
    server.handle_frame(data(id, 60)).unwrap();
    assert!(frames(&mut server).is_empty());
    server.handle_frame(data(id, 41)).unwrap();
    let sent = frames(&mut server);
    assert!(
        matches!(&sent[..], [f] if is_reset(f, id, ErrorCode::FlowControl)),
        "{sent:?}"
    );
}

#[test]
fn a_window_wakes_the_writer_only_when_its_credit_was_zero() {
    for (credit, wakes) in [(0, true), (5, false)] {
        let (mut server, id) = open_server(1000, credit);
        server
            .handle_frame(Frame::Window {
                stream: id,
                increment: 10,
            })
            .unwrap();
        let woken = events(&mut server) == [Event::Writable { stream: id }];
        assert_eq!(woken, wakes, "credit {credit}");
        assert_eq!(server.send_credit(id), Ok(credit as usize + 10));
    }
}

/// Each read's WINDOW, if it sent one.
fn read_grant(server: &mut Session, id: StreamId) -> Option<u32> {
    assert!(matches!(server.read(id), ReadOutcome::Data(_)));
    let sent = frames(server);
    match &sent[..] {
        [] => None,
        [Frame::Window { stream, increment }] if *stream == id => Some(*increment),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_grant_comes_once_half_the_window_was_read_and_covers_what_was_read() {
    let (mut server, id) = open_server(100, 0);
    // (bytes the agent sends, then the server reads: the WINDOW that read sends)
    for (len, grant) in [
        (49, None),
        (1, Some(50)),
        (30, None),
        (20, Some(50)),
        (50, Some(50)),
    ] {
        server.handle_frame(data(id, len)).unwrap();
        assert_eq!(read_grant(&mut server, id), grant, "after {len} bytes");
    }
}

#[test]
fn no_grant_once_the_peer_finished() {
    let (mut server, id) = open_server(100, 0);
    server.handle_frame(data(id, 60)).unwrap();
    server.handle_frame(Frame::Fin { stream: id }).unwrap();
    assert_eq!(read_grant(&mut server, id), None);
    assert_eq!(server.read(id), ReadOutcome::Eof);
}

#[test]
fn draining_is_announced_once_and_stops_new_streams() {
    let mut server = session(Role::Server, 1000);
    assert!(!server.has_transmit());
    server.drain();
    server.drain();
    assert_eq!(frames(&mut server), [Frame::Drain]);
    assert_eq!(server.open("target", 1, 1000, 0), Err(OpenError::Draining));

    let mut agent = session(Role::Agent, 1000);
    agent.drain();
    assert_eq!(frames(&mut agent), [Frame::Drain]);
    agent.handle_frame(dial(1, 1000)).unwrap();
    assert!(events(&mut agent).is_empty());
    let answer = frames(&mut agent);
    assert!(
        matches!(
            &answer[..],
            [Frame::DialErr {
                stream: 1,
                code: ErrorCode::Draining,
                ..
            }]
        ),
        "{answer:?}"
    );
}

#[test]
fn a_peers_drain_is_reported_once_and_stops_new_streams() {
    let mut server = session(Role::Server, 1000);
    assert!(!server.peer_draining());
    server.handle_frame(Frame::Drain).unwrap();
    assert!(server.peer_draining());
    server.handle_frame(Frame::Drain).unwrap();
    assert_eq!(events(&mut server), [Event::PeerDraining]);
    assert_eq!(server.open("target", 1, 1000, 0), Err(OpenError::Draining));
    assert!(frames(&mut server).is_empty(), "only the peer drains");
}

#[test]
fn both_ends_count_streams_and_refuse_past_their_limit() {
    let config = |role| SessionConfig {
        max_streams: 2,
        ..SessionConfig::new(role)
    };
    let mut server = Session::new(config(Role::Server));
    assert_eq!(server.stream_count(), 0);
    server.open("a", 1, 1000, 0).unwrap();
    server.open("b", 1, 1000, 0).unwrap();
    assert_eq!(server.stream_count(), 2);
    assert_eq!(
        server.open("c", 1, 1000, 0),
        Err(OpenError::TooManyStreams(2))
    );

    let mut agent = Session::new(config(Role::Agent));
    for id in 1..=3 {
        agent.handle_frame(dial(id, 1000)).unwrap();
    }
    assert_eq!(agent.stream_count(), 2);
    let answer = frames(&mut agent);
    assert!(
        matches!(
            &answer[..],
            [Frame::DialErr {
                stream: 3,
                code: ErrorCode::TooManyStreams,
                ..
            }]
        ),
        "{answer:?}"
    );
}

/// The phase a stream is in when a frame arrives that the phase forbids.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Dialing,
    Open,
    PeerFinished,
}

#[test]
fn a_frame_the_streams_phase_forbids_resets_that_stream_only() {
    let cases = [
        (Phase::Dialing, data(1, 1)),
        (Phase::Dialing, Frame::Fin { stream: 1 }),
        (
            Phase::Open,
            Frame::DialOk {
                stream: 1,
                window: 1,
            },
        ),
        (
            Phase::Open,
            Frame::DialErr {
                stream: 1,
                code: ErrorCode::Refused,
                message: "late".into(),
            },
        ),
        (Phase::PeerFinished, data(1, 1)),
        (Phase::PeerFinished, Frame::Fin { stream: 1 }),
    ];
    for (phase, frame) in cases {
        let mut server = session(Role::Server, 1000);
        let id = server.open("target", 1, 1000, 0).unwrap();
        let other = open_one(&mut server, 10);
        if !matches!(phase, Phase::Dialing) {
            server
                .handle_frame(Frame::DialOk {
                    stream: id,
                    window: 10,
                })
                .unwrap();
        }
        if matches!(phase, Phase::PeerFinished) {
            server.handle_frame(Frame::Fin { stream: id }).unwrap();
        }
        frames(&mut server);
        events(&mut server);
        let case = format!("{frame:?} while {phase:?}");
        server.handle_frame(frame).unwrap();
        let sent = frames(&mut server);
        assert!(
            matches!(&sent[..], [f] if is_reset(f, id, ErrorCode::StreamState)),
            "{case}: {sent:?}"
        );
        let got = events(&mut server);
        assert!(
            matches!(&got[..], [Event::Reset { stream, code: ErrorCode::StreamState, by_peer: false, .. }] if *stream == id),
            "{case}: {got:?}"
        );
        assert!(!server.contains(id), "{case}");
        assert!(server.contains(other), "{case}");
    }
}

#[test]
fn a_reset_drops_that_streams_queued_data_and_nothing_else() {
    let (mut server, a) = open_server(1000, 100);
    let b = open_one(&mut server, 100);
    server.send(a, Bytes::from_static(b"aaa")).unwrap();
    server.send(b, Bytes::from_static(b"bbb")).unwrap();
    server.finish(b).unwrap();
    server.reset(a, ErrorCode::Cancelled, "client left");
    let sent = frames(&mut server);
    assert!(
        matches!(
            &sent[..],
            [reset, Frame::Data { stream: d, payload }, Frame::Fin { stream: f }]
                if is_reset(reset, a, ErrorCode::Cancelled) && *d == b && payload == "bbb" && *f == b
        ),
        "{sent:?}"
    );
}

#[test]
fn abort_fails_every_stream_and_keeps_what_was_received_readable() {
    let mut server = session(Role::Server, 1000);
    let dialing = server.open("target", 1, 1000, 0).unwrap();
    let idle = open_one(&mut server, 10);
    let with_data = open_one(&mut server, 10);
    let finished = open_one(&mut server, 10);
    let data_and_fin = open_one(&mut server, 10);
    server.handle_frame(data(with_data, 3)).unwrap();
    server
        .handle_frame(Frame::Fin { stream: finished })
        .unwrap();
    server.handle_frame(data(data_and_fin, 3)).unwrap();
    server
        .handle_frame(Frame::Fin {
            stream: data_and_fin,
        })
        .unwrap();
    events(&mut server);

    server.abort("websocket closed");
    let got = events(&mut server);
    let reset = |id| Event::Reset {
        stream: id,
        code: ErrorCode::ConnectionReset,
        reason: "websocket closed".into(),
        by_peer: false,
    };
    assert_eq!(
        got,
        [
            Event::DialFailed {
                stream: dialing,
                code: ErrorCode::ConnectionReset,
                message: "websocket closed".into(),
                expired: false,
            },
            reset(idle),
            reset(with_data),
            reset(finished),
            reset(data_and_fin),
        ]
    );
    assert!(!server.contains(dialing) && !server.contains(idle));
    assert_eq!(server.next_deadline(), None);
    // Nothing can be sent any more, but what arrived is still read, then the end.
    assert!(server.send(with_data, Bytes::from_static(b"x")).is_err());
    assert!(matches!(server.read(with_data), ReadOutcome::Data(d) if d.len() == 3));
    assert_eq!(server.read(with_data), ReadOutcome::Gone);
    assert_eq!(server.read(finished), ReadOutcome::Eof);
    assert_eq!(
        server.read(finished),
        ReadOutcome::Eof,
        "EOF stays readable"
    );
    assert!(matches!(server.read(data_and_fin), ReadOutcome::Data(d) if d.len() == 3));
    assert_eq!(server.read(data_and_fin), ReadOutcome::Eof);
    assert_eq!(server.read(idle), ReadOutcome::Gone);
}

#[test]
fn abort_resets_an_agents_dialing_stream() {
    let mut agent = session(Role::Agent, 1000);
    agent.handle_frame(dial(1, 1000)).unwrap();
    events(&mut agent);
    agent.abort("websocket closed");
    assert_eq!(
        events(&mut agent),
        [Event::Reset {
            stream: 1,
            code: ErrorCode::ConnectionReset,
            reason: "websocket closed".into(),
            by_peer: false,
        }]
    );
    assert_eq!(agent.dial_succeeded(1), Err(StreamError::Gone(1)));
}

#[test]
fn has_transmit_sees_both_queues() {
    let (mut server, id) = open_server(1000, 100);
    assert!(!server.has_transmit());
    server.send(id, Bytes::from_static(b"data")).unwrap();
    assert!(server.has_transmit(), "a DATA frame waits");
    frames(&mut server);
    server.open("target", 1, 1000, 0).unwrap();
    assert!(server.has_transmit(), "a DIAL waits");
    frames(&mut server);
    assert!(!server.has_transmit());
}

#[test]
fn encode_transmit_fills_a_message_up_to_its_size_and_no_further() {
    let (mut server, id) = open_server(1000, 100);
    let mut dst = BytesMut::new();
    assert_eq!(server.encode_transmit(&mut dst, 1000), 0);
    for chunk in [b"aaaa", b"bbbb", b"cccc"] {
        server.send(id, Bytes::from_static(chunk)).unwrap();
    }
    // Each frame is 9 + 4 bytes. A frame is added while the message plus a header stays
    // below the limit: 0 + 9 and 13 + 9 are below 35, 26 + 9 is not.
    let frame = HEADER_LEN + 4;
    let max = 2 * frame + HEADER_LEN;
    assert_eq!(server.encode_transmit(&mut dst, max), 2);
    assert_eq!(dst.len(), 2 * frame);
    let encoded: Vec<Frame> = Frame::decode_all(dst.split().freeze())
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        encoded,
        [
            Frame::Data {
                stream: id,
                payload: Bytes::from_static(b"aaaa")
            },
            Frame::Data {
                stream: id,
                payload: Bytes::from_static(b"bbbb")
            },
        ]
    );
    assert_eq!(server.encode_transmit(&mut dst, max), 1, "the rest");
    assert!(!server.has_transmit());
}

/// A batch carries DATA of one stream (control frames go with any): a receiver holding one
/// tunnel's chunk then holds no other tunnel's bytes with it.
#[test]
fn a_batch_carries_data_of_one_stream() {
    let mut server = session(Role::Server, 1000);
    let [a, b] = [1, 2].map(|port| {
        let id = server.open("target", port, 1000, 0).unwrap();
        server
            .handle_frame(Frame::DialOk {
                stream: id,
                window: 1000,
            })
            .unwrap();
        id
    });
    frames(&mut server);
    for (id, chunk) in [(a, &b"aa"[..]), (a, b"aa"), (b, b"bb"), (a, b"aa")] {
        server.send(id, Bytes::from_static(chunk)).unwrap();
    }
    let mut batches = Vec::new();
    loop {
        let mut batch = Vec::new();
        if server.transmit_batch(1 << 20, |frame| batch.push(frame)) == 0 {
            break;
        }
        batches.push(
            batch
                .iter()
                .map(|frame| match frame {
                    Frame::Data { stream, .. } => *stream,
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(batches, [vec![a, a], vec![b], vec![a]]);
}

/// The server counts the dials still waiting for their answer (the router's pending bound).
#[test]
fn dialing_counts_the_dials_not_yet_answered() {
    let mut server = session(Role::Server, 1000);
    assert_eq!(server.dialing(), 0);
    let first = server.open("target", 1, 1000, 0).unwrap();
    server.open("target", 2, 1000, 0).unwrap();
    assert_eq!(server.dialing(), 2);
    server
        .handle_frame(Frame::DialOk {
            stream: first,
            window: 10,
        })
        .unwrap();
    assert_eq!(server.dialing(), 1);
}

/// A server whose transmit queue holds at most `max_queued` DATA bytes, with open streams
/// of `credit` each.
fn queue_bound(max_queued: usize, credits: &[u32]) -> (Session, Vec<StreamId>) {
    let mut server = Session::new(SessionConfig {
        initial_window: 1000,
        max_window: 1000,
        max_queued,
        ..SessionConfig::new(Role::Server)
    });
    let ids = credits.iter().map(|&c| open_one(&mut server, c)).collect();
    (server, ids)
}

/// The transmit queue bounds what streams may send: a stream with credit that finds the
/// queue full waits, and is woken (only it) once DATA leaves the queue; the room is what
/// left it.
#[test]
fn a_full_transmit_queue_holds_senders_until_data_leaves_it() {
    let (mut server, ids) = queue_bound(100, &[1000, 1000, 0]);
    let (a, b, none) = (ids[0], ids[1], ids[2]);
    assert_eq!(server.send_credit(a), Ok(100));
    assert_eq!(server.send(a, Bytes::from(vec![b'a'; 60])), Ok(60));
    // Room left, and credit: nothing to wait for.
    assert_eq!(server.send_credit(b), Ok(40));
    assert_eq!(server.send(b, Bytes::from(vec![b'b'; 40])), Ok(40));
    // Full: b waits for room; a stream without credit waits for a WINDOW, not for room.
    assert_eq!(server.send_credit(b), Ok(0));
    assert_eq!(server.send_credit(none), Ok(0));
    assert!(events(&mut server).is_empty());
    assert!(matches!(server.poll_transmit(), Some(Frame::Data { stream, .. }) if stream == a));
    assert_eq!(events(&mut server), [Event::Writable { stream: b }]);
    assert_eq!(server.send_credit(b), Ok(60));
}

/// What holds a stream back is told apart: the peer's window (no credit), or the session's
/// full queue (credit, but no room); nothing once a WINDOW or the writer brings either back.
#[test]
fn a_waiting_sender_is_told_whether_it_waits_for_the_window_or_the_queue() {
    let (mut server, ids) = queue_bound(100, &[1000, 50]);
    let (roomy, small) = (ids[0], ids[1]);
    assert_eq!(server.send_wait(roomy), None);
    assert_eq!(server.send(small, Bytes::from(vec![b's'; 50])), Ok(50));
    assert_eq!(server.send_wait(small), Some(SendWait::Window));
    assert_eq!(server.send(roomy, Bytes::from(vec![b'r'; 50])), Ok(50));
    assert_eq!(server.send_wait(roomy), Some(SendWait::Queue));
    // No credit outranks no room: a WINDOW is what the stream needs first.
    assert_eq!(server.send_wait(small), Some(SendWait::Window));
    server
        .handle_frame(Frame::Window {
            stream: small,
            increment: 10,
        })
        .unwrap();
    assert_eq!(server.send_wait(small), Some(SendWait::Queue));
    while server.poll_transmit().is_some() {}
    assert_eq!(server.send_wait(roomy), None);
    assert_eq!(server.send_wait(small), None);
    assert_eq!(
        server.send_wait(StreamId::MAX),
        None,
        "a stream that is gone"
    );
}

/// A reset stream's queued DATA leaves the queue with it, and frees its room at once.
#[test]
fn a_reset_frees_the_room_its_queued_data_took() {
    let (mut server, ids) = queue_bound(100, &[1000, 1000]);
    let (a, b) = (ids[0], ids[1]);
    assert_eq!(server.send(a, Bytes::from(vec![b'a'; 100])), Ok(100));
    assert_eq!(server.send_credit(b), Ok(0));
    server.reset(a, ErrorCode::Cancelled, "gone");
    assert!(events(&mut server).contains(&Event::Writable { stream: b }));
    assert_eq!(server.send_credit(b), Ok(100));
}

/// A server session with the default windows, under `budget`.
fn budgeted(budget: &Budget) -> Session {
    Session::new(budgeted_config(budget))
}

fn budgeted_config(budget: &Budget) -> SessionConfig {
    SessionConfig {
        budget: budget.clone(),
        max_queued: 2 * LIMIT as usize,
        ..SessionConfig::new(Role::Server)
    }
}

/// Delivers `len` bytes to `id` in frames of at most 16 KiB (as much as its window allows).
fn deliver(server: &mut Session, id: StreamId, len: usize) {
    let mut left = len;
    while left > 0 {
        let n = left.min(16 * 1024);
        server.handle_frame(data(id, n)).unwrap();
        left -= n;
    }
}

/// Reads `id` dry; returns the credit granted back.
fn read_all(server: &mut Session, id: StreamId) -> u64 {
    while let ReadOutcome::Data(_) = server.read(id) {}
    frames(server)
        .iter()
        .map(|frame| match frame {
            Frame::Window { stream, increment } if *stream == id => u64::from(*increment),
            _ => 0,
        })
        .sum()
}

fn dial_window(server: &mut Session) -> (StreamId, u32) {
    let id = server.open("target", 1, 1000, 0).unwrap();
    let window = frames(server)
        .iter()
        .find_map(|frame| match frame {
            Frame::Dial { window, .. } => Some(*window),
            _ => None,
        })
        .expect("a DIAL");
    server
        .handle_frame(Frame::DialOk {
            stream: id,
            window: LIMIT,
        })
        .unwrap();
    events(server);
    (id, window)
}

/// The peer sends `id` 16 KiB frames while it has credit (starting with `window`) and the
/// reader keeps up, until `total` bytes were read. Returns (bytes read, credit the peer
/// held) right after each grant: the credit is then the window.
fn keep_reading(server: &mut Session, id: StreamId, window: u32, total: u64) -> Vec<(u64, u64)> {
    let (mut credit, mut read) = (u64::from(window), 0u64);
    let mut after_grants = Vec::new();
    while read < total {
        let n = credit.min(16 * 1024);
        assert!(
            n > 0,
            "the reader read everything and the peer has no credit"
        );
        server.handle_frame(data(id, n as usize)).unwrap();
        credit -= n;
        let granted = read_all(server, id);
        read += n;
        if granted > 0 {
            credit += granted;
            after_grants.push((read, credit));
        }
    }
    after_grants
}

#[test]
fn a_reading_stream_earns_its_window_up_to_the_maximum() {
    let budget = Budget::unlimited();
    let mut server = budgeted(&budget);
    let (id, window) = dial_window(&mut server);
    assert_eq!(window, 64 * 1024);
    // The window grows with what was read (an eighth of it) to the maximum, the credit
    // limit, and no further.
    let max = u64::from(DEFAULT_MAX_WINDOW);
    assert_eq!(max, u64::from(LIMIT));
    let after_grants = keep_reading(&mut server, id, window, 2 * EARN_DIVISOR * max);
    assert!(
        after_grants
            .iter()
            .all(|&(read, credit)| credit <= (read / EARN_DIVISOR).clamp(64 << 10, max)),
        "a window grew before it was earned: {after_grants:?}"
    );
    assert_eq!(after_grants.iter().map(|&(_, c)| c).max(), Some(max));
    assert_eq!(budget.buffered(), 0);
}

#[test]
fn stalled_streams_make_new_streams_start_small_and_the_spent_budget_refuses_dials() {
    // A budget of 1 MiB shared by two sessions, as a process's sessions share it.
    let budget = Budget::new(1024 * 1024);
    let mut one = budgeted(&budget);
    let mut two = budgeted(&budget);
    let mut stalled = Vec::new();
    let mut windows = Vec::new();
    // Streams that are sent their whole window and never read: each start smaller.
    while budget.buffered() < budget.limit() {
        let (id, window) = dial_window(&mut one);
        deliver(&mut one, id, window as usize);
        stalled.push(id);
        windows.push(window);
    }
    assert_eq!(windows[0], 64 * 1024);
    assert_eq!(windows.last(), Some(&MIN_WINDOW), "{windows:?}");
    assert!(windows.windows(2).all(|w| w[1] <= w[0]), "{windows:?}");
    assert_eq!(one.buffered(), budget.buffered());
    // Past the budget an agent refuses a DIAL on any of the process's sessions.
    let mut agent = Session::new(SessionConfig {
        budget: budget.clone(),
        ..SessionConfig::new(Role::Agent)
    });
    agent.handle_frame(dial(1, 1000)).unwrap();
    assert!(
        matches!(
            &frames(&mut agent)[..],
            [Frame::DialErr {
                stream: 1,
                code: ErrorCode::Overloaded,
                ..
            }]
        ),
        "the agent admitted a stream past its budget"
    );
    assert!(!budget.admit());
    assert_eq!(budget.refused(), 2);
    // A reading stream on the other session still gets at least the floor back.
    let (id, window) = dial_window(&mut two);
    assert_eq!(window, MIN_WINDOW);
    deliver(&mut two, id, window as usize);
    assert_eq!(read_all(&mut two, id), u64::from(MIN_WINDOW));
    // Resetting stalled streams, or dropping their session, gives their bytes back.
    for id in stalled.drain(..stalled.len() / 2) {
        one.reset(id, ErrorCode::Cancelled, "client left");
    }
    assert_eq!(one.buffered(), budget.buffered());
    assert!(budget.admit());
    one.abort("the WebSocket closed");
    assert_eq!(
        one.buffered(),
        budget.buffered(),
        "aborted data stays readable"
    );
    drop(one);
    assert_eq!(budget.buffered(), 0);
}

#[test]
fn pressure_caps_what_a_reading_stream_is_granted() {
    let budget = Budget::new(4 * 1024 * 1024);
    let mut server = Session::new(SessionConfig {
        max_window: 1 << 20,
        ..budgeted_config(&budget)
    });
    // Stalled neighbours fill seven eighths of the budget...
    while budget.buffered() < 7 * budget.limit() / 8 {
        let (id, window) = dial_window(&mut server);
        deliver(&mut server, id, window as usize);
    }
    // ...so a stream that reads 8 MiB, which would earn 1 MiB, holds about 500 KiB: the cap
    // half way between 3/4 and all of the budget.
    let (fast, window) = dial_window(&mut server);
    assert_eq!(
        window, MIN_WINDOW,
        "a new stream under pressure starts small"
    );
    let after_grants = keep_reading(&mut server, fast, window, 8 << 20);
    let most = after_grants.iter().map(|&(_, c)| c).max().unwrap();
    assert!(
        (480 * 1024..=528 * 1024).contains(&most),
        "the reading stream held {most} at 7/8 pressure: {after_grants:?}"
    );
}

#[test]
fn held_bytes_stay_in_the_window_and_the_budget_until_released() {
    let budget = Budget::unlimited();
    let mut server = budgeted(&budget);
    let (id, window) = dial_window(&mut server);
    deliver(&mut server, id, window as usize);
    // Taken but still held (a socket write in progress): no credit back, still buffered.
    let mut held = 0;
    while let ReadOutcome::Data(chunk) = server.read_held(id) {
        held += chunk.len();
    }
    assert_eq!(held, window as usize);
    assert!(
        frames(&mut server).is_empty(),
        "credit granted for bytes still held"
    );
    assert_eq!(budget.buffered(), u64::from(window));
    // Released as the socket takes them: credit once half the window left.
    server.release(id, held / 2 - 1);
    assert!(frames(&mut server).is_empty());
    server.release(id, 1);
    assert_eq!(
        frames(&mut server),
        [Frame::Window {
            stream: id,
            increment: window / 2
        }]
    );
    assert_eq!(budget.buffered(), u64::from(window / 2));
    // Releasing more than is held releases what is held; a reset stream gives back the rest.
    deliver(&mut server, id, 1000);
    assert!(matches!(server.read_held(id), ReadOutcome::Data(_)));
    server.reset(id, ErrorCode::Cancelled, "client left");
    assert_eq!(budget.buffered(), 0);
    server.release(id, held);
    assert_eq!(budget.buffered(), 0);
}
