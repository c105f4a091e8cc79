//! End-to-end harness: runs the real `bridgehead-server` and `bridgehead-agent` binaries on
//! loopback with a PKI made at test time, plus targets and a client that speaks exactly as
//! kube-apiserver does.
//!
//! - [`pki`]: a fresh CA and certificates in a temporary directory.
//! - [`process`]: [`Server`], [`Agent`]: child processes bound to port 0; their addresses are
//!   read from the `... listening on ADDR` lines they print. Killed on drop.
//! - [`client`]: the kube-apiserver-style CONNECT client (blocking and async) and curl helpers.
//! - [`target`]: echo, "who am I" and pattern targets, and the async load target.
//! - [`kubernetes`]: a real control plane (etcd, kube-apiserver, kubectl) and node stand-ins.
//! - [`haproxy`]: a real load balancer in front of several servers.
//! - [`image_registry`]: an image registry (CNCF Distribution) on the test's network, which images
//!   are pushed to and the real cluster's nodes pull from.
//! - [`netns`]: network-namespace test hosts (root); [`procfs`]: a process's memory, CPU and
//!   descriptors; [`skip`]: skipping a test loudly (and failing it where skips are forbidden);
//!   [`timing`]: a timeout fired on time.
//! - [`release`]: the release scripts and what they write (static binaries, OCI layouts).
//! - [`soak`]: many tunnels held for a long time with a trickle of traffic and steady
//!   turnover, the processes sampled (the bench's soak and its shortened test).
//!
//! The binaries must be built first (`cargo build --bins`); the README's test command does it.

pub mod client;
pub mod dns;
pub mod haproxy;
pub mod image_registry;
pub mod konnectivity;
pub mod kubernetes;
pub mod late;
pub mod netns;
pub mod pki;
pub mod process;
pub mod procfs;
pub mod prometheus;
pub mod release;
pub mod skip;
pub mod soak;
pub mod target;
pub mod timing;

pub use pki::Pki;
pub use process::{Agent, AgentOptions, Peering, Server, ServerOptions, Wrapper};
