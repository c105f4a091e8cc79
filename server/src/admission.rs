//! Admission: the bound on dials in flight (`--max-pending-dials`). A CONNECT that finds every
//! slot taken is refused at once with 503, before it is routed.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::refusal::Refusal;

/// The pending-dial slots, and the gauge that shows how many are taken.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    limit: usize,
    pending: Gauge,
}

/// One admitted dial; dropping it frees the slot.
#[derive(Debug)]
pub struct DialSlot {
    _permit: OwnedSemaphorePermit,
    pending: Gauge,
}

impl Admission {
    /// `limit` dials at once, counted in `pending`.
    pub fn new(limit: usize, pending: Gauge) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            pending,
        }
    }

    /// A slot for one dial, or [`Refusal::Overloaded`].
    pub fn admit(&self) -> Result<DialSlot, Refusal> {
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::Overloaded(self.limit))?;
        self.pending.inc();
        Ok(DialSlot {
            _permit: permit,
            pending: self.pending.clone(),
        })
    }
}

impl Drop for DialSlot {
    fn drop(&mut self) {
        self.pending.dec();
    }
}
