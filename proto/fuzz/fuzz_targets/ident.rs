//! Arbitrary text through the agent identifier parser.
//!
//! Checks: parsing never panics; every accepted query round-trips through `to_query` (and the
//! canonical query is a fixed point); `Display` never panics.

#![no_main]

use bridgehead_proto::ident::AgentIdentifiers;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(ids) = AgentIdentifiers::parse(query) else {
        return;
    };
    let canonical = ids.to_query();
    let again = AgentIdentifiers::parse(&canonical)
        .unwrap_or_else(|e| panic!("to_query gave {canonical:?}, which fails to parse: {e}"));
    assert_eq!(again, ids, "round trip through {canonical:?}");
    assert_eq!(again.to_query(), canonical);
    let _ = ids.to_string();
    let _ = ids.reject_unknown();
});
