//! How many servers the agent looks for, never below 1: the count the last new server
//! announced in its upgrade answer (`--server-count` on the servers), or the number of valid
//! server Leases (`--count-server-leases`), or the larger of the two
//! (`--server-count-source=max`), as ANP's agent combines them; and never below the number of
//! servers `--proxy-server-host` resolves to, when it names several.

use bridgehead_kubeapi::leases::LeaseCount;

/// The server count as the agent knows it.
#[derive(Debug, Clone)]
pub(crate) struct ServerCount {
    from_responses: u32,
    /// Servers found by resolving `--proxy-server-host` (0: one address, a load balancer).
    found: u32,
    leases: Option<LeaseCount>,
    max_with_responses: bool,
}

impl ServerCount {
    /// One server, until a server says otherwise.
    pub(crate) fn new() -> ServerCount {
        ServerCount {
            from_responses: 1,
            found: 0,
            leases: None,
            max_with_responses: false,
        }
    }

    /// Counted by `leases`; with `max_with_responses`, by the larger of them and the answers.
    pub(crate) fn from_leases(leases: LeaseCount, max_with_responses: bool) -> ServerCount {
        ServerCount {
            leases: Some(leases),
            max_with_responses,
            ..ServerCount::new()
        }
    }

    /// A new server announced `count`.
    pub(crate) fn received(&mut self, count: u32) {
        self.from_responses = count.max(1);
    }

    /// `--proxy-server-host` resolved to `found` servers (0 for a single address).
    pub(crate) fn found(&mut self, found: u32) {
        self.found = found;
    }

    /// How many distinct servers to hold sessions with.
    pub(crate) fn count(&self) -> u32 {
        self.announced().max(self.found)
    }

    /// The count the servers' answers or the Leases give.
    fn announced(&self) -> u32 {
        let Some(leases) = &self.leases else {
            return self.from_responses;
        };
        let from_leases = u32::try_from(leases.count()).unwrap_or(u32::MAX).max(1);
        if self.max_with_responses {
            from_leases.max(self.from_responses)
        } else {
            from_leases
        }
    }
}
