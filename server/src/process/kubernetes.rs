//! What the server asks of the Kubernetes API beyond the Leases: review an agent's token, read
//! a node's names and addresses. The client itself (pacing, timeouts, errors) is
//! [`bridgehead_kubeapi::KubeApi`], shared with the agent.

use bridgehead_kubeapi::k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use bridgehead_kubeapi::k8s_openapi::api::core::v1::Node;
use bridgehead_kubeapi::kube::api::PostParams;
use bridgehead_kubeapi::kube::Api;
pub use bridgehead_kubeapi::{ApiError, KubeApi};

/// The TokenReview extra that names the node a pod-bound token's pod runs on.
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// What a TokenReview said of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// Whether kube-apiserver knows the token (for the audiences asked).
    pub authenticated: bool,
    /// The user the token stands for (`system:serviceaccount:NS:NAME`).
    pub username: String,
    /// The audiences the token is valid for, of those asked.
    pub audiences: Vec<String>,
    /// The node of the pod the token is bound to, if it is bound to one.
    pub node: Option<String>,
    /// kube-apiserver's reason when it could not check the token.
    pub error: Option<String>,
}

/// The server's questions, asked through a [`KubeApi`].
pub(crate) trait ServerQuestions {
    /// Asks kube-apiserver whether `token` is valid for `audience` (TokenReview).
    async fn review(&self, token: &str, audience: &str) -> Result<Review, ApiError>;
    /// Node `name`'s name and every address in its status (InternalIP, ExternalIP, Hostname,
    /// InternalDNS, ExternalDNS).
    async fn node_addresses(&self, name: &str) -> Result<Vec<String>, ApiError>;
}

impl ServerQuestions for KubeApi {
    async fn review(&self, token: &str, audience: &str) -> Result<Review, ApiError> {
        let reviews: Api<TokenReview> = Api::all(self.client());
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![audience.to_owned()]),
            },
            ..TokenReview::default()
        };
        let answer = self
            .call(reviews.create(&PostParams::default(), &request))
            .await?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        let node = user
            .extra
            .as_ref()
            .and_then(|extra| extra.get(NODE_NAME_EXTRA))
            .and_then(|values| values.first())
            .cloned();
        Ok(Review {
            authenticated: status.authenticated.unwrap_or(false),
            username: user.username.unwrap_or_default(),
            audiences: status.audiences.unwrap_or_default(),
            node,
            error: status.error.filter(|error| !error.is_empty()),
        })
    }

    async fn node_addresses(&self, name: &str) -> Result<Vec<String>, ApiError> {
        let nodes: Api<Node> = Api::all(self.client());
        let node = self.call(nodes.get(name)).await?;
        let mut addresses = vec![name.to_owned()];
        let listed = node
            .status
            .and_then(|status| status.addresses)
            .unwrap_or_default();
        addresses.extend(listed.into_iter().map(|address| address.address));
        Ok(addresses)
    }
}
