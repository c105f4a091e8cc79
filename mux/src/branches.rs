//! Several futures of one task, each polled only when its own waker fired.
//!
//! `tokio::select!` (and `join!`) polls every branch whenever the task wakes. The session's
//! driver is a few futures (reader, writer, timer, work beside), and most wake-ups are for one
//! of them: the transport became readable, or a stream queued frames. Polling the others costs
//! a TLS read that finds nothing, a pass over the transmit queue, a lock round trip each (a
//! large share of what a 64-byte round trip costs the driver; docs/benchmarks.md). Work beside
//! the session (waiting for a drain, the agent's accept loop) would be polled on every wake-up
//! as well. Here each branch gets a waker of its own that marks it and wakes the task; a poll
//! of the task polls the marked branches only.
//!
//! A branch that ends without deciding the outcome must not be polled again: fuse it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// `N` branches of one task; see the module documentation.
#[derive(Debug)]
pub(crate) struct Branches<const N: usize> {
    shared: Arc<Marks<N>>,
    wakers: [Waker; N],
}

#[derive(Debug)]
struct Marks<const N: usize> {
    /// The task polling the branches.
    task: AtomicWaker,
    /// Branches woken since their last poll.
    woken: [AtomicBool; N],
}

/// The waker handed to one branch.
#[derive(Debug)]
struct BranchWaker<const N: usize> {
    marks: Arc<Marks<N>>,
    index: usize,
}

impl<const N: usize> Wake for BranchWaker<N> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.marks.woken[self.index].store(true, Ordering::Release);
        self.marks.task.wake();
    }
}

impl<const N: usize> Default for Branches<N> {
    fn default() -> Branches<N> {
        Branches::new()
    }
}

impl<const N: usize> Branches<N> {
    /// Every branch starts marked: the first poll polls them all.
    pub(crate) fn new() -> Branches<N> {
        let shared = Arc::new(Marks {
            task: AtomicWaker::new(),
            woken: std::array::from_fn(|_| AtomicBool::new(true)),
        });
        let wakers = std::array::from_fn(|index| {
            Waker::from(Arc::new(BranchWaker {
                marks: shared.clone(),
                index,
            }))
        });
        Branches { shared, wakers }
    }

    /// Calls `poll(i, cx)` for each branch `i` woken since its last poll, in order, with a
    /// context of that branch's waker; the first `Ready` ends the round and is returned.
    pub(crate) fn poll<T>(
        &self,
        cx: &mut Context<'_>,
        mut poll: impl FnMut(usize, &mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        // Before the marks are read: a wake-up after a mark was cleared then finds this task.
        self.shared.task.register(cx.waker());
        for (index, waker) in self.wakers.iter().enumerate() {
            if self.shared.woken[index].swap(false, Ordering::Acquire) {
                let mut branch = Context::from_waker(waker);
                if let Poll::Ready(value) = poll(index, &mut branch) {
                    return Poll::Ready(value);
                }
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::future::{poll_fn, Future};
    use std::pin::pin;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;

    /// Counts its polls; ready once `notify` fired `ready_after` times.
    async fn counted(notify: &Notify, polls: &AtomicUsizeCell, ready_after: usize) -> usize {
        let mut fired = 0;
        loop {
            let notified = notify.notified();
            let mut notified = pin!(notified);
            poll_fn(|cx| {
                polls.bump();
                notified.as_mut().poll(cx)
            })
            .await;
            fired += 1;
            if fired == ready_after {
                return fired;
            }
        }
    }

    #[derive(Debug, Default)]
    struct AtomicUsizeCell(std::sync::atomic::AtomicUsize);

    impl AtomicUsizeCell {
        fn bump(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn get(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    #[tokio::test]
    async fn only_the_woken_branch_is_polled_again() {
        let (a, b) = (Notify::new(), Notify::new());
        let (polls_a, polls_b) = (AtomicUsizeCell::default(), AtomicUsizeCell::default());
        let branches = Branches::<2>::new();
        let run = async {
            let mut fa = pin!(counted(&a, &polls_a, 3));
            let mut fb = pin!(counted(&b, &polls_b, 1));
            poll_fn(|cx| {
                branches.poll(cx, |i, cx| match i {
                    0 => fa.as_mut().poll(cx).map(|n| ('a', n)),
                    _ => fb.as_mut().poll(cx).map(|n| ('b', n)),
                })
            })
            .await
        };
        let drive = async {
            for _ in 0..3 {
                tokio::task::yield_now().await;
                a.notify_one();
            }
            std::future::pending::<()>().await
        };
        let ended = tokio::select! {
            ended = run => ended,
            () = drive => unreachable!(),
        };
        assert_eq!(ended, ('a', 3));
        // `a` was polled at the start and again for each of its wake-ups; `b` only at the
        // start, though the task woke for every one of `a`'s and for `drive`'s yields.
        assert!(polls_a.get() > 3, "a was polled {} times", polls_a.get());
        assert_eq!(polls_b.get(), 1);
    }

    #[tokio::test]
    async fn a_wake_from_another_thread_reaches_its_branch() {
        let notify = Arc::new(Notify::new());
        let polls = AtomicUsizeCell::default();
        let branches = Branches::<3>::new();
        let waker = notify.clone();
        // Before or during the wait: either way the branch must be polled and finish.
        let far = std::thread::spawn(move || waker.notify_one());
        let mut fut = pin!(counted(&notify, &polls, 1));
        let ended = poll_fn(|cx| {
            branches.poll(cx, |i, cx| match i {
                1 => fut.as_mut().poll(cx),
                _ => Poll::Pending,
            })
        });
        let ended = tokio::time::timeout(Duration::from_secs(10), ended).await;
        far.join().unwrap();
        assert_eq!(ended, Ok(1));
    }
}
