//! One shutdown tree per process, in two stages: stop (listeners close, sessions are asked
//! to drain, the work in flight gets the grace period) and end (whatever is left is closed).
//!
//! `end` is the root token and `stop` its child, so ending always stops too. Long-lived tasks
//! (listeners, sessions, watchers, the health and admin servers) are spawned on one tracker,
//! the work the grace period is for (connections and what they become) on another, and
//! [`Lifecycle::drain`] is the one place the grace period is applied. A binary whose work
//! also runs elsewhere (tunnels moved to a session's thread, counted by their own tracker)
//! hands that tracker in; it is waited for after the work, so what a connection hands over
//! on its way out is still waited for.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::timeouts::CLOSE;

/// The process's shutdown tree and its tasks.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    end: CancellationToken,
    stop: CancellationToken,
    tasks: TaskTracker,
    work: TaskTracker,
}

impl Default for Lifecycle {
    fn default() -> Lifecycle {
        Lifecycle::new()
    }
}

/// How the end went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// Everything closed within [`CLOSE`].
    pub in_time: bool,
    /// Long-lived tasks still running after it.
    pub left: usize,
}

impl Lifecycle {
    pub fn new() -> Lifecycle {
        let end = CancellationToken::new();
        Lifecycle {
            stop: end.child_token(),
            end,
            tasks: TaskTracker::new(),
            work: TaskTracker::new(),
        }
    }

    /// Cancelled when shutdown begins: listeners stop accepting.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Cancelled when the grace period is over: sessions and the work they carry close.
    pub fn end(&self) -> &CancellationToken {
        &self.end
    }

    /// Spawns a long-lived task, closed at the end.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// The tracker of long-lived tasks, for loops that spawn a task per session.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// The tracker of work the grace period waits for, for loops that spawn a task per
    /// connection.
    pub fn work(&self) -> &TaskTracker {
        &self.work
    }

    /// Stops, then waits up to `grace` for the work and then for `elsewhere` (closed here) to
    /// finish; true if they did.
    pub async fn drain(&self, grace: Duration, elsewhere: &TaskTracker) -> bool {
        self.stop.cancel();
        self.work.close();
        elsewhere.close();
        tokio::time::timeout(grace, async {
            self.work.wait().await;
            // Asked only now: a wait asked while `elsewhere` was empty would not see what the
            // work handed it since.
            elsewhere.wait().await;
        })
        .await
        .is_ok()
    }

    /// Ends: `end` cancelled, and everything (the work, `elsewhere`, the long-lived tasks)
    /// given [`CLOSE`] to close.
    pub async fn close(self, elsewhere: &TaskTracker) -> Closed {
        self.end.cancel();
        self.work.close();
        self.tasks.close();
        elsewhere.close();
        let in_time = tokio::time::timeout(CLOSE, async {
            self.work.wait().await;
            elsewhere.wait().await;
            self.tasks.wait().await;
        })
        .await
        .is_ok();
        Closed {
            in_time,
            left: self.tasks.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_gets_the_grace_period_and_tasks_end_after_it() {
        let lifecycle = Lifecycle::new();
        // A session: lives until the end, then closes.
        let end = lifecycle.end().clone();
        lifecycle.spawn(async move { end.cancelled().await });
        // A listener: stops with the stop.
        let stop = lifecycle.stop().clone();
        lifecycle.spawn(async move { stop.cancelled().await });
        // A connection that takes 3 s, and a tunnel elsewhere that takes 4 s.
        lifecycle
            .work()
            .spawn(tokio::time::sleep(Duration::from_secs(3)));
        let elsewhere = TaskTracker::new();
        elsewhere.spawn(tokio::time::sleep(Duration::from_secs(4)));
        let started = tokio::time::Instant::now();
        assert!(lifecycle.drain(Duration::from_secs(10), &elsewhere).await);
        assert_eq!(started.elapsed(), Duration::from_secs(4));
        assert!(lifecycle.stop().is_cancelled() && !lifecycle.end().is_cancelled());
        let closed = lifecycle.close(&elsewhere).await;
        assert_eq!(
            closed,
            Closed {
                in_time: true,
                left: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_grace_period_ends_the_wait_and_the_end_cuts_the_work() {
        let lifecycle = Lifecycle::new();
        let end = lifecycle.end().clone();
        lifecycle.work().spawn(async move { end.cancelled().await });
        let started = tokio::time::Instant::now();
        assert!(
            !lifecycle
                .drain(Duration::from_secs(2), &TaskTracker::new())
                .await
        );
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(lifecycle.work().len(), 1);
        let closed = lifecycle.close(&TaskTracker::new()).await;
        assert_eq!(
            closed,
            Closed {
                in_time: true,
                left: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ignores_the_end_is_reported_not_waited_for() {
        let lifecycle = Lifecycle::new();
        lifecycle.spawn(std::future::pending());
        assert!(
            lifecycle
                .drain(Duration::from_secs(1), &TaskTracker::new())
                .await
        );
        let closed = lifecycle.close(&TaskTracker::new()).await;
        assert_eq!(
            closed,
            Closed {
                in_time: false,
                left: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_the_work_hands_elsewhere_on_its_way_out_is_waited_for() {
        let lifecycle = Lifecycle::new();
        let elsewhere = TaskTracker::new();
        // A connection that, 1 s into the drain, hands a 2 s tunnel to another tracker and
        // ends: the drain sees `elsewhere` empty when it starts.
        let handed = elsewhere.clone();
        lifecycle.work().spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            handed.spawn(tokio::time::sleep(Duration::from_secs(2)));
        });
        let started = tokio::time::Instant::now();
        assert!(lifecycle.drain(Duration::from_secs(10), &elsewhere).await);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
