//! The cost floor of a bulk byte on a path: the AES-GCM passes the server and agent must make
//! over it, at the crypto provider's own rate measured on this machine, plus the socket
//! copies they must make, at direct loopback's measured cost per socket. A proxy cannot spend
//! less CPU per GiB than this without offloading work (kernel TLS) or skipping a leg; what it
//! spends beyond it is its own overhead, which the bench shows as "× floor".
//!
//! - AES-GCM: ring (rustls' provider here), 16 KiB records (TLS's largest), sealed and opened
//!   in turn on one buffer; the best of a few runs, since a floor is a best case.
//! - Sockets: a direct run's client+target CPU per GiB is one send and one receive of every
//!   byte, so one socket operation costs half of it. The server and agent each receive every
//!   byte once and send it once: four. The callers pass the cheapest of several direct runs,
//!   for the same reason as the best AES-GCM run: a single run's figure moves by up to half.
//! - Passes, server and agent together: the mTLS path opens the client's records on the
//!   server, seals them again for the agent link and opens them on the agent (three, either
//!   way); the Unix-socket path has only the agent link (two). konnectivity's paths make the
//!   same passes (its agent link is gRPC over TLS).

use std::time::Instant;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};

use crate::route::Route;

/// TLS's largest record.
const RECORD: usize = 16 * 1024;
/// Bytes per timed run (each sealed once and opened once).
const RUN_BYTES: usize = 64 << 20;
const RUNS: usize = 5;
/// Socket operations (each byte received or sent once) the server and agent make together.
const SOCKET_OPERATIONS: f64 = 4.0;
const GIB: f64 = (1u64 << 30) as f64;

/// One AES-128-GCM pass (seal or open) over a GiB, in CPU seconds: the provider's rate.
#[derive(Debug, Clone, Copy)]
pub struct Crypto {
    pub seconds_per_gib: f64,
}

impl Crypto {
    /// Times ring's AES-128-GCM on this machine.
    pub fn measure() -> anyhow::Result<Crypto> {
        let key = UnboundKey::new(&AES_128_GCM, &[0x42; 16])
            .map_err(|_| anyhow::anyhow!("ring refused an AES-128 key"))?;
        let key = LessSafeKey::new(key);
        let mut record = vec![0x5au8; RECORD + AES_128_GCM.tag_len()];
        let mut best = f64::INFINITY;
        for _ in 0..RUNS {
            let started = Instant::now();
            for sequence in 0..(RUN_BYTES / RECORD) as u64 {
                // TLS 1.3 nonces: a fixed IV XOR the record's sequence number.
                let mut nonce = [0u8; 12];
                nonce[4..].copy_from_slice(&sequence.to_be_bytes());
                let tag = key
                    .seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key(nonce),
                        Aad::from([23u8, 3, 3, 0x40, 0x11]),
                        &mut record[..RECORD],
                    )
                    .map_err(|_| anyhow::anyhow!("sealing failed"))?;
                record[RECORD..].copy_from_slice(tag.as_ref());
                key.open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from([23u8, 3, 3, 0x40, 0x11]),
                    &mut record,
                )
                .map_err(|_| anyhow::anyhow!("opening failed"))?;
            }
            // Two passes over every byte of the run.
            let per_gib = started.elapsed().as_secs_f64() / (2.0 * RUN_BYTES as f64 / GIB);
            best = best.min(per_gib);
        }
        Ok(Crypto {
            seconds_per_gib: best,
        })
    }
}

/// AES-GCM passes the server and agent make together over every byte on `route`; `None` for
/// direct (nothing between client and target).
pub fn passes(route: &Route) -> Option<f64> {
    use bridgehead_e2e::client::tunnel::Frontend;
    match route {
        Route::Direct => None,
        Route::Bridgehead(Frontend::Mtls { .. })
        | Route::Peer {
            frontend: Frontend::Mtls { .. },
            ..
        } => Some(3.0),
        // Plain CONNECT in, one TLS leg behind it (a `--peer` such as wstunnel).
        Route::Bridgehead(Frontend::Uds { .. } | Frontend::Tcp { .. })
        | Route::Peer {
            frontend: Frontend::Uds { .. } | Frontend::Tcp { .. },
            ..
        } => Some(2.0),
    }
}

/// The floor in CPU seconds per GiB for `route`, from the provider's rate and a direct run's
/// client+target CPU per GiB in the same row.
pub fn floor(crypto: Crypto, route: &Route, direct_cpu_per_gib: f64) -> Option<f64> {
    let per_socket = direct_cpu_per_gib / 2.0;
    passes(route).map(|passes| passes * crypto.seconds_per_gib + SOCKET_OPERATIONS * per_socket)
}
