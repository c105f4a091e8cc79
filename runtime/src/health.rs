//! The health server: a tiny HTTP/1 server whose routes the binaries supply.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

/// What a route answers: status, content type, body.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: StatusCode,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// A `text/plain` reply.
    pub fn text(status: StatusCode, body: impl Into<String>) -> Reply {
        let mut body = body.into();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Bytes::from(body),
        }
    }

    /// A reply with an explicit content type.
    pub fn with_type(
        status: StatusCode,
        content_type: &'static str,
        body: impl Into<Bytes>,
    ) -> Reply {
        Reply {
            status,
            content_type,
            body: body.into(),
        }
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.status;
        if let Ok(value) = http::HeaderValue::from_str(self.content_type) {
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, value);
        }
        response
    }
}

/// Serves `routes(path)` for GET requests on `listener` until `shutdown`. Connections are
/// tracked by `tracker`.
pub async fn serve<F>(
    listener: TcpListener,
    routes: F,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) where
    F: Fn(&str) -> Reply + Send + Sync + 'static,
{
    serve_with(listener, routes, shutdown, tracker, false).await;
}

/// [`serve`] for an admin port: also `PUT /debug/flags/v` with a klog verbosity as its body
/// (as Kubernetes components take it) changes the log level at run time.
pub async fn serve_admin<F>(
    listener: TcpListener,
    routes: F,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) where
    F: Fn(&str) -> Reply + Send + Sync + 'static,
{
    serve_with(listener, routes, shutdown, tracker, true).await;
}

/// Longest body `PUT /debug/flags/v` reads.
const MAX_PUT_BODY: usize = 64;

/// `PUT /debug/flags/v`: the body is a verbosity.
async fn put_verbosity(request: Request<Incoming>) -> Reply {
    use http_body_util::BodyExt;
    let body = http_body_util::Limited::new(request.into_body(), MAX_PUT_BODY);
    let Ok(collected) = body.collect().await else {
        return Reply::text(
            StatusCode::BAD_REQUEST,
            "the body must be a verbosity, 0-10",
        );
    };
    let bytes = collected.to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    match text.trim().parse::<u8>() {
        Ok(verbosity) => match crate::logging::set_verbosity(verbosity) {
            Ok(level) => Reply::text(
                StatusCode::OK,
                format!("successfully set verbosity to {verbosity} (log level {level})"),
            ),
            Err(error) => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, error),
        },
        Err(_) => Reply::text(
            StatusCode::BAD_REQUEST,
            "the body must be a verbosity, 0-10",
        ),
    }
}

async fn serve_with<F>(
    listener: TcpListener,
    routes: F,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    admin: bool,
) where
    F: Fn(&str) -> Reply + Send + Sync + 'static,
{
    let routes = Arc::new(routes);
    let errors = crate::accept::RateLimit::new(1);
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    crate::accept::failed("health", &error, &errors).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let routes = routes.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let routes = routes.clone();
                async move {
                    let reply = if request.method() == http::Method::GET {
                        routes(request.uri().path())
                    } else if admin
                        && request.method() == http::Method::PUT
                        && request.uri().path() == "/debug/flags/v"
                    {
                        put_verbosity(request).await
                    } else if admin {
                        Reply::text(
                            StatusCode::METHOD_NOT_ALLOWED,
                            "only GET, and PUT /debug/flags/v",
                        )
                    } else {
                        Reply::text(StatusCode::METHOD_NOT_ALLOWED, "only GET")
                    };
                    Ok::<_, Infallible>(reply.into_response())
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(crate::timeouts::HEALTH_HEADER_READ)
                .serve_connection(TokioIo::new(socket), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        debug!(%error, %peer, "health connection failed");
                    }
                }
                () = shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
}

/// Encodes a prometheus-client registry as OpenMetrics text.
pub fn metrics_reply(registry: &prometheus_client::registry::Registry) -> Reply {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, registry) {
        Ok(()) => Reply::with_type(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            text,
        ),
        Err(error) => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

/// Runs `future` and logs how long it took if it was slow; used around shutdown drains.
pub async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
    let start = std::time::Instant::now();
    let value = future.await;
    (value, start.elapsed())
}
