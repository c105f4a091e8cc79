//! The short requests of the drill loop, each one kubectl run: an exec echoing a payload,
//! a log tail, a port-forward carrying a bulk GET.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{Shared, BULK_SIZE, HTTP_PORT, REQUEST_TIMEOUT};

/// `kubectl exec -i POD -- cat`: a payload naming this request, echoed back exactly.
pub(super) fn exec(shared: &Shared, pod: &str, attempt: u64) -> anyhow::Result<()> {
    let payload: Vec<u8> = format!("{pod} request {attempt}\n")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(16 << 10)
        .collect();
    let mut command = shared.kubectl(&["exec", "-i", pod, "--", "cat"]);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().context("running kubectl")?;
    let mut stdin = child.stdin.take().context("kubectl's stdin")?;
    let feed = {
        let payload = payload.clone();
        // Dropping stdin at the end is cat's EOF.
        std::thread::spawn(move || stdin.write_all(&payload))
    };
    let (status, stdout, stderr) = wait_within(child, REQUEST_TIMEOUT)?;
    let _ = feed.join();
    if !status || stdout != payload {
        bail!(
            "{} bytes back of {}, success {status}: {}",
            stdout.len(),
            payload.len(),
            String::from_utf8_lossy(&stderr)
        );
    }
    Ok(())
}

/// `kubectl logs --tail=3 POD`: three consecutive ticks.
pub(super) fn logs(shared: &Shared, pod: &str) -> anyhow::Result<()> {
    let child = shared
        .kubectl(&["logs", "--tail=3", pod])
        .spawn()
        .context("running kubectl")?;
    let (status, stdout, stderr) = wait_within(child, REQUEST_TIMEOUT)?;
    let text = String::from_utf8_lossy(&stdout);
    let ticks: Vec<u64> = text.lines().filter_map(tick).collect();
    let consecutive = ticks.len() == 3 && ticks[1] == ticks[0] + 1 && ticks[2] == ticks[1] + 1;
    if !status || !consecutive {
        bail!(
            "success {status}, {text:?}: {}",
            String::from_utf8_lossy(&stderr)
        );
    }
    Ok(())
}

/// `kubectl port-forward POD :8080` and a GET of `/bulk` through the local port it reports:
/// every byte as the pod wrote it.
pub(super) fn port_forward(shared: &Shared, pod: &str) -> anyhow::Result<()> {
    let mut child = shared
        .kubectl(&[
            "port-forward",
            "--address=127.0.0.1",
            pod,
            &format!(":{HTTP_PORT}"),
        ])
        .spawn()
        .context("running kubectl")?;
    let result = (|| {
        let stdout = child.stdout.take().context("kubectl's stdout")?;
        let port = forwarded_port(stdout)?;
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.write_all(b"GET /bulk HTTP/1.0\r\n\r\n")?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let body = response
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .map(|at| &response[at + 4..])
            .context("no HTTP response")?;
        let expected = b"0123456789abcdef\n".iter().cycle().take(BULK_SIZE);
        if body.len() != BULK_SIZE || !body.iter().eq(expected) {
            bail!(
                "{} bytes of {BULK_SIZE}, or not the pod's: {:?}",
                body.len(),
                String::from_utf8_lossy(&response[..response.len().min(200)])
            );
        }
        Ok(())
    })();
    let _ = child.kill();
    let stderr = child
        .wait_with_output()
        .map(|out| out.stderr)
        .unwrap_or_default();
    result.with_context(|| String::from_utf8_lossy(&stderr).into_owned())
}

/// The local port of kubectl port-forward's `Forwarding from 127.0.0.1:PORT -> 8080`, read
/// within [`REQUEST_TIMEOUT`] (kubectl exits, closing its output, when it fails).
fn forwarded_port(stdout: std::process::ChildStdout) -> anyhow::Result<u16> {
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let read = reader.read_line(&mut line);
        let _ = sender.send(read.map(|_| line));
        // Read on to kubectl's end: it prints a line per connection, and a Go program whose
        // stdout is a closed pipe dies of SIGPIPE on its next write.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let line = receiver
        .recv_timeout(REQUEST_TIMEOUT)
        .context("kubectl port-forward said nothing")??;
    line.strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|port| port.parse().ok())
        .with_context(|| format!("kubectl port-forward: {line:?}"))
}

/// `tick N`'s N.
pub(super) fn tick(line: &str) -> Option<u64> {
    line.strip_prefix("tick ")?.parse().ok()
}

/// Waits for `child` at most `timeout` (killed after), reading its output meanwhile: whether
/// it succeeded, its stdout and its stderr.
fn wait_within(mut child: Child, timeout: Duration) -> anyhow::Result<(bool, Vec<u8>, Vec<u8>)> {
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut data = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut data);
            }
            data
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    match status {
        Some(status) => Ok((status.success(), stdout, stderr)),
        None => bail!(
            "no answer within {timeout:?}: {}",
            String::from_utf8_lossy(&stderr)
        ),
    }
}
