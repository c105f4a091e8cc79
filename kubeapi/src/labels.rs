//! Label syntax, checked at startup so that a typo in `--lease-label` or
//! `--lease-label-selector` is an error with the reason, not a silent count of 1.

use std::collections::BTreeMap;

/// Parses `key=value,key2=value2` (Kubernetes label syntax) into a map; an empty string is an
/// empty map.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("label {pair:?} is not key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        check_key(key)?;
        check_value(value)?;
        if labels.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("label key {key:?} given twice"));
        }
    }
    Ok(labels)
}

/// `labels` as a selector matching them all: `k=v,k2=v2`.
pub fn selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Checks an equality-based label selector (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma
/// separated); set-based requirements (`k in (a,b)`, `k notin (a)`) are passed on to
/// kube-apiserver unchecked.
pub fn check_selector(selector: &str) -> Result<(), String> {
    if selector.trim().is_empty() {
        return Err("empty label selector".to_owned());
    }
    if selector.contains('(') {
        return Ok(());
    }
    for requirement in selector.split(',').map(str::trim) {
        if requirement.is_empty() {
            return Err(format!("empty requirement in selector {selector:?}"));
        }
        let (key, value) = if let Some((k, v)) = requirement.split_once("!=") {
            (k, Some(v))
        } else if let Some((k, v)) = requirement.split_once("==") {
            (k, Some(v))
        } else if let Some((k, v)) = requirement.split_once('=') {
            (k, Some(v))
        } else {
            (requirement.strip_prefix('!').unwrap_or(requirement), None)
        };
        check_key(key.trim())?;
        if let Some(value) = value {
            check_value(value.trim())?;
        }
    }
    Ok(())
}

/// Whether `name` is a DNS subdomain as Kubernetes names them (RFC 1123): at most 253
/// characters, dot-separated labels of 1 to 63 lower-case letters, digits and `-`, neither
/// starting nor ending with `-`.
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if !is_dns_subdomain(prefix) {
            return Err(format!(
                "label key {key:?}: the prefix is not a DNS subdomain"
            ));
        }
    }
    if name.is_empty() || !is_name(name) {
        return Err(format!(
            "label key {key:?}: at most 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends"
        ));
    }
    Ok(())
}

/// A label value: empty, or a name as in [`check_key`].
fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name(value) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?}: at most 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends"
        ))
    }
}

fn is_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    text.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let parsed = parse_labels("k8s-app=konnectivity-server, tier=cp").unwrap();
        assert_eq!(parsed["k8s-app"], "konnectivity-server");
        assert_eq!(parsed["tier"], "cp");
        assert_eq!(selector(&parsed), "k8s-app=konnectivity-server,tier=cp");
        assert!(parse_labels("").unwrap().is_empty());
        assert_eq!(parse_labels("example.com/role=a").unwrap().len(), 1);
        assert_eq!(parse_labels("empty=").unwrap()["empty"], "");
        for (bad, says) in [
            ("k8s-app", "not key=value"),
            ("-k=v", "label key"),
            ("k=v v", "label value"),
            ("k=v,k=w", "twice"),
            ("Bad_Prefix/k=v", "prefix"),
            (&format!("k={}", "v".repeat(64)), "label value"),
        ] {
            let error = parse_labels(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn selectors() {
        for good in [
            "k8s-app=konnectivity-server",
            "a==b,c!=d",
            "present,!absent",
            "tier in (cp, infra)",
        ] {
            assert_eq!(check_selector(good), Ok(()), "{good}");
        }
        for bad in ["", "a=b,", "a=b c", "=x", "!"] {
            assert!(check_selector(bad).is_err(), "{bad}");
        }
    }
}
