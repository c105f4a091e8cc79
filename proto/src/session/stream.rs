//! One stream's state inside a [`super::Session`].

use std::collections::VecDeque;

use bytes::Bytes;

use super::StreamError;
use crate::frame::StreamId;

/// Where the stream is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// DIAL sent (server) or received (agent), not answered yet. `deadline` is only tracked by
    /// the server.
    Dialing { deadline: u64 },
    /// Data may flow in each direction that has not finished.
    Open,
}

#[derive(Debug)]
pub(super) struct Stream {
    pub(super) phase: Phase,
    /// Bytes this end may still send.
    pub(super) send_credit: u64,
    /// This end sent FIN.
    pub(super) send_closed: bool,
    /// The peer sent FIN.
    pub(super) recv_closed: bool,
    /// Received data not read yet.
    pub(super) recv_buf: VecDeque<Bytes>,
    /// Bytes the peer may still send before it needs another grant.
    pub(super) recv_allowed: u64,
    /// Bytes read since the last grant.
    pub(super) unacked: u64,
    /// The session ended while this stream still held received data: it stays only until
    /// that data is read.
    pub(super) aborted: bool,
}

impl Stream {
    pub(super) fn new(phase: Phase, window: u32) -> Stream {
        Stream {
            phase,
            send_credit: 0,
            send_closed: false,
            recv_closed: false,
            recv_buf: VecDeque::new(),
            recv_allowed: u64::from(window),
            unacked: 0,
            aborted: false,
        }
    }

    pub(super) fn check_sendable(&self, stream: StreamId) -> Result<(), StreamError> {
        if !matches!(self.phase, Phase::Open) {
            Err(StreamError::NotOpen(stream))
        } else if self.send_closed {
            Err(StreamError::Finished(stream))
        } else {
            Ok(())
        }
    }

    pub(super) fn consumed(&mut self, len: usize) {
        self.unacked += len as u64;
    }

    /// A WINDOW increment to send, once half the window was read since the last one. No grant
    /// after the peer's FIN: it will send nothing more.
    pub(super) fn grant_due(&mut self, window: u32) -> Option<u32> {
        if self.recv_closed || self.unacked == 0 || self.unacked < u64::from(window / 2) {
            return None;
        }
        let increment = u32::try_from(self.unacked).unwrap_or(u32::MAX);
        self.unacked -= u64::from(increment);
        self.recv_allowed += u64::from(increment);
        Some(increment)
    }

    pub(super) fn finished(&self) -> bool {
        self.send_closed && self.recv_closed && self.recv_buf.is_empty()
    }
}
