//! Property tests of the session state machine: a server and an agent session joined by two
//! frame queues, driven by random operation sequences.
//!
//! Properties: between two correct peers no frame is ever a protocol violation (so no sender
//! exceeds its credit); each direction of each stream delivers exactly the bytes sent, in
//! order; once everything is finished and delivered, every stream is freed on both sides.
//! A second property feeds arbitrary frames to a session: it never panics.

use std::collections::{BTreeMap, VecDeque};

use bridgehead_proto::frame::Frame;
use bridgehead_proto::session::{Event, ReadOutcome, Role, Session, SessionConfig};
use bridgehead_proto::{ErrorCode, StreamId};
use bytes::Bytes;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Open,
    Answer {
        ok: bool,
    },
    Deliver {
        to_agent: bool,
        frames: usize,
    },
    Send {
        server: bool,
        pick: usize,
        len: usize,
    },
    Read {
        server: bool,
        pick: usize,
    },
    Finish {
        server: bool,
        pick: usize,
    },
    Reset {
        server: bool,
        pick: usize,
    },
    Tick {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Open),
        2 => any::<bool>().prop_map(|ok| Op::Answer { ok }),
        6 => (any::<bool>(), 1..8usize).prop_map(|(to_agent, frames)| Op::Deliver { to_agent, frames }),
        6 => (any::<bool>(), any::<usize>(), 1..5000usize).prop_map(|(server, pick, len)| Op::Send { server, pick, len }),
        5 => (any::<bool>(), any::<usize>()).prop_map(|(server, pick)| Op::Read { server, pick }),
        1 => (any::<bool>(), any::<usize>()).prop_map(|(server, pick)| Op::Finish { server, pick }),
        1 => (any::<bool>(), any::<usize>()).prop_map(|(server, pick)| Op::Reset { server, pick }),
        1 => (0..3000u64).prop_map(|ms| Op::Tick { ms }),
    ]
}

/// One direction of one stream: what was sent and what was read so far.
#[derive(Debug, Default)]
struct Pipe {
    sent: u64,
    read: u64,
    fin_sent: bool,
    eof_read: bool,
}

#[derive(Debug, Default)]
struct Model {
    /// server→agent and agent→server byte accounting, by stream.
    down: BTreeMap<StreamId, Pipe>,
    up: BTreeMap<StreamId, Pipe>,
    /// Streams that ended by reset (on either side).
    reset: std::collections::BTreeSet<StreamId>,
}

fn byte_at(stream: StreamId, offset: u64) -> u8 {
    (offset.wrapping_mul(31).wrapping_add(u64::from(stream)) % 251) as u8
}

struct World {
    server: Session,
    agent: Session,
    to_agent: VecDeque<Frame>,
    to_server: VecDeque<Frame>,
    pending_dials: VecDeque<StreamId>,
    server_streams: Vec<StreamId>,
    agent_streams: Vec<StreamId>,
    model: Model,
    now: u64,
}

impl World {
    fn new(window: u32) -> World {
        let config = |role| SessionConfig {
            initial_window: window,
            max_window: window,
            max_streams: 16,
            ..SessionConfig::new(role)
        };
        World {
            server: Session::new(config(Role::Server)),
            agent: Session::new(config(Role::Agent)),
            to_agent: VecDeque::new(),
            to_server: VecDeque::new(),
            pending_dials: VecDeque::new(),
            server_streams: Vec::new(),
            agent_streams: Vec::new(),
            model: Model::default(),
            now: 0,
        }
    }

    /// Moves transmitted frames onto the wire and applies events to the model.
    fn settle(&mut self) {
        while let Some(frame) = self.server.poll_transmit() {
            self.to_agent.push_back(frame);
        }
        while let Some(frame) = self.agent.poll_transmit() {
            self.to_server.push_back(frame);
        }
        while let Some(event) = self.server.poll_event() {
            self.on_event(true, event);
        }
        while let Some(event) = self.agent.poll_event() {
            self.on_event(false, event);
        }
    }

    fn on_event(&mut self, server: bool, event: Event) {
        let streams = if server {
            &mut self.server_streams
        } else {
            &mut self.agent_streams
        };
        match event {
            Event::DialRequested { stream, .. } => {
                assert!(!server);
                self.pending_dials.push_back(stream);
            }
            Event::Opened { .. } | Event::Readable { .. } | Event::Writable { .. } => {}
            Event::DialFailed { stream, .. } => {
                assert!(server);
                streams.retain(|s| *s != stream);
                self.model.reset.insert(stream);
            }
            Event::Reset {
                stream,
                code,
                by_peer,
                ..
            } => {
                assert!(
                    by_peer || !matches!(code, ErrorCode::FlowControl | ErrorCode::StreamState),
                    "protocol violation between correct peers: {code} on stream {stream}"
                );
                streams.retain(|s| *s != stream);
                self.pending_dials.retain(|s| *s != stream);
                self.model.reset.insert(stream);
            }
            Event::Closed { stream } => streams.retain(|s| *s != stream),
            Event::PeerDraining => {}
        }
    }

    fn pick(&self, server: bool, pick: usize) -> Option<StreamId> {
        let streams = if server {
            &self.server_streams
        } else {
            &self.agent_streams
        };
        (!streams.is_empty()).then(|| streams[pick % streams.len()])
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Open => {
                if let Ok(id) = self.server.open("target", 80, 1000, self.now) {
                    self.server_streams.push(id);
                }
            }
            Op::Answer { ok } => {
                if let Some(stream) = self.pending_dials.pop_front() {
                    if ok && self.agent.dial_succeeded(stream).is_ok() {
                        self.agent_streams.push(stream);
                    } else if !ok {
                        self.agent.dial_failed(stream, ErrorCode::Refused, "no");
                    }
                }
            }
            Op::Deliver { to_agent, frames } => {
                for _ in 0..frames {
                    let (queue, session) = if to_agent {
                        (&mut self.to_agent, &mut self.agent)
                    } else {
                        (&mut self.to_server, &mut self.server)
                    };
                    let Some(frame) = queue.pop_front() else {
                        break;
                    };
                    // Frames cross the wire as bytes: exercise the codec too.
                    let mut buf = bytes::BytesMut::new();
                    frame.encode(&mut buf);
                    let frame = Frame::decode(buf.freeze()).expect("own frames decode");
                    session
                        .handle_frame(frame)
                        .expect("no session error between correct peers");
                }
            }
            Op::Send { server, pick, len } => {
                let Some(stream) = self.pick(server, pick) else {
                    return;
                };
                let (session, pipes) = if server {
                    (&mut self.server, &mut self.model.down)
                } else {
                    (&mut self.agent, &mut self.model.up)
                };
                let pipe = pipes.entry(stream).or_default();
                if pipe.fin_sent || session.send_credit(stream).is_err() {
                    return;
                }
                let data: Bytes = (0..len as u64)
                    .map(|i| byte_at(stream, pipe.sent + i))
                    .collect();
                let taken = session.send(stream, data).expect("sendable stream");
                pipe.sent += taken as u64;
            }
            Op::Read { server, pick } => {
                let Some(stream) = self.pick(server, pick) else {
                    return;
                };
                self.read_one(server, stream);
            }
            Op::Finish { server, pick } => {
                let Some(stream) = self.pick(server, pick) else {
                    return;
                };
                let (session, pipes) = if server {
                    (&mut self.server, &mut self.model.down)
                } else {
                    (&mut self.agent, &mut self.model.up)
                };
                if session.finish(stream).is_ok() {
                    pipes.entry(stream).or_default().fin_sent = true;
                }
            }
            Op::Reset { server, pick } => {
                let Some(stream) = self.pick(server, pick) else {
                    return;
                };
                let session = if server {
                    &mut self.server
                } else {
                    &mut self.agent
                };
                session.reset(stream, ErrorCode::Cancelled, "test");
            }
            Op::Tick { ms } => {
                self.now += ms;
                self.server.handle_timeout(self.now);
            }
        }
        self.settle();
    }

    /// Reads one chunk on `stream` and checks it continues the sent pattern.
    fn read_one(&mut self, server: bool, stream: StreamId) -> bool {
        let (session, pipes) = if server {
            (&mut self.server, &mut self.model.up)
        } else {
            (&mut self.agent, &mut self.model.down)
        };
        let pipe = pipes.entry(stream).or_default();
        let progressed = match session.read(stream) {
            ReadOutcome::Data(chunk) => {
                for (i, byte) in chunk.iter().enumerate() {
                    assert_eq!(
                        *byte,
                        byte_at(stream, pipe.read + i as u64),
                        "stream {stream} byte {}",
                        pipe.read + i as u64
                    );
                }
                pipe.read += chunk.len() as u64;
                assert!(pipe.read <= pipe.sent, "read more than was sent");
                true
            }
            ReadOutcome::Eof => {
                pipe.eof_read = true;
                assert_eq!(
                    pipe.read, pipe.sent,
                    "EOF before every byte arrived on {stream}"
                );
                false
            }
            ReadOutcome::Pending | ReadOutcome::Gone => false,
        };
        self.settle();
        progressed
    }

    /// Delivers everything, reads everything, finishes everything, answers every dial, until
    /// nothing moves; then both sessions must be empty and every finished direction complete.
    fn quiesce(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            while let Some(stream) = self.pending_dials.front().copied() {
                self.apply(Op::Answer { ok: true });
                moved |= self.agent.contains(stream);
            }
            for (server, streams) in [
                (true, self.server_streams.clone()),
                (false, self.agent_streams.clone()),
            ] {
                for stream in streams {
                    while self.read_one(server, stream) {
                        moved = true;
                    }
                    let session = if server {
                        &mut self.server
                    } else {
                        &mut self.agent
                    };
                    if session.finish(stream).is_ok() {
                        let pipes = if server {
                            &mut self.model.down
                        } else {
                            &mut self.model.up
                        };
                        pipes.entry(stream).or_default().fin_sent = true;
                        moved = true;
                    }
                    self.settle();
                }
            }
            if !self.to_agent.is_empty() || !self.to_server.is_empty() {
                let (a, s) = (self.to_agent.len(), self.to_server.len());
                self.apply(Op::Deliver {
                    to_agent: true,
                    frames: a,
                });
                self.apply(Op::Deliver {
                    to_agent: false,
                    frames: s,
                });
                moved = true;
            }
            if !moved {
                break;
            }
        }
        assert_eq!(
            self.server.stream_count(),
            0,
            "server streams left: {:?}",
            self.server_streams
        );
        assert_eq!(
            self.agent.stream_count(),
            0,
            "agent streams left: {:?}",
            self.agent_streams
        );
        for (stream, pipe) in self.model.down.iter().chain(self.model.up.iter()) {
            if !self.model.reset.contains(stream) {
                assert_eq!(pipe.read, pipe.sent, "stream {stream} lost bytes");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn correct_peers_deliver_everything_and_free_every_stream(
        window in 1u32..20_000,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let mut world = World::new(window);
        for op in ops {
            world.apply(op);
        }
        world.quiesce();
    }

    #[test]
    fn arbitrary_frames_never_panic(
        agent in any::<bool>(),
        frames in proptest::collection::vec(arbitrary_frame(), 0..64),
    ) {
        let role = if agent { Role::Agent } else { Role::Server };
        let mut session = Session::new(SessionConfig { initial_window: 1000,
        max_window: 1000, ..SessionConfig::new(role) });
        if role == Role::Server {
            for _ in 0..4 {
                let _ = session.open("x", 1, 100, 0);
            }
        }
        for frame in frames {
            if session.handle_frame(frame).is_err() {
                break;
            }
            while session.poll_event().is_some() {}
            for id in 0..6 {
                let _ = session.read(id);
                let _ = session.send(id, Bytes::from_static(b"abc"));
            }
            while session.poll_transmit().is_some() {}
            session.handle_timeout(50);
        }
    }
}

fn arbitrary_frame() -> impl Strategy<Value = Frame> {
    let stream = 0u32..6;
    prop_oneof![
        (stream.clone(), any::<u32>(), any::<u32>(), any::<u16>()).prop_map(
            |(stream, timeout_ms, window, port)| Frame::Dial {
                stream,
                timeout_ms,
                window,
                port,
                host: "h".into()
            }
        ),
        (stream.clone(), any::<u32>())
            .prop_map(|(stream, window)| Frame::DialOk { stream, window }),
        (stream.clone(), any::<u8>()).prop_map(|(stream, code)| Frame::DialErr {
            stream,
            code: ErrorCode::from_u8(code),
            message: "m".into()
        }),
        (stream.clone(), 1..3000usize).prop_map(|(stream, len)| Frame::Data {
            stream,
            payload: Bytes::from(vec![1u8; len])
        }),
        (stream.clone(), 1..u32::MAX)
            .prop_map(|(stream, increment)| Frame::Window { stream, increment }),
        stream.clone().prop_map(|stream| Frame::Fin { stream }),
        (stream, any::<u8>()).prop_map(|(stream, code)| Frame::Reset {
            stream,
            code: ErrorCode::from_u8(code),
            reason: "r".into()
        }),
        Just(Frame::Drain),
    ]
}

#[test]
fn flow_control_violation_resets_only_that_stream() {
    let mut server = Session::new(SessionConfig {
        initial_window: 100,
        max_window: 100,
        ..SessionConfig::new(Role::Server)
    });
    let a = server.open("a", 1, 1000, 0).unwrap();
    let b = server.open("b", 1, 1000, 0).unwrap();
    server
        .handle_frame(Frame::DialOk {
            stream: a,
            window: 100,
        })
        .unwrap();
    server
        .handle_frame(Frame::DialOk {
            stream: b,
            window: 100,
        })
        .unwrap();
    server
        .handle_frame(Frame::Data {
            stream: a,
            payload: Bytes::from(vec![0u8; 101]),
        })
        .unwrap();
    server
        .handle_frame(Frame::Data {
            stream: b,
            payload: Bytes::from(vec![0u8; 100]),
        })
        .unwrap();
    let events: Vec<Event> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(events.iter().any(|e| matches!(e, Event::Reset { stream, code: ErrorCode::FlowControl, by_peer: false, .. } if *stream == a)), "{events:?}");
    assert!(!server.contains(a));
    assert!(matches!(server.read(b), ReadOutcome::Data(d) if d.len() == 100));
    let frames: Vec<Frame> = std::iter::from_fn(|| server.poll_transmit()).collect();
    assert!(frames.iter().any(|f| matches!(f, Frame::Reset { stream, code: ErrorCode::FlowControl, .. } if *stream == a)), "{frames:?}");
    // Reading all of b's window grants it back.
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, Frame::Window { stream, increment: 100 } if *stream == b)),
        "{frames:?}"
    );
}

#[test]
fn frames_for_never_opened_streams_are_session_errors_and_closed_ones_are_ignored() {
    let mut server = Session::new(SessionConfig::new(Role::Server));
    assert!(server.handle_frame(Frame::Fin { stream: 1 }).is_err());
    let id = server.open("a", 1, 1000, 0).unwrap();
    server.reset(id, ErrorCode::Cancelled, "gone");
    // The agent's answer crossed our reset: ignored.
    server
        .handle_frame(Frame::DialOk {
            stream: id,
            window: 10,
        })
        .unwrap();
    server
        .handle_frame(Frame::Data {
            stream: id,
            payload: Bytes::from_static(b"x"),
        })
        .unwrap();
    assert!(!server.contains(id));
    let mut agent = Session::new(SessionConfig::new(Role::Agent));
    agent
        .handle_frame(Frame::Dial {
            stream: 5,
            timeout_ms: 1,
            window: 1,
            port: 1,
            host: "h".into(),
        })
        .unwrap();
    assert!(agent
        .handle_frame(Frame::Dial {
            stream: 5,
            timeout_ms: 1,
            window: 1,
            port: 1,
            host: "h".into()
        })
        .is_err());
    assert!(agent
        .handle_frame(Frame::DialOk {
            stream: 5,
            window: 1
        })
        .is_err());
}

#[test]
fn dial_deadline_fails_the_dial_and_cancels_it_at_the_agent() {
    let mut server = Session::new(SessionConfig::new(Role::Server));
    let id = server.open("a", 1, 500, 1000).unwrap();
    assert_eq!(server.next_deadline(), Some(1500));
    server.handle_timeout(1499);
    assert!(server.contains(id));
    server.handle_timeout(1500);
    assert!(!server.contains(id));
    let events: Vec<Event> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(
        matches!(
            &events[..],
            [Event::DialFailed {
                code: ErrorCode::TimedOut,
                ..
            }]
        ),
        "{events:?}"
    );
    let frames: Vec<Frame> = std::iter::from_fn(|| server.poll_transmit()).collect();
    assert!(
        matches!(
            frames.last(),
            Some(Frame::Reset {
                code: ErrorCode::Cancelled,
                ..
            })
        ),
        "{frames:?}"
    );
}

#[test]
fn half_close_keeps_the_other_direction_open() {
    let mut w = World::new(1000);
    w.apply(Op::Open);
    w.apply(Op::Deliver {
        to_agent: true,
        frames: 1,
    });
    w.apply(Op::Answer { ok: true });
    w.apply(Op::Deliver {
        to_agent: false,
        frames: 1,
    });
    w.apply(Op::Finish {
        server: true,
        pick: 0,
    });
    w.apply(Op::Deliver {
        to_agent: true,
        frames: 1,
    });
    let stream = w.agent_streams[0];
    assert!(!w.read_one(false, stream));
    assert!(
        w.model.down[&stream].eof_read,
        "the agent sees the server's FIN"
    );
    // The agent can still send; the server still reads.
    w.apply(Op::Send {
        server: false,
        pick: 0,
        len: 10,
    });
    w.apply(Op::Deliver {
        to_agent: false,
        frames: 1,
    });
    assert!(w.read_one(true, stream));
    assert_eq!(w.model.up[&stream].read, 10);
    w.quiesce();
}

/// Flow control, as the receiver sees it: what a stream has not read stays within the window
/// it granted, the sender is blocked at zero credit, and only reading grants more.
#[test]
fn an_unread_stream_buffers_at_most_its_window_and_only_reading_grants_more() {
    const WINDOW: u32 = 64 * 1024;
    let config = |role| SessionConfig {
        initial_window: WINDOW,
        max_window: WINDOW,
        ..SessionConfig::new(role)
    };
    let mut server = Session::new(config(Role::Server));
    let mut agent = Session::new(config(Role::Agent));
    let deliver = |from: &mut Session, to: &mut Session| {
        let mut windows = 0;
        while let Some(frame) = from.poll_transmit() {
            windows += usize::from(matches!(frame, Frame::Window { .. }));
            to.handle_frame(frame).unwrap();
        }
        windows
    };
    let id = server.open("target", 1, 10_000, 0).unwrap();
    deliver(&mut server, &mut agent);
    agent.dial_succeeded(id).unwrap();
    deliver(&mut agent, &mut server);

    // The agent (a target streaming as fast as it can) offers three windows' worth.
    let offered = Bytes::from(vec![7u8; 3 * WINDOW as usize]);
    let taken = agent.send(id, offered).unwrap();
    assert_eq!(
        taken, WINDOW as usize,
        "the sender took more than its credit"
    );
    assert_eq!(
        agent.send_credit(id).unwrap(),
        0,
        "the sender is not blocked"
    );
    assert_eq!(
        deliver(&mut agent, &mut server),
        0,
        "the agent granted credit the server never asked for"
    );
    // Nothing read: the server grants nothing, however often it is asked to transmit.
    assert_eq!(
        deliver(&mut server, &mut agent),
        0,
        "credit granted before any read"
    );
    assert_eq!(agent.send_credit(id).unwrap(), 0);
    assert_eq!(agent.send(id, Bytes::from_static(b"more")).unwrap(), 0);

    // Reading half the window grants it back.
    let mut read = 0;
    while read < WINDOW as usize / 2 {
        match server.read(id) {
            ReadOutcome::Data(chunk) => read += chunk.len(),
            other => panic!("{other:?} with {read} bytes read"),
        }
    }
    assert!(
        deliver(&mut server, &mut agent) > 0,
        "reading granted nothing"
    );
    assert_eq!(agent.send_credit(id).unwrap(), read);
}

/// The transmit queue is bounded for the whole session: streams with credit stop when it is
/// full and are woken once the writer drained it. A grant above the credit a peer may hold
/// resets the stream.
#[test]
fn the_transmit_queue_is_bounded_and_credit_is_clamped() {
    const QUEUE: usize = 100_000;
    let config = |role| SessionConfig {
        max_queued: QUEUE,
        initial_window: 256 * 1024,
        max_window: 256 * 1024,
        ..SessionConfig::new(role)
    };
    let mut server = Session::new(config(Role::Server));
    let mut agent = Session::new(config(Role::Agent));
    let open = |server: &mut Session, agent: &mut Session| {
        let id = server.open("target", 1, 10_000, 0).unwrap();
        while let Some(frame) = server.poll_transmit() {
            agent.handle_frame(frame).unwrap();
        }
        agent.dial_succeeded(id).unwrap();
        while let Some(frame) = agent.poll_transmit() {
            server.handle_frame(frame).unwrap();
        }
        id
    };
    let (a, b) = (open(&mut server, &mut agent), open(&mut server, &mut agent));
    // Each stream has 256 KiB of credit; together they may queue only QUEUE bytes.
    let chunk = Bytes::from(vec![1u8; 70_000]);
    assert_eq!(server.send(a, chunk.clone()).unwrap(), 70_000);
    assert_eq!(server.send_credit(b).unwrap(), QUEUE - 70_000);
    assert_eq!(server.send(b, chunk.clone()).unwrap(), QUEUE - 70_000);
    assert_eq!(
        server.send_credit(a).unwrap(),
        0,
        "a full queue still takes bytes"
    );
    assert_eq!(server.send(a, chunk.clone()).unwrap(), 0);
    while server.poll_event().is_some() {}
    // The writer drains one frame: the waiting stream may send again.
    let frame = server.poll_transmit().unwrap();
    assert!(
        matches!(frame, Frame::Dial { .. } | Frame::Data { .. }),
        "{frame:?}"
    );
    while !matches!(server.poll_transmit(), Some(Frame::Data { .. }) | None) {}
    let events: Vec<Event> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(
        events.contains(&Event::Writable { stream: a }),
        "{events:?}"
    );
    assert!(server.send_credit(a).unwrap() > 0);

    // A grant that takes a stream's credit above MAX_CREDIT resets it, and only it.
    let too_much = u32::try_from(bridgehead_proto::session::MAX_CREDIT).unwrap();
    server
        .handle_frame(Frame::Window {
            stream: b,
            increment: too_much,
        })
        .unwrap();
    let events: Vec<Event> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Reset {
                stream,
                code: ErrorCode::FlowControl,
                ..
            } if *stream == b
        )),
        "{events:?}"
    );
    assert!(server.contains(a) && !server.contains(b));
}
