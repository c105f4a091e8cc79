//! The Kubernetes API as both binaries use it, kube-rs and the API types kept behind a few
//! plain functions: a client paced and bounded ([`KubeApi`]), label syntax ([`labels`]), the
//! Leases that count the servers ([`leases`]: the server's own, renewed, the expired ones of
//! others removed; the agent's count of the valid ones), and the local verification of agents'
//! ServiceAccount tokens ([`serviceaccount`]: issuer keys, claims, and watches of the pods the
//! tokens are bound to), and the client's flags both binaries take ([`args`]).
//!
//! The client is built from a kubeconfig, or from the pod's in-cluster configuration when there
//! is none (as client-go does). Requests are paced by a token bucket (`--kubeconfig-qps`,
//! `--kubeconfig-burst`, as client-go's rate limiter) and each one is bounded by
//! [`REQUEST_TIMEOUT`]: kube-apiserver being slow or gone is an [`ApiError`], never a hang.

pub mod args;
pub mod labels;
pub mod leases;
pub mod requests;
pub mod serviceaccount;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::time::Instant;

pub use requests::RequestCounts;

pub use k8s_openapi;
pub use kube;

/// Longest wait for one answer from kube-apiserver.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// client-go's defaults, taken when the flags are 0.
const DEFAULT_QPS: f64 = 5.0;
const DEFAULT_BURST: u32 = 10;

/// Why the API gave no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error("loading the Kubernetes client configuration: {0}")]
    Config(String),
    #[error("kube-apiserver: {0}")]
    Request(String),
    /// kube-apiserver answered with an error status.
    #[error("kube-apiserver answered {code}: {message}")]
    Status { code: u16, message: String },
    #[error("kube-apiserver did not answer within {0:?}")]
    TimedOut(Duration),
}

/// A client of the Kubernetes API, paced.
pub struct KubeApi {
    client: Client,
    bucket: Mutex<Bucket>,
    requests: RequestCounts,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi").finish_non_exhaustive()
    }
}

impl KubeApi {
    /// A client from `kubeconfig` (its current context), or the in-cluster configuration when
    /// `None`; `qps` and `burst` 0 take client-go's defaults.
    pub async fn connect(
        kubeconfig: Option<&Path>,
        qps: f32,
        burst: u32,
    ) -> Result<KubeApi, ApiError> {
        let config = match kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path)
                    .map_err(|e| ApiError::Config(format!("{}: {e}", path.display())))?;
                Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| ApiError::Config(format!("{}: {e}", path.display())))?
            }
            None => Config::incluster()
                .map_err(|e| ApiError::Config(format!("in-cluster configuration: {e}")))?,
        };
        KubeApi::with_config(config, qps, burst)
    }

    /// A client from a configuration made elsewhere (tests, a server with its own
    /// discovery of the API); `qps` and `burst` as for [`KubeApi::connect`].
    pub fn with_config(config: Config, qps: f32, burst: u32) -> Result<KubeApi, ApiError> {
        let requests = RequestCounts::default();
        let counted = requests.clone();
        // Every request of the client, paced or not (watches, discovery), is counted here.
        let client = ClientBuilder::try_from(config)
            .map_err(|e| ApiError::Config(e.to_string()))?
            .with_layer(&tower::util::MapRequestLayer::new(
                move |request: http::Request<kube::client::Body>| {
                    counted.count(request.method(), request.uri());
                    request
                },
            ))
            .build();
        let qps = if qps > 0.0 {
            f64::from(qps)
        } else {
            DEFAULT_QPS
        };
        let burst = if burst > 0 { burst } else { DEFAULT_BURST };
        Ok(KubeApi {
            client,
            bucket: Mutex::new(Bucket::new(qps, burst)),
            requests,
        })
    }

    /// The underlying client, for [`kube::Api`] handles.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The requests this client made so far, by verb and resource.
    pub fn requests(&self) -> RequestCounts {
        self.requests.clone()
    }

    /// How long a request made now would wait for the rate limit.
    pub fn queue_wait(&self) -> Duration {
        self.bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .wait(Instant::now())
    }

    /// Paces, bounds and maps one request.
    pub async fn call<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        let wait = self
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take(Instant::now());
        tokio::time::sleep(wait).await;
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(kube::Error::Api(status))) => Err(ApiError::Status {
                code: status.code,
                message: status.message.clone(),
            }),
            Ok(Err(error)) => Err(ApiError::Request(error.to_string())),
            Err(_) => Err(ApiError::TimedOut(REQUEST_TIMEOUT)),
        }
    }
}

/// A token bucket: `burst` requests at once, then `qps` a second.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    updated: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Bucket {
        Bucket {
            qps,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            updated: Instant::now(),
        }
    }

    /// How long a token taken at `now` would wait, without taking it.
    fn wait(&self, now: Instant) -> Duration {
        let refill = now.saturating_duration_since(self.updated).as_secs_f64() * self.qps;
        let tokens = (self.tokens + refill).min(self.burst) - 1.0;
        Duration::from_secs_f64((-tokens).max(0.0) / self.qps)
    }

    /// Takes a token at `now`; how long the request must wait for it.
    fn take(&mut self, now: Instant) -> Duration {
        let refill = now.saturating_duration_since(self.updated).as_secs_f64() * self.qps;
        self.tokens = (self.tokens + refill).min(self.burst) - 1.0;
        self.updated = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_paces() {
        let start = Instant::now();
        let mut bucket = Bucket::new(5.0, 2);
        assert_eq!(bucket.take(start), Duration::ZERO);
        assert_eq!(bucket.wait(start), Duration::ZERO);
        assert_eq!(bucket.take(start), Duration::ZERO);
        assert_eq!(bucket.wait(start), Duration::from_millis(200));
        assert_eq!(bucket.take(start), Duration::from_millis(200));
        assert_eq!(bucket.wait(start), Duration::from_millis(400));
        assert_eq!(bucket.take(start), Duration::from_millis(400));
        // After a quiet second the burst is back, not more.
        let later = start + Duration::from_secs(10);
        assert_eq!(bucket.take(later), Duration::ZERO);
        assert_eq!(bucket.take(later), Duration::ZERO);
        assert_eq!(bucket.take(later), Duration::from_millis(200));
    }
}
