//! The flags of the Kubernetes client that both binaries take with one meaning, each written
//! once (its name, its environment variable, its default and its check): where the client's
//! configuration is (`--kubeconfig`) and where the servers' Leases live
//! (`--lease-namespace`). Both command lines flatten [`KubeArgs`], as they flatten runtime's
//! `ProcessArgs`; each binary words `--kubeconfig`'s help for what it asks of kube-apiserver,
//! with runtime's `Wording`s. The server's pacing flags (`--kubeconfig-qps`,
//! `--kubeconfig-burst`) stay the server's: the agent's client, which only lists and watches
//! Leases, keeps client-go's pacing.

use std::path::PathBuf;

/// The Kubernetes flags both binaries share.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// kubeconfig for the calls to kube-apiserver; empty: the pod's in-cluster configuration.
    #[arg(long, env = "BRIDGEHEAD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the servers' Leases.
    #[arg(long, env = "BRIDGEHEAD_LEASE_NAMESPACE", default_value = crate::leases::DEFAULT_NAMESPACE)]
    pub lease_namespace: String,
}

impl KubeArgs {
    /// `--kubeconfig`; `None` (the in-cluster configuration) when not given or empty.
    pub fn kubeconfig(&self) -> Option<PathBuf> {
        self.kubeconfig
            .clone()
            .filter(|path| !path.as_os_str().is_empty())
    }

    /// `--lease-namespace`, trimmed; an error naming the flag when nothing is left.
    pub fn lease_namespace(&self) -> Result<String, &'static str> {
        match self.lease_namespace.trim() {
            "" => Err("--lease-namespace is empty"),
            namespace => Ok(namespace.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        kube: KubeArgs,
    }

    #[test]
    fn none_means_in_cluster_and_a_blank_namespace_is_refused() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.kube.kubeconfig(), None);
        assert_eq!(cli.kube.lease_namespace(), Ok("kube-system".to_owned()));
        let cli = Cli::try_parse_from(["x", "--kubeconfig=/k", "--lease-namespace= bh "]).unwrap();
        assert_eq!(cli.kube.kubeconfig(), Some(PathBuf::from("/k")));
        assert_eq!(cli.kube.lease_namespace(), Ok("bh".to_owned()));
        let cli = Cli::try_parse_from(["x", "--lease-namespace= "]).unwrap();
        assert_eq!(
            cli.kube.lease_namespace(),
            Err("--lease-namespace is empty")
        );
    }
}
