//! Admission: the bounds on dials in flight, in total (`--max-pending-dials`) and per CONNECT
//! client (`--max-pending-dials-per-client`), so that one client cannot take every slot. A
//! CONNECT past either bound is refused at once with 503, before it is routed. (The bound per
//! agent is the router's: an agent with its limit of dials pending is skipped.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::routing::refusal::Refusal;

/// The pending-dial slots, and the gauge that shows how many are taken.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    limit: usize,
    per_client: usize,
    clients: Arc<Mutex<HashMap<Arc<[u8]>, usize>>>,
    pending: Gauge,
}

/// A CONNECT client, for the per-client bound: its certificate (DER), or one key for every
/// Unix-socket client.
pub type ClientKey = Arc<[u8]>;

/// One admitted dial; dropping it frees the slot.
#[derive(Debug)]
pub struct DialSlot {
    _permit: OwnedSemaphorePermit,
    client: Arc<[u8]>,
    clients: Arc<Mutex<HashMap<Arc<[u8]>, usize>>>,
    pending: Gauge,
}

impl Admission {
    /// `limit` dials at once, `per_client` of them for one client, counted in `pending`.
    pub fn new(limit: usize, per_client: usize, pending: Gauge) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            per_client,
            clients: Arc::default(),
            pending,
        }
    }

    /// A slot for one dial of `client`, or [`Refusal::Overloaded`] /
    /// [`Refusal::ClientOverloaded`].
    pub fn admit(&self, client: &Arc<[u8]>) -> Result<DialSlot, Refusal> {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let held = clients.get(client).copied().unwrap_or(0);
        if held >= self.per_client {
            return Err(Refusal::ClientOverloaded(self.per_client));
        }
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::Overloaded(self.limit))?;
        clients.insert(client.clone(), held + 1);
        drop(clients);
        self.pending.inc();
        Ok(DialSlot {
            _permit: permit,
            client: client.clone(),
            clients: self.clients.clone(),
            pending: self.pending.clone(),
        })
    }
}

impl Drop for DialSlot {
    fn drop(&mut self) {
        self.pending.dec();
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(held) = clients.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_cannot_take_every_slot() {
        let admission = Admission::new(3, 2, Gauge::default());
        let (a, b): (Arc<[u8]>, Arc<[u8]>) = (b"a".as_slice().into(), b"b".as_slice().into());
        let first = admission.admit(&a).unwrap();
        let _second = admission.admit(&a).unwrap();
        assert!(matches!(
            admission.admit(&a),
            Err(Refusal::ClientOverloaded(2))
        ));
        let _third = admission.admit(&b).unwrap();
        assert!(matches!(admission.admit(&b), Err(Refusal::Overloaded(3))));
        drop(first);
        let _again = admission.admit(&a).unwrap();
        assert_eq!(admission.pending.get(), 3);
        // The client holds two again: its own bound refuses it, before the total's.
        assert!(matches!(
            admission.admit(&a),
            Err(Refusal::ClientOverloaded(2))
        ));
    }
}
