//! `bench`: Bridgehead's benchmark against direct loopback TCP. See [`bridgehead_bench`];
//! build the release binaries first:
//!
//! ```text
//! cargo build --release --bins && cargo run --release -p bridgehead-bench
//! ```

use std::process::ExitCode;

use bridgehead_bench::{self as bench, Options};
use clap::Parser;

fn main() -> ExitCode {
    let options = Options::parse();
    if std::env::var_os("RUST_LOG").is_none() {
        // The harness runs the server and agent with the bench's RUST_LOG (debug when unset);
        // measure them as deployed. No other thread exists yet, so this cannot race.
        #[allow(clippy::disallowed_methods)]
        std::env::set_var("RUST_LOG", "info");
    }
    match bench::run(&options) {
        // Misses are results, not failures: the tables say PASS/MISS.
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}
