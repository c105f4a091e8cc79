//! [`Strategy`] and `--proxy-strategies` parsing, with ANP's names.

use std::fmt;
use std::str::FromStr;

/// The valid `--proxy-strategies` names, as error messages and `--help` list them.
pub const VALID_STRATEGIES: &str = "destHost, destCIDR, defaultRoute, default";

/// How the router finds agents for a target. The names are ANP's (`--proxy-strategies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// `destHost`: the target host equals an agent's `host`, `ipv4` or `ipv6` identifier.
    DestHost,
    /// `destCIDR`: the target IP lies in one of an agent's `cidr` networks; longest prefix wins.
    DestCidr,
    /// `defaultRoute`: agents that announced `default-route=true`.
    DefaultRoute,
    /// `default`: any agent.
    Default,
}

impl Strategy {
    /// Every strategy, in the order [`VALID_STRATEGIES`] lists them.
    pub const ALL: [Strategy; 4] = [
        Strategy::DestHost,
        Strategy::DestCidr,
        Strategy::DefaultRoute,
        Strategy::Default,
    ];

    /// The canonical (ANP) name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Strategy::DestHost => "destHost",
            Strategy::DestCidr => "destCIDR",
            Strategy::DefaultRoute => "defaultRoute",
            Strategy::Default => "default",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = StrategyError;

    /// Accepts the ANP names in any ASCII case (`destCIDR`, `destcidr`).
    fn from_str(name: &str) -> Result<Strategy, StrategyError> {
        Strategy::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| StrategyError::Unknown(name.to_owned()))
    }
}

/// Why a `--proxy-strategies` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategyError {
    /// A name that is not one of [`VALID_STRATEGIES`].
    #[error("unknown proxy strategy {0:?} (valid: {VALID_STRATEGIES})")]
    Unknown(String),
    /// The list names no strategy at all.
    #[error("no proxy strategy given (valid: {VALID_STRATEGIES})")]
    Empty,
    /// A strategy listed more than once.
    #[error("proxy strategy \"{0}\" is listed more than once")]
    Duplicate(Strategy),
}

/// Parses an ordered, comma-separated strategy list such as `destHost,default`.
///
/// Entries are trimmed and empty entries ignored (`destHost,` is valid); an unknown name, a
/// duplicate, or a list with no strategy at all is an error.
pub fn parse_strategies(list: &str) -> Result<Vec<Strategy>, StrategyError> {
    let mut strategies = Vec::with_capacity(Strategy::ALL.len());
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let strategy = name.parse()?;
        if strategies.contains(&strategy) {
            return Err(StrategyError::Duplicate(strategy));
        }
        strategies.push(strategy);
    }
    if strategies.is_empty() {
        return Err(StrategyError::Empty);
    }
    Ok(strategies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.to_string().parse::<Strategy>(), Ok(s));
            assert_eq!(s.to_string().to_uppercase().parse::<Strategy>(), Ok(s));
        }
        let listed: Vec<String> = Strategy::ALL.iter().map(Strategy::to_string).collect();
        assert_eq!(listed.join(", "), VALID_STRATEGIES);
    }

    #[test]
    fn unknown_name_lists_valid_ones() {
        assert_eq!(
            "foo".parse::<Strategy>().unwrap_err().to_string(),
            r#"unknown proxy strategy "foo" (valid: destHost, destCIDR, defaultRoute, default)"#
        );
    }
}
