//! A CA of its own, for the PKIs around Bridgehead: the Kubernetes control plane a test runs,
//! per-node agent certificates.

use std::fmt;

use rcgen::{Issuer, KeyPair};

use crate::profile::{self, Role};
use crate::{san, CertError, CertKey};

/// A certificate authority that signs leaf certificates. Every key is ECDSA P-256; validity as
/// [`crate::Pki`]'s. `Debug` prints the CA certificate, never a key.
pub struct Authority {
    /// The CA's certificate and key.
    pub ca: CertKey,
    issuer: Issuer<'static, KeyPair>,
}

impl Authority {
    /// A new CA named `common_name`.
    pub fn new(common_name: &str) -> Result<Authority, CertError> {
        let profile::Ca { cert_key, issuer } = profile::ca(common_name)?;
        Ok(Authority {
            ca: cert_key,
            issuer,
        })
    }

    /// A `serverAuth` certificate for exactly `sans` (DNS names or IP literals).
    pub fn server(&self, common_name: &str, sans: &[String]) -> Result<CertKey, CertError> {
        let sans = san::sans(sans)?;
        profile::leaf(&self.issuer, common_name, &[], Role::Server, &sans)
    }

    /// A `clientAuth` certificate for `CN=common_name`, `O=` each of `organizations` (a
    /// Kubernetes user and its groups), with `sans` (DNS names or IP literals, may be empty).
    pub fn client(
        &self,
        common_name: &str,
        organizations: &[&str],
        sans: &[String],
    ) -> Result<CertKey, CertError> {
        let sans = san::sans(sans)?;
        profile::leaf(
            &self.issuer,
            common_name,
            organizations,
            Role::Client,
            &sans,
        )
    }
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authority")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}
