//! `--frontend uds`: the throughput runs (and what `--perf` records) go over the Unix-socket
//! frontend, with that path's floor, instead of the mTLS frontend.

use std::process::Command;

#[test]
fn throughput_runs_over_the_unix_socket_frontend_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--quick", "--only", "throughput", "--frontend", "uds"])
        .arg("--json")
        .arg(&json)
        .arg("--out-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = std::fs::read_to_string(&json).unwrap();
    let rows: Vec<serde_json::Value> = lines
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|row| row["measurement"] == "throughput")
        .filter(|row| row["route"] == "bridgehead-uds" && row["tunnels"] == 1)
        .collect();
    for direction in ["upload", "download"] {
        let row = rows
            .iter()
            .find(|row| row["direction"] == direction)
            .unwrap_or_else(|| panic!("no one-tunnel {direction} over the Unix socket:\n{lines}"));
        assert!(row["bytes"].as_u64().unwrap_or(0) > 0, "{row}");
        // Two AES passes on this path, against three over mTLS: a floor was computed.
        assert!(row["floor_s_per_gib"].as_f64().is_some(), "{row}");
    }
    assert!(
        !lines.contains("\"route\":\"bridgehead-mtls\""),
        "the mTLS frontend ran too"
    );
}
