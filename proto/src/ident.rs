//! Agent identifiers: what an agent announces in its upgrade URL's query string.
//!
//! The same `application/x-www-form-urlencoded` syntax serves the agent's
//! `--agent-identifiers` flag and the `/connect?…` query: `host=node1&ipv4=10.0.0.5&cidr=10.244.1.0/24`.
//! Both the percent-encoded form (`ipv6=fd00%3A%3A5`) and the plain form (`ipv6=fd00::5`) parse.
//! Keys are case-sensitive and repeatable, except `id`; values are validated here so the
//! router only ever sees well-formed addresses, networks and names. Keys this version does not
//! know are kept in [`AgentIdentifiers::unknown`]: the server ignores them (version skew), the
//! agent rejects them at startup with [`AgentIdentifiers::reject_unknown`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

/// The `id` key: the agent's name.
pub const KEY_ID: &str = "id";
/// The `host` key: a DNS or node name that reaches the agent's network.
pub const KEY_HOST: &str = "host";
/// The `ipv4` key: an IPv4 address.
pub const KEY_IPV4: &str = "ipv4";
/// The `ipv6` key: an IPv6 address, plain or in brackets.
pub const KEY_IPV6: &str = "ipv6";
/// The `cidr` key: a network in `address/prefix-length` form.
pub const KEY_CIDR: &str = "cidr";
/// The `default-route` key: `true` or `false`, case-insensitive.
pub const KEY_DEFAULT_ROUTE: &str = "default-route";

/// Longest `id=` value, in bytes.
pub const MAX_ID_LEN: usize = 253;

/// Most identifiers (`host`, `ipv4`, `ipv6`, `cidr` and unknown keys) one agent announces;
/// a server refuses more, from an agent (400) or in a peer's view of its agents.
pub const MAX_IDENTIFIERS: usize = 256;
/// Longest identifier query an agent sends, in bytes. (Encoded again, as a peer's view does,
/// it may grow: up to three times, each byte as `%XX`.)
pub const MAX_QUERY_BYTES: usize = 8 * 1024;

/// What one agent announced about itself, in announcement order, keys repeatable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentIdentifiers {
    /// `id=`: the agent's name (unique per agent; at most one).
    pub id: Option<String>,
    /// `host=`: DNS names that reach this agent's network (as announced; validated).
    pub hosts: Vec<String>,
    /// `ipv4=`: IPv4 addresses.
    pub ipv4: Vec<Ipv4Addr>,
    /// `ipv6=`: IPv6 addresses.
    pub ipv6: Vec<Ipv6Addr>,
    /// `cidr=`: networks this agent can reach, normalised (host bits cleared).
    pub cidrs: Vec<IpNet>,
    /// `default-route=true`.
    pub default_route: bool,
    /// Keys this version does not know, with their values, in order.
    pub unknown: Vec<(String, String)>,
}

/// Why an identifier query was rejected. Every message names the offending key (and value,
/// where there is one), so it can be returned as is in a 400 answer or a startup error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentError {
    /// The query could not be decoded at all (percent-escapes that decode to invalid UTF-8,
    /// an empty key, ...).
    #[error("malformed identifier query: {0}")]
    Malformed(String),
    /// A known key was given an empty value.
    #[error("empty value for key {key}")]
    Empty {
        /// The key whose value was empty.
        key: String,
    },
    /// A known key was given a value that does not validate.
    #[error("invalid {reason} {value:?} for key {key}")]
    Invalid {
        /// The key.
        key: String,
        /// The value as decoded.
        value: String,
        /// What the value should have been, and where useful why it is not.
        reason: &'static str,
    },
    /// `id=` was given more than once.
    #[error("key id given more than once")]
    DuplicateId,
    /// A key this version does not know (only from [`AgentIdentifiers::reject_unknown`]).
    #[error("unknown identifier key {key:?}")]
    UnknownKey {
        /// The first unknown key.
        key: String,
    },
}

impl AgentIdentifiers {
    /// How many identifiers: `host`, `ipv4`, `ipv6`, `cidr` and unknown keys (what
    /// [`MAX_IDENTIFIERS`] bounds; `id` and `default-route` are one value each).
    pub fn count(&self) -> usize {
        self.hosts.len() + self.ipv4.len() + self.ipv6.len() + self.cidrs.len() + self.unknown.len()
    }

    /// Parses an identifier query such as `host=node1&ipv4=10.0.0.5&cidr=10.244.1.0/24`.
    ///
    /// - One leading `?` is tolerated; empty pairs (`a=1&&b=2`) and an empty query are fine.
    /// - Values may be percent-encoded or plain; `+` decodes to a space. A `%` not followed by
    ///   two hex digits is kept literally; escapes that decode to invalid UTF-8 are
    ///   [`IdentError::Malformed`].
    /// - `host`, `ipv4`, `ipv6` and `cidr` accumulate in order; `id` at most once;
    ///   `default-route` takes `true`/`false` (any case), the last one wins.
    /// - Known keys with an empty value are [`IdentError::Empty`]; unknown keys are kept, with
    ///   their values (even empty ones), in [`AgentIdentifiers::unknown`].
    pub fn parse(query: &str) -> Result<AgentIdentifiers, IdentError> {
        let query = query.strip_prefix('?').unwrap_or(query);
        check_utf8(query)?;
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query).map_err(|e| IdentError::Malformed(e.to_string()))?;
        let mut ids = AgentIdentifiers::default();
        for (key, value) in pairs {
            ids.add(key, value)?;
        }
        Ok(ids)
    }

    fn add(&mut self, key: String, value: String) -> Result<(), IdentError> {
        if key.is_empty() {
            return Err(IdentError::Malformed(format!(
                "empty key (with value {value:?})"
            )));
        }
        let known = [
            KEY_ID,
            KEY_HOST,
            KEY_IPV4,
            KEY_IPV6,
            KEY_CIDR,
            KEY_DEFAULT_ROUTE,
        ];
        if !known.contains(&key.as_str()) {
            self.unknown.push((key, value));
            return Ok(());
        }
        if value.is_empty() {
            return Err(IdentError::Empty { key });
        }
        let invalid = |reason: &'static str| IdentError::Invalid {
            key: key.clone(),
            value: value.clone(),
            reason,
        };
        match key.as_str() {
            KEY_ID => {
                if self.id.is_some() {
                    return Err(IdentError::DuplicateId);
                }
                validate_id(&value).map_err(invalid)?;
                self.id = Some(value);
            }
            KEY_HOST => {
                crate::host::check_host(&value).map_err(|error| invalid(error.message()))?;
                self.hosts.push(value);
            }
            KEY_IPV4 => self.ipv4.push(parse_ipv4(&value).map_err(invalid)?),
            KEY_IPV6 => self.ipv6.push(parse_ipv6(&value).map_err(invalid)?),
            KEY_CIDR => self.cidrs.push(parse_cidr(&value).map_err(invalid)?),
            _ => {
                self.default_route = if value.eq_ignore_ascii_case("true") {
                    true
                } else if value.eq_ignore_ascii_case("false") {
                    false
                } else {
                    return Err(invalid("boolean (true or false)"));
                }
            }
        }
        Ok(())
    }

    /// Fails with [`IdentError::UnknownKey`] naming the first unknown key, if there is one.
    /// The agent calls this on its own `--agent-identifiers`: there an unknown key is a typo.
    pub fn reject_unknown(&self) -> Result<(), IdentError> {
        match self.unknown.first() {
            Some((key, _)) => Err(IdentError::UnknownKey { key: key.clone() }),
            None => Ok(()),
        }
    }

    /// The percent-encoded query announcing these identifiers: `id` first, then `host`,
    /// `ipv4`, `ipv6`, `cidr`, `default-route=true` if set, then the unknown pairs.
    ///
    /// [`AgentIdentifiers::parse`] of the result gives back an equal value, for any value that
    /// `parse` could have produced.
    pub fn to_query(&self) -> String {
        let pairs = self.pairs();
        // Serialising a sequence of string pairs cannot fail; fall back to an empty query
        // rather than panic should that ever change.
        serde_urlencoded::to_string(&pairs).unwrap_or_default()
    }

    /// One `(key, value)` pair per identifier, in [`to_query`](Self::to_query) order.
    fn pairs(&self) -> Vec<(&str, String)> {
        let mut pairs = Vec::new();
        if let Some(id) = &self.id {
            pairs.push((KEY_ID, id.clone()));
        }
        pairs.extend(self.hosts.iter().map(|h| (KEY_HOST, h.clone())));
        pairs.extend(self.ipv4.iter().map(|a| (KEY_IPV4, a.to_string())));
        pairs.extend(self.ipv6.iter().map(|a| (KEY_IPV6, a.to_string())));
        pairs.extend(self.cidrs.iter().map(|n| (KEY_CIDR, n.to_string())));
        if self.default_route {
            pairs.push((KEY_DEFAULT_ROUTE, "true".to_owned()));
        }
        pairs.extend(self.unknown.iter().map(|(k, v)| (k.as_str(), v.clone())));
        pairs
    }
}

impl FromStr for AgentIdentifiers {
    type Err = IdentError;

    /// Same as [`AgentIdentifiers::parse`].
    fn from_str(query: &str) -> Result<Self, Self::Err> {
        AgentIdentifiers::parse(query)
    }
}

/// A one-line human summary, `id=a host=node1 ipv4=10.0.0.5 cidr=10.244.1.0/24`: one decoded
/// `key=value` per identifier, space-separated, in [`AgentIdentifiers::to_query`] order. Keys and
/// values that are not plain printable ASCII (possible only for unknown keys) are quoted and
/// escaped, so a peer cannot forge log lines.
impl fmt::Display for AgentIdentifiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (key, value)) in self.pairs().iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write_token(f, key)?;
            f.write_str("=")?;
            write_token(f, value)?;
        }
        Ok(())
    }
}

fn write_token(f: &mut fmt::Formatter<'_>, token: &str) -> fmt::Result {
    if !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic() && b != b'"') {
        f.write_str(token)
    } else {
        write!(f, "{token:?}")
    }
}

/// Rejects percent-escapes that decode to invalid UTF-8. `form_urlencoded` would replace them
/// with U+FFFD and carry on; an identifier silently changed that way must not reach the router.
///
/// Decoding the whole query at once is enough: `&`, `=` and `+` are ASCII and so can never sit
/// inside a multi-byte sequence, so the query is valid exactly when each of its parts is.
fn check_utf8(query: &str) -> Result<(), IdentError> {
    if !query.contains('%') {
        return Ok(());
    }
    let bytes = query.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = (bytes[i] == b'%')
            .then(|| {
                Some((
                    hex_digit(*bytes.get(i + 1)?)?,
                    hex_digit(*bytes.get(i + 2)?)?,
                ))
            })
            .flatten();
        match escape {
            Some((hi, lo)) => {
                decoded.push(hi << 4 | lo);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    match std::str::from_utf8(&decoded) {
        Ok(_) => Ok(()),
        Err(e) => Err(IdentError::Malformed(format!(
            "percent-encoded bytes are not valid UTF-8 (at decoded byte {})",
            e.valid_up_to()
        ))),
    }
}

fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// `id`: 1 to [`MAX_ID_LEN`] bytes of printable ASCII, no whitespace.
fn validate_id(value: &str) -> Result<(), &'static str> {
    if value.len() > MAX_ID_LEN {
        return Err("agent id (longer than 253 bytes)");
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("agent id (printable ASCII without whitespace)");
    }
    Ok(())
}

fn parse_ipv4(value: &str) -> Result<Ipv4Addr, &'static str> {
    value.parse::<Ipv4Addr>().map_err(|_| {
        if parse_ipv6(value).is_ok() {
            "ipv4 address (this is an IPv6 address: use ipv6=)"
        } else {
            "ipv4 address"
        }
    })
}

fn parse_ipv6(value: &str) -> Result<Ipv6Addr, &'static str> {
    crate::host::strip_brackets(value)
        .parse::<Ipv6Addr>()
        .map_err(|_| {
            if value.parse::<Ipv4Addr>().is_ok() {
                "ipv6 address (this is an IPv4 address: use ipv4=)"
            } else {
                "ipv6 address"
            }
        })
}

fn parse_cidr(value: &str) -> Result<IpNet, &'static str> {
    match value.parse::<IpNet>() {
        Ok(net) => Ok(net.trunc()),
        Err(_) if value.parse::<IpAddr>().is_ok() => {
            Err("cidr (address/prefix-length; the prefix length is missing)")
        }
        Err(_) => Err("cidr (address/prefix-length)"),
    }
}
