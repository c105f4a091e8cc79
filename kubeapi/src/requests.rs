//! What the client asked kube-apiserver, counted by verb and resource as kube-apiserver's own
//! `apiserver_request_total` names them (`GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`,
//! `DELETE`; `pods`, `nodes`, `tokenreviews`, ...), so the two can be read side by side. Every
//! request of the client passes here (a layer of its service stack): the paced calls, the
//! watches and their relists, discovery.
//!
//! The labels stay bounded: the resource is the path's collection name, and a path outside
//! the API's groups is counted under a fixed name (`openid-configuration`, `jwks`,
//! `discovery`, `other`), never under the path itself.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Uri};

/// Requests counted so far by (verb, resource); cloned handles share the counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounts {
    counts: Arc<Mutex<BTreeMap<(&'static str, String), u64>>>,
}

impl RequestCounts {
    /// Counts one request.
    pub fn count(&self, method: &Method, uri: &Uri) {
        let key = classify(method, uri);
        *self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(key)
            .or_insert(0) += 1;
    }

    /// Every (verb, resource) asked so far with its count, in order.
    pub fn snapshot(&self) -> Vec<(&'static str, String, u64)> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|((verb, resource), n)| (*verb, resource.clone(), *n))
            .collect()
    }
}

/// The verb and resource of a request, as kube-apiserver counts it.
fn classify(method: &Method, uri: &Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // After `/api/v1` or `/apis/GROUP/VERSION`: [namespaces, NS,] resource [, name [, sub]].
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] if !rest.is_empty() => rest,
        ["api" | "apis", ..] => return (verb(method, false, uri), "discovery".to_owned()),
        [".well-known", "openid-configuration"] => {
            return (verb(method, false, uri), "openid-configuration".to_owned())
        }
        ["openid", "v1", "jwks"] => return (verb(method, false, uri), "jwks".to_owned()),
        _ => return (verb(method, false, uri), "other".to_owned()),
    };
    let rest = match rest {
        ["namespaces", _namespace, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    let collection = rest.len() == 1;
    (verb(method, collection, uri), rest[0].to_owned())
}

fn verb(method: &Method, collection: bool, uri: &Uri) -> &'static str {
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *method {
        Method::GET if watch => "WATCH",
        Method::GET if collection => "LIST",
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_as_kube_apiserver_names_them() {
        let cases = [
            (Method::GET, "/api/v1/nodes?limit=500", "LIST", "nodes"),
            (
                Method::GET,
                "/api/v1/nodes?watch=true&resourceVersion=5",
                "WATCH",
                "nodes",
            ),
            (Method::GET, "/api/v1/nodes/node-1", "GET", "nodes"),
            (
                Method::GET,
                "/api/v1/namespaces/kube-system/pods?fieldSelector=x",
                "LIST",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/kube-system/serviceaccounts/agent",
                "GET",
                "serviceaccounts",
            ),
            (
                Method::POST,
                "/apis/authentication.k8s.io/v1/tokenreviews",
                "POST",
                "tokenreviews",
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/s1",
                "PUT",
                "leases",
            ),
            (Method::GET, "/api/v1/namespaces", "LIST", "namespaces"),
            (
                Method::GET,
                "/.well-known/openid-configuration",
                "GET",
                "openid-configuration",
            ),
            (Method::GET, "/openid/v1/jwks", "GET", "jwks"),
            (Method::GET, "/apis", "GET", "discovery"),
            (Method::GET, "/version", "GET", "other"),
        ];
        for (method, uri, verb, resource) in cases {
            let uri: Uri = uri.parse().unwrap();
            assert_eq!(
                classify(&method, &uri),
                (verb, resource.to_owned()),
                "{method} {uri}"
            );
        }
    }

    #[test]
    fn counts_add_up_per_verb_and_resource() {
        let counts = RequestCounts::default();
        let list: Uri = "/api/v1/nodes".parse().unwrap();
        let get: Uri = "/api/v1/nodes/a".parse().unwrap();
        counts.count(&Method::GET, &list);
        counts.count(&Method::GET, &get);
        counts.clone().count(&Method::GET, &get);
        assert_eq!(
            counts.snapshot(),
            vec![
                ("GET", "nodes".to_owned(), 2),
                ("LIST", "nodes".to_owned(), 1)
            ]
        );
    }
}
