//! How many servers the agent looks for: the count the last new server announced in its
//! upgrade answer (`--server-count` on the servers), never below 1.

/// The server count as the agent knows it.
#[derive(Debug, Clone)]
pub(crate) struct ServerCount {
    from_responses: u32,
}

impl ServerCount {
    /// One server, until a server says otherwise.
    pub(crate) fn new() -> ServerCount {
        ServerCount { from_responses: 1 }
    }

    /// A new server announced `count`.
    pub(crate) fn received(&mut self, count: u32) {
        self.from_responses = count.max(1);
    }

    /// How many distinct servers to hold sessions with.
    pub(crate) fn count(&self) -> u32 {
        self.from_responses
    }
}
