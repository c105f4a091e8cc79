//! What every part of the server uses: its metrics ([`metrics`]), the TLS configuration of
//! its listeners ([`tls_config`]), what a certificate names ([`certificate`]), HTTP/1 heads
//! ([`http_head`]), the Kubernetes client's questions ([`kubernetes`]), and the answers of the
//! health and admin ports ([`health`]).
//!
//! Uses no other part: everything else may use it.

pub mod certificate;
pub mod health;
pub mod http_head;
pub mod kubernetes;
pub mod metrics;
pub mod tls_config;
