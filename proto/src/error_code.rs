//! Error codes carried by DIAL_ERR and RESET frames.

/// Why a dial failed or a stream was reset. Unknown codes from a newer peer decode as
/// [`ErrorCode::Unknown`] so they can be logged and mapped to a generic failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// No more specific code applies.
    Other,
    /// The target refused the connection (TCP RST on SYN).
    Refused,
    /// No route to the target network or host.
    Unreachable,
    /// The dial did not finish before its deadline.
    TimedOut,
    /// The target's name could not be resolved.
    NameNotResolved,
    /// The agent's policy forbids this target.
    NotPermitted,
    /// The agent is draining and takes no new streams.
    Draining,
    /// The peer already carries as many streams as it allows.
    TooManyStreams,
    /// The opener gave up on the stream (its client went away or its deadline passed).
    Cancelled,
    /// The peer sent more DATA than the window allowed.
    FlowControl,
    /// A frame arrived that the stream's state does not allow (e.g. DATA after FIN).
    StreamState,
    /// The TCP connection at either end was reset or failed.
    ConnectionReset,
    /// The sender is shutting down.
    Shutdown,
    /// An internal error in the sender.
    Internal,
    /// The sender's memory budget for buffered tunnel data is spent: it takes no new streams
    /// until some of it drains.
    Overloaded,
    /// A code this implementation does not know.
    Unknown(u8),
}

impl ErrorCode {
    /// The wire value.
    pub fn to_u8(self) -> u8 {
        match self {
            ErrorCode::Other => 0,
            ErrorCode::Refused => 1,
            ErrorCode::Unreachable => 2,
            ErrorCode::TimedOut => 3,
            ErrorCode::NameNotResolved => 4,
            ErrorCode::NotPermitted => 5,
            ErrorCode::Draining => 6,
            ErrorCode::TooManyStreams => 7,
            ErrorCode::Cancelled => 8,
            ErrorCode::FlowControl => 9,
            ErrorCode::StreamState => 10,
            ErrorCode::ConnectionReset => 11,
            ErrorCode::Shutdown => 12,
            ErrorCode::Internal => 13,
            ErrorCode::Overloaded => 14,
            ErrorCode::Unknown(code) => code,
        }
    }

    /// Decodes a wire value; values this version does not define become [`ErrorCode::Unknown`].
    pub fn from_u8(code: u8) -> ErrorCode {
        match code {
            0 => ErrorCode::Other,
            1 => ErrorCode::Refused,
            2 => ErrorCode::Unreachable,
            3 => ErrorCode::TimedOut,
            4 => ErrorCode::NameNotResolved,
            5 => ErrorCode::NotPermitted,
            6 => ErrorCode::Draining,
            7 => ErrorCode::TooManyStreams,
            8 => ErrorCode::Cancelled,
            9 => ErrorCode::FlowControl,
            10 => ErrorCode::StreamState,
            11 => ErrorCode::ConnectionReset,
            12 => ErrorCode::Shutdown,
            13 => ErrorCode::Internal,
            14 => ErrorCode::Overloaded,
            other => ErrorCode::Unknown(other),
        }
    }

    /// A short lower-case name for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Other => "other",
            ErrorCode::Refused => "refused",
            ErrorCode::Unreachable => "unreachable",
            ErrorCode::TimedOut => "timed_out",
            ErrorCode::NameNotResolved => "name_not_resolved",
            ErrorCode::NotPermitted => "not_permitted",
            ErrorCode::Draining => "draining",
            ErrorCode::TooManyStreams => "too_many_streams",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::FlowControl => "flow_control",
            ErrorCode::StreamState => "stream_state",
            ErrorCode::ConnectionReset => "connection_reset",
            ErrorCode::Shutdown => "shutdown",
            ErrorCode::Internal => "internal",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Unknown(_) => "unknown",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorCode::Unknown(code) => write!(f, "unknown({code})"),
            other => f.write_str(other.as_str()),
        }
    }
}
