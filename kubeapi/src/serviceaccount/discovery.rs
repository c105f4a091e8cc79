//! ServiceAccount issuer discovery through the kube client: the issuer's name from
//! `/.well-known/openid-configuration` and its keys from `/openid/v1/jwks`, both served by
//! kube-apiserver itself (when its `--service-account-issuer` is an https URL) to every
//! service account by default (ClusterRole `system:service-account-issuer-discovery`).

use serde::Deserialize;

use super::keys::{Issuer, KeySet};
use crate::{ApiError, KubeApi};

const CONFIGURATION_PATH: &str = "/.well-known/openid-configuration";
const JWKS_PATH: &str = "/openid/v1/jwks";

/// Why the issuer's keys could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum DiscoveryError {
    #[error("issuer discovery is forbidden to the server's identity")]
    Forbidden,
    #[error("kube-apiserver serves no issuer discovery (its --service-account-issuer is not an https URL)")]
    NotServed,
    #[error("{0}")]
    Unavailable(ApiError),
    #[error("issuer discovery answered what is not {0}")]
    Invalid(&'static str),
}

#[derive(Deserialize)]
struct Configuration {
    issuer: String,
}

/// Fetches the issuer and its keys (two requests, paced as every request of `api`).
pub(crate) async fn discover(api: &KubeApi) -> Result<Issuer, DiscoveryError> {
    let configuration = get(api, CONFIGURATION_PATH).await?;
    // Strict as the keys are: two `issuer` members would name two issuers.
    let configuration: Configuration = super::json::object(configuration.as_bytes())
        .map_err(|_| DiscoveryError::Invalid("an OpenID configuration"))?;
    let jwks = get(api, JWKS_PATH).await?;
    let keys = KeySet::parse(jwks.as_bytes()).map_err(|_| DiscoveryError::Invalid("a JWKS"))?;
    Ok(Issuer {
        issuer: configuration.issuer,
        keys,
    })
}

async fn get(api: &KubeApi, path: &str) -> Result<String, DiscoveryError> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|_| DiscoveryError::Invalid("a request"))?;
    match api.call(api.client().request_text(request)).await {
        Ok(text) => Ok(text),
        Err(ApiError::Status {
            code: 401 | 403, ..
        }) => Err(DiscoveryError::Forbidden),
        Err(ApiError::Status { code: 404, .. }) => Err(DiscoveryError::NotServed),
        Err(error) => Err(DiscoveryError::Unavailable(error)),
    }
}
