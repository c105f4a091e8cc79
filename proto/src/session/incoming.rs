//! Frames from the peer: [`Session::handle_frame`] and the checks it makes.

use bytes::Bytes;

use crate::frame::{Frame, StreamId};
use crate::ErrorCode;

use super::stream::{Phase, Stream};
use super::{Event, Role, Session, SessionError, MAX_CREDIT};

impl Session {
    /// Applies one frame from the peer.
    pub fn handle_frame(&mut self, frame: Frame) -> Result<(), SessionError> {
        let role = self.config.role;
        match frame {
            Frame::Dial {
                stream,
                timeout_ms,
                window,
                port,
                host,
            } => {
                if role != Role::Agent {
                    return Err(SessionError::WrongDirection("DIAL", role));
                }
                self.on_dial(stream, timeout_ms, window, port, host)?;
            }
            Frame::DialOk { stream, window } => {
                if role != Role::Server {
                    return Err(SessionError::WrongDirection("DIAL_OK", role));
                }
                self.on_dial_ok(stream, window)?;
            }
            Frame::DialErr {
                stream,
                code,
                message,
            } => {
                if role != Role::Server {
                    return Err(SessionError::WrongDirection("DIAL_ERR", role));
                }
                self.on_dial_err(stream, code, message)?;
            }
            Frame::Data { stream, payload } => self.on_data(stream, payload)?,
            Frame::Window { stream, increment } => self.on_window(stream, increment)?,
            Frame::Fin { stream } => self.on_fin(stream)?,
            Frame::Reset {
                stream,
                code,
                reason,
            } => self.on_reset(stream, code, reason)?,
            Frame::Drain => {
                if !self.peer_draining {
                    self.peer_draining = true;
                    self.events.push_back(Event::PeerDraining);
                }
            }
        }
        Ok(())
    }

    /// Agent: the server asks for a dial.
    fn on_dial(
        &mut self,
        stream: StreamId,
        timeout_ms: u32,
        window: u32,
        port: u16,
        host: String,
    ) -> Result<(), SessionError> {
        if stream <= self.last_id {
            return Err(SessionError::StreamIdReused(stream, self.last_id));
        }
        self.last_id = stream;
        if u64::from(window) > MAX_CREDIT {
            self.refuse(
                stream,
                ErrorCode::FlowControl,
                "DIAL grants more than the 16 MiB of credit a peer may hold",
            );
        } else if self.draining {
            self.refuse(stream, ErrorCode::Draining, "the agent is draining");
        } else if self.streams.len() >= self.config.max_streams {
            self.refuse(
                stream,
                ErrorCode::TooManyStreams,
                "the agent carries its limit of streams",
            );
        } else if !self.config.budget.admit() {
            self.refuse(
                stream,
                ErrorCode::Overloaded,
                "overloaded: the agent's --tunnel-memory-budget is spent",
            );
        } else {
            let own = self
                .config
                .budget
                .initial_window(self.config.initial_window);
            let mut state = Stream::new(Phase::Dialing { deadline: 0 }, own);
            state.send_credit = u64::from(window);
            self.streams.insert(stream, Box::new(state));
            self.events.push_back(Event::DialRequested {
                stream,
                host,
                port,
                timeout_ms,
                window,
            });
        }
        Ok(())
    }

    /// Server: the agent's dial succeeded.
    fn on_dial_ok(&mut self, stream: StreamId, window: u32) -> Result<(), SessionError> {
        let Some(state) = self.known(stream)? else {
            return Ok(());
        };
        let Phase::Dialing { deadline } = state.phase else {
            self.violation(stream, "DIAL_OK for a stream that is already open");
            return Ok(());
        };
        state.phase = Phase::Open;
        state.send_credit = u64::from(window);
        self.timers.dials.remove(&(deadline, stream));
        if u64::from(window) > MAX_CREDIT {
            let reason = "DIAL_OK grants more than the 16 MiB of credit a peer may hold";
            self.reset_stream(stream, ErrorCode::FlowControl, reason, false);
            self.events.push_back(Event::DialFailed {
                stream,
                code: ErrorCode::FlowControl,
                message: reason.to_owned(),
                expired: false,
            });
            return Ok(());
        }
        self.events.push_back(Event::Opened { stream });
        Ok(())
    }

    /// Server: the agent's dial failed.
    fn on_dial_err(
        &mut self,
        stream: StreamId,
        code: ErrorCode,
        message: String,
    ) -> Result<(), SessionError> {
        let Some(state) = self.known(stream)? else {
            return Ok(());
        };
        let Phase::Dialing { deadline } = state.phase else {
            self.violation(stream, "DIAL_ERR for a stream that is already open");
            return Ok(());
        };
        self.timers.dials.remove(&(deadline, stream));
        self.discard(stream);
        self.events.push_back(Event::DialFailed {
            stream,
            code,
            message,
            expired: false,
        });
        Ok(())
    }

    fn on_data(&mut self, stream: StreamId, payload: Bytes) -> Result<(), SessionError> {
        let Some(state) = self.known(stream)? else {
            return Ok(());
        };
        if !matches!(state.phase, Phase::Open) {
            self.violation(stream, "DATA before the dial was answered");
        } else if state.recv_closed {
            self.violation(stream, "DATA after FIN");
        } else if payload.len() as u64 > state.recv_allowed {
            let reason = format!(
                "DATA of {} bytes exceeds the {} bytes of credit granted",
                payload.len(),
                state.recv_allowed
            );
            self.reset_stream(stream, ErrorCode::FlowControl, &reason, false);
        } else {
            let len = payload.len();
            state.recv_allowed -= len as u64;
            let was_empty = state.recv_buf.is_empty();
            state.recv_buf.push_back(payload);
            if was_empty {
                self.events.push_back(Event::Readable { stream });
            }
            self.buffer(len);
        }
        Ok(())
    }

    fn on_window(&mut self, stream: StreamId, increment: u32) -> Result<(), SessionError> {
        let Some(state) = self.known(stream)? else {
            return Ok(());
        };
        if state.send_closed {
            return Ok(());
        }
        let before = state.send_credit;
        state.send_credit += u64::from(increment);
        if state.send_credit > MAX_CREDIT {
            let reason = "WINDOW takes the credit above the 16 MiB a peer may hold";
            self.reset_stream(stream, ErrorCode::FlowControl, reason, false);
        } else if before == 0 && matches!(state.phase, Phase::Open) {
            self.events.push_back(Event::Writable { stream });
        }
        Ok(())
    }

    fn on_fin(&mut self, stream: StreamId) -> Result<(), SessionError> {
        let Some(state) = self.known(stream)? else {
            return Ok(());
        };
        if !matches!(state.phase, Phase::Open) {
            self.violation(stream, "FIN before the dial was answered");
        } else if state.recv_closed {
            self.violation(stream, "a second FIN");
        } else {
            state.recv_closed = true;
            if state.recv_buf.is_empty() {
                self.events.push_back(Event::Readable { stream });
            }
            self.maybe_close(stream);
        }
        Ok(())
    }

    fn on_reset(
        &mut self,
        stream: StreamId,
        code: ErrorCode,
        reason: String,
    ) -> Result<(), SessionError> {
        if self.known(stream)?.is_none() {
            return Ok(());
        }
        let state = self.remove(stream);
        if let Some(Phase::Dialing { .. }) = state.map(|s| s.phase) {
            if self.config.role == Role::Server {
                self.events.push_back(Event::DialFailed {
                    stream,
                    code,
                    message: reason,
                    expired: false,
                });
                return Ok(());
            }
        }
        self.events.push_back(Event::Reset {
            stream,
            code,
            reason,
            by_peer: true,
        });
        Ok(())
    }

    /// The live stream `stream`, `None` for one that existed and is closed (frames for it are
    /// ignored: they may cross a RESET), or an error for an id never opened.
    fn known(&mut self, stream: StreamId) -> Result<Option<&mut Stream>, SessionError> {
        if stream > self.last_id {
            return Err(SessionError::UnknownStream(stream));
        }
        Ok(self.streams.get_mut(&stream).map(|state| &mut **state))
    }

    fn refuse(&mut self, stream: StreamId, code: ErrorCode, message: &str) {
        self.control.push_back(Frame::DialErr {
            stream,
            code,
            message: message.to_owned(),
        });
    }

    fn violation(&mut self, stream: StreamId, reason: &str) {
        self.reset_stream(stream, ErrorCode::StreamState, reason, false);
    }
}
