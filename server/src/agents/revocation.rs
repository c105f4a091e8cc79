//! Sessions let in by a locally verified token end when that token stops being valid: its pod
//! deleted (a DaemonSet pod replaced, a node drained), its service account deleted. TokenReview
//! offers no such signal; the local verifier's watches do. The sessions whose tokens were
//! verified locally are kept here with what the token said; after each deletion the watches
//! report (gathered for a moment, so a rollout's many deletions cost one pass) and every
//! [`RECHECK`] (a pod marked for deletion turns invalid a minute after its mark, with no event
//! then), each is rechecked, and one whose pod or account is gone is closed with the reason.
//!
//! What this leaves out: sessions let in by TokenReview (nothing to recheck them against) or
//! by certificate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bridgehead_kubeapi::serviceaccount::{TokenVerifier, Verified};
use bridgehead_mux::Mux;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::routing::router::AgentKey;

/// How often every session is rechecked without a deletion.
pub const RECHECK: Duration = Duration::from_secs(10);
/// How long deletions are gathered before a pass.
const GATHER: Duration = Duration::from_millis(200);

/// The sessions whose tokens were verified locally.
#[derive(Debug, Default)]
pub struct Revocation {
    sessions: Mutex<HashMap<AgentKey, (Arc<Verified>, Mux)>>,
}

impl Revocation {
    /// Session `key` (on `mux`) was let in by `verified`.
    pub fn watch(&self, key: AgentKey, verified: Verified, mux: Mux) {
        self.lock().insert(key, (Arc::new(verified), mux));
    }

    /// Session `key` ended.
    pub fn forget(&self, key: AgentKey) {
        self.lock().remove(&key);
    }

    /// Rechecks the sessions after deletions and every [`RECHECK`] until `stop`.
    pub async fn run(self: Arc<Self>, verifier: TokenVerifier, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = verifier.revoked() => {
                    tokio::select! {
                        () = tokio::time::sleep(GATHER) => {}
                        () = stop.cancelled() => return,
                    }
                }
                () = tokio::time::sleep(RECHECK) => {}
                () = stop.cancelled() => return,
            }
            self.recheck(&verifier);
        }
    }

    /// Closes every session whose token the verifier now refuses; returns how many.
    pub fn recheck(&self, verifier: &TokenVerifier) -> usize {
        let sessions: Vec<(AgentKey, Arc<Verified>, Mux)> = self
            .lock()
            .iter()
            .map(|(key, (verified, mux))| (*key, verified.clone(), mux.clone()))
            .collect();
        let mut closed = 0;
        for (key, verified, mux) in sessions {
            if let Some(refusal) = verifier.recheck(&verified) {
                info!(
                    pod = %verified.pod.name,
                    reason = %refusal,
                    "closing an agent session: its token is no longer valid"
                );
                mux.close("the agent's token is no longer valid");
                self.forget(key);
                closed += 1;
            }
        }
        closed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<AgentKey, (Arc<Verified>, Mux)>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
