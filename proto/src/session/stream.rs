//! One stream's state inside a [`super::Session`].

use std::collections::VecDeque;
use std::mem;

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
    pub(super) recv_buf: RecvBuf,
    /// Bytes the peer may still send before it needs another grant.
    pub(super) recv_allowed: u64,
    /// The receive window: bytes the peer may have sent beyond what was read before the
    /// last grant (`recv_allowed` + buffered + `unacked`).
    pub(super) window: u32,
    /// Bytes read since the last grant.
    pub(super) unacked: u64,
    /// Bytes read in all: what the stream earned its window with.
    pub(super) read_total: u64,
    /// Bytes taken from `recv_buf` that their reader has not released yet (still its
    /// memory, still in the window).
    pub(super) held: u64,
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
            recv_buf: RecvBuf::Empty,
            recv_allowed: u64::from(window),
            window,
            unacked: 0,
            read_total: 0,
            held: 0,
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
        self.read_total += len as u64;
    }

    /// A WINDOW increment to send, once the bytes the peer may still send or has sent unread
    /// are half of `target` or less: the increment brings them back to `target`, which
    /// becomes the window. A `target` smaller than the window shrinks it as the peer's bytes
    /// are read. No grant after the peer's FIN: it will send nothing more.
    pub(super) fn grant_due(&mut self, target: u32) -> Option<u32> {
        let outstanding = u64::from(self.window).saturating_sub(self.unacked);
        let target = u64::from(target);
        if self.recv_closed || self.unacked == 0 || outstanding > target - target / 2 {
            return None;
        }
        let increment = u32::try_from(target - outstanding).ok()?;
        self.window = target as u32;
        self.unacked = 0;
        self.recv_allowed += u64::from(increment);
        Some(increment)
    }

    pub(super) fn finished(&self) -> bool {
        self.send_closed && self.recv_closed && self.recv_buf.is_empty()
    }
}

/// The first capacity of a backlog's queue: the full DATA frames of one stream that a
/// 256 KiB WebSocket message (the mux writer's batch) carries.
const BACKLOG: usize = 4;

/// Received chunks not read yet, in order. A reader that keeps up finds at most one chunk at a
/// time, held inline; only a backlog of two or more takes a queue, and the queue goes once
/// the backlog is read, so an idle stream holds no allocation here.
#[derive(Debug, Default)]
pub(super) enum RecvBuf {
    #[default]
    Empty,
    One(Bytes),
    /// Never empty.
    Many(VecDeque<Bytes>),
}

impl RecvBuf {
    pub(super) fn is_empty(&self) -> bool {
        matches!(self, RecvBuf::Empty)
    }

    /// Bytes held.
    pub(super) fn len(&self) -> usize {
        match self {
            RecvBuf::Empty => 0,
            RecvBuf::One(chunk) => chunk.len(),
            RecvBuf::Many(queue) => queue.iter().map(Bytes::len).sum(),
        }
    }

    pub(super) fn push_back(&mut self, chunk: Bytes) {
        *self = match mem::take(self) {
            RecvBuf::Empty => RecvBuf::One(chunk),
            RecvBuf::One(first) => {
                let mut queue = VecDeque::with_capacity(BACKLOG);
                queue.extend([first, chunk]);
                RecvBuf::Many(queue)
            }
            RecvBuf::Many(mut queue) => {
                queue.push_back(chunk);
                RecvBuf::Many(queue)
            }
        };
    }

    pub(super) fn pop_front(&mut self) -> Option<Bytes> {
        match mem::take(self) {
            RecvBuf::Empty => None,
            RecvBuf::One(chunk) => Some(chunk),
            RecvBuf::Many(mut queue) => {
                let chunk = queue.pop_front();
                if !queue.is_empty() {
                    *self = RecvBuf::Many(queue);
                }
                chunk
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recv_buf_keeps_order_and_lets_a_drained_backlog_go() {
        let mut buf = RecvBuf::default();
        assert_eq!(buf.pop_front(), None);
        buf.push_back(Bytes::from_static(b"a"));
        assert!(
            matches!(buf, RecvBuf::One(_)),
            "one chunk waits inline: {buf:?}"
        );
        for chunk in [&b"b"[..], b"c", b""] {
            buf.push_back(Bytes::from_static(chunk));
        }
        assert_eq!(buf.pop_front().as_deref(), Some(&b"a"[..]));
        buf.push_back(Bytes::from_static(b"d"));
        let mut read = Vec::new();
        while let Some(chunk) = buf.pop_front() {
            read.push(chunk);
        }
        assert_eq!(read, [&b"b"[..], b"c", b"", b"d"]);
        assert!(matches!(buf, RecvBuf::Empty), "the queue stayed: {buf:?}");
        assert!(buf.is_empty());
    }
}
