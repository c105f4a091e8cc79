//! The frontend's pre-authentication bound: at most `limit` CONNECT clients in their handshake
//! at once. When a new connection finds every place taken, the oldest handshake is cut to make
//! room: a flood of connections that never finish (a slowloris) then holds the server to
//! `limit` descriptors and tasks without locking honest clients out, since an honest
//! handshake finishes in a millisecond or two, long before it is the oldest.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// The handshakes in progress on one listener.
#[derive(Debug, Clone)]
pub struct Handshakes {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    /// Oldest first: an id and the token that cuts the handshake.
    running: Mutex<(u64, VecDeque<(u64, CancellationToken)>)>,
}

/// One connection's place; cancelled when it is cut, released on drop.
#[derive(Debug)]
pub struct Handshake {
    id: u64,
    cut: CancellationToken,
    handshakes: Arc<Inner>,
}

impl Handshakes {
    pub fn new(limit: usize) -> Handshakes {
        Handshakes {
            inner: Arc::new(Inner {
                limit,
                running: Mutex::new((0, VecDeque::new())),
            }),
        }
    }

    /// A place for a new connection's handshake, and whether an older one had to be cut for
    /// it.
    pub fn begin(&self) -> (Handshake, bool) {
        let mut running = self.lock();
        let (next, queue) = &mut *running;
        let mut evicted = false;
        while queue.len() >= self.inner.limit {
            if let Some((_, cut)) = queue.pop_front() {
                cut.cancel();
                evicted = true;
            }
        }
        let id = *next;
        *next += 1;
        let cut = CancellationToken::new();
        queue.push_back((id, cut.clone()));
        (
            Handshake {
                id,
                cut,
                handshakes: self.inner.clone(),
            },
            evicted,
        )
    }

    /// Handshakes in progress.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().1.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, VecDeque<(u64, CancellationToken)>)> {
        self.inner
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Handshake {
    /// Resolves when a newer connection needed this place.
    pub async fn cut(&self) {
        self.cut.cancelled().await;
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        let mut running = self
            .handshakes
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(at) = running.1.iter().position(|(id, _)| *id == self.id) {
            running.1.remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handshake_makes_room() {
        let handshakes = Handshakes::new(2);
        let (first, evicted) = handshakes.begin();
        assert!(!evicted);
        let (second, _) = handshakes.begin();
        let (third, evicted) = handshakes.begin();
        assert!(evicted && first.cut.is_cancelled());
        assert!(!second.cut.is_cancelled() && !third.cut.is_cancelled());
        assert_eq!(handshakes.len(), 2);
        drop(second);
        assert_eq!(handshakes.len(), 1);
        let (_fourth, evicted) = handshakes.begin();
        assert!(!evicted, "a finished handshake left room");
        drop(first);
        assert_eq!(handshakes.len(), 2);
    }

    #[test]
    fn a_dropped_handshake_leaves_nothing() {
        let handshakes = Handshakes::new(1);
        assert_eq!(handshakes.len(), 0);
        drop(handshakes.begin());
        assert_eq!(handshakes.len(), 0);
    }
}
