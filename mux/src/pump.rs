//! Splicing a socket to a stream: the data path of every tunnel.

use std::io;

use bridgehead_proto::frame::MAX_DATA_PAYLOAD;
use bridgehead_proto::ErrorCode;
use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{MuxStream, StreamEnd};

/// Bytes moved by a finished splice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// From the socket into the stream.
    pub up: u64,
    /// From the stream into the socket.
    pub down: u64,
}

/// Why a splice ended abnormally. The stream has been reset; the socket should be closed with
/// a TCP RST so the client sees the failure.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    /// The other end reset the stream.
    #[error(transparent)]
    Stream(#[from] StreamEnd),
    /// Reading or writing the local socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
}

/// Copies bytes both ways between `socket` and `stream` until both directions ended. A socket
/// EOF becomes FIN on the stream and the peer's FIN shuts the socket's write side, so each
/// direction ends on its own. `initial` holds bytes the client sent ahead (after its CONNECT
/// head); they go first. On error the stream is reset. `moved` counts progress as it happens.
pub async fn splice<S>(
    socket: S,
    stream: &MuxStream,
    initial: bytes::Bytes,
    moved: &mut Moved,
) -> Result<(), SpliceError>
where
    S: AsyncRead + AsyncWrite,
{
    let (mut rd, mut wr) = tokio::io::split(socket);
    let mut up_bytes = 0u64;
    let mut down_bytes = 0u64;
    let result = {
        let up = async {
            if !initial.is_empty() {
                up_bytes += initial.len() as u64;
                stream.write(initial).await?;
            }
            let mut buf = BytesMut::new();
            loop {
                let credit = stream.writable().await?;
                let want = credit.min(MAX_DATA_PAYLOAD);
                buf.reserve(want);
                let n = rd.read_buf(&mut (&mut buf).limit(want)).await?;
                if n == 0 {
                    stream.finish()?;
                    return Ok::<(), SpliceError>(());
                }
                up_bytes += n as u64;
                stream.write(buf.split().freeze()).await?;
            }
        };
        let down = async {
            while let Some(chunk) = stream.read().await? {
                down_bytes += chunk.len() as u64;
                wr.write_all(&chunk).await?;
            }
            wr.shutdown().await?;
            Ok::<(), SpliceError>(())
        };
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        let result = loop {
            tokio::select! {
                result = &mut up, if !up_done => match result {
                    Ok(()) => up_done = true,
                    Err(error) => break Err(error),
                },
                result = &mut down, if !down_done => match result {
                    Ok(()) => down_done = true,
                    Err(error) => break Err(error),
                },
            }
            if up_done && down_done {
                break Ok(());
            }
        };
        result
    };
    if let Err(error) = &result {
        let (code, reason) = match error {
            SpliceError::Stream(end) => (end.code, end.reason.clone()),
            SpliceError::Io(io) => (ErrorCode::ConnectionReset, io.to_string()),
        };
        stream.reset(code, &reason);
    }
    moved.up = up_bytes;
    moved.down = down_bytes;
    result
}
