//! bridgehead-server (being built).

pub mod router;
