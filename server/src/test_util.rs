//! What the server's unit tests share.

use std::time::Duration;

/// Every async test fails after this long instead of hanging the suite.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a test body under [`TEST_TIMEOUT`].
pub(crate) async fn bounded<F: std::future::Future>(body: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, body)
        .await
        .expect("test timed out")
}
