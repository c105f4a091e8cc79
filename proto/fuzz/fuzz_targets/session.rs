//! Sequences of operations against the stream state machine, in the style of quinn's
//! `fuzz/streams.rs`.
//!
//! The first byte picks the mode:
//! - even: a server and an agent session joined by frame queues, driven by the operations the
//!   remaining bytes spell. Two correct peers must never see a session error or reset each
//!   other for a protocol violation (so no sender exceeds its credit), and every byte read
//!   continues what was sent on that stream, in order. Reads may hold their chunks and release
//!   them later, as the splice does. With the mode's second bit, the windows adapt (64 KiB to
//!   start, earned up to 256 KiB) under a small budget both sessions share, whose count must
//!   always equal what the two sessions hold.
//! - odd: the remaining bytes are decoded as frames and fed to one session (role from the
//!   second bit), interleaved with local operations. Nothing may panic.

#![no_main]

use std::collections::{HashMap, VecDeque};

use bridgehead_proto::budget::Budget;
use bridgehead_proto::session::{Event, ReadOutcome, Role, Session, SessionConfig};
use bridgehead_proto::{ErrorCode, Frame, StreamId};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let budget = (mode & 2 != 0).then(|| Budget::new(u64::from(mode) * 4096 + 1));
        pair(u32::from(mode) * 64 + 1, budget, rest);
    } else {
        hostile(mode & 2 == 0, rest);
    }
});

fn config(role: Role, window: u32) -> SessionConfig {
    SessionConfig {
        initial_window: window,
        max_window: window,
        max_streams: 8,
        ..SessionConfig::new(role)
    }
}

fn pattern(stream: StreamId, offset: u64) -> u8 {
    (offset.wrapping_mul(7).wrapping_add(u64::from(stream)) % 253) as u8
}

fn pair(window: u32, budget: Option<Budget>, ops: &[u8]) {
    let configured = |role| match &budget {
        Some(budget) => SessionConfig {
            budget: budget.clone(),
            max_streams: 8,
            ..SessionConfig::new(role)
        },
        None => config(role, window),
    };
    let mut sessions = [
        Session::new(configured(Role::Server)),
        Session::new(configured(Role::Agent)),
    ];
    let mut held: [HashMap<StreamId, usize>; 2] = [HashMap::new(), HashMap::new()];
    let mut wires: [VecDeque<Frame>; 2] = [VecDeque::new(), VecDeque::new()];
    let mut streams: [Vec<StreamId>; 2] = [Vec::new(), Vec::new()];
    let mut sent: [HashMap<StreamId, u64>; 2] = [HashMap::new(), HashMap::new()];
    let mut read: [HashMap<StreamId, u64>; 2] = [HashMap::new(), HashMap::new()];
    let mut dials = VecDeque::new();
    let mut now = 0u64;
    for chunk in ops.chunks(2) {
        let (op, arg) = (chunk[0], *chunk.get(1).unwrap_or(&0));
        let side = usize::from(op & 1);
        let pick =
            |list: &Vec<StreamId>| (!list.is_empty()).then(|| list[usize::from(arg) % list.len()]);
        match op >> 1 & 7 {
            0 => {
                if let Ok(id) = sessions[0].open("t", 1, 1000, now) {
                    streams[0].push(id);
                }
            }
            1 => {
                if let Some(id) = dials.pop_front() {
                    if arg & 1 == 0 && sessions[1].dial_succeeded(id).is_ok() {
                        streams[1].push(id);
                    } else {
                        sessions[1].dial_failed(id, ErrorCode::Refused, "no");
                    }
                }
            }
            2 | 3 => {
                let to = 1 - side;
                for _ in 0..=arg % 8 {
                    let Some(frame) = wires[side].pop_front() else {
                        break;
                    };
                    sessions[to]
                        .handle_frame(frame)
                        .expect("no session error between correct peers");
                }
            }
            4 => {
                if let Some(id) = pick(&streams[side]) {
                    let offset = *sent[side].get(&id).unwrap_or(&0);
                    let data: Bytes = (0..u64::from(arg) * 37)
                        .map(|i| pattern(id, offset + i))
                        .collect();
                    if let Ok(n) = sessions[side].send(id, data) {
                        *sent[side].entry(id).or_default() += n as u64;
                    }
                }
            }
            5 if arg >= 0xc0 => {
                if let Some(id) = pick(&streams[side]) {
                    let len = held[side].remove(&id).unwrap_or(0);
                    sessions[side].release(id, len);
                }
            }
            5 => {
                if let Some(id) = pick(&streams[side]) {
                    let outcome = if arg & 1 == 1 {
                        let outcome = sessions[side].read_held(id);
                        if let ReadOutcome::Data(chunk) = &outcome {
                            *held[side].entry(id).or_default() += chunk.len();
                        }
                        outcome
                    } else {
                        sessions[side].read(id)
                    };
                    if let ReadOutcome::Data(chunk) = outcome {
                        let offset = read[side].entry(id).or_default();
                        for (i, byte) in chunk.iter().enumerate() {
                            assert_eq!(*byte, pattern(id, *offset + i as u64), "stream {id}");
                        }
                        *offset += chunk.len() as u64;
                    }
                }
            }
            6 => {
                if let Some(id) = pick(&streams[side]) {
                    if arg & 1 == 0 {
                        let _ = sessions[side].finish(id);
                    } else {
                        sessions[side].reset(id, ErrorCode::Cancelled, "fuzz");
                    }
                }
            }
            _ => {
                now += u64::from(arg) * 10;
                sessions[0].handle_timeout(now);
            }
        }
        for side in 0..2 {
            while let Some(frame) = sessions[side].poll_transmit() {
                wires[side].push_back(frame);
            }
            while let Some(event) = sessions[side].poll_event() {
                match event {
                    Event::DialRequested { stream, .. } => dials.push_back(stream),
                    Event::Reset {
                        stream,
                        code,
                        by_peer,
                        ..
                    } => {
                        assert!(
                            by_peer
                                || !matches!(code, ErrorCode::FlowControl | ErrorCode::StreamState),
                            "violation between correct peers: {code}"
                        );
                        streams[side].retain(|s| *s != stream);
                        dials.retain(|s| *s != stream);
                    }
                    Event::DialFailed { stream, .. } | Event::Closed { stream } => {
                        streams[side].retain(|s| *s != stream);
                    }
                    _ => {}
                }
            }
        }
        if let Some(budget) = &budget {
            assert_eq!(
                budget.buffered(),
                sessions[0].buffered() + sessions[1].buffered(),
                "the budget's count drifted from what the sessions hold"
            );
        }
    }
    drop(sessions);
    if let Some(budget) = &budget {
        assert_eq!(
            budget.buffered(),
            0,
            "bytes left in the budget by dropped sessions"
        );
    }
}

fn hostile(agent: bool, data: &[u8]) {
    let role = if agent { Role::Agent } else { Role::Server };
    let mut session = Session::new(config(role, 512));
    for _ in 0..3 {
        let _ = session.open("t", 1, 100, 0);
    }
    let mut rest = Bytes::copy_from_slice(data);
    let mut now = 0;
    while let Ok(frame) = Frame::decode_one(&mut rest) {
        if session.handle_frame(frame).is_err() {
            return;
        }
        while session.poll_event().is_some() {}
        for id in 0..5 {
            let _ = session.read(id);
            let _ = session.send(id, Bytes::from_static(b"xyz"));
            if id == 4 {
                let _ = session.finish(id);
            }
        }
        let _ = session.dial_succeeded(1);
        now += 40;
        session.handle_timeout(now);
        while session.poll_transmit().is_some() {}
    }
    session.abort("fuzz end");
    for id in 0..5 {
        let _ = session.read(id);
    }
}
