//! The ServiceAccount token the agent presents (`--service-account-token-path`): read again for
//! every connection, since kubelet rotates projected tokens. The token itself is never logged:
//! the header value is marked sensitive.

use anyhow::Context;
use http::HeaderValue;

/// `Bearer <token>` from the token file, re-read on every connect (tokens rotate).
pub(crate) fn bearer(path: &std::path::Path) -> anyhow::Result<HeaderValue> {
    let token =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        anyhow::bail!("{} is empty", path.display());
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).with_context(|| {
        format!(
            "{} holds characters not allowed in a header",
            path.display()
        )
    })?;
    value.set_sensitive(true);
    Ok(value)
}
