//! Splicing a socket to a stream: the data path of every tunnel.

use std::io;
use std::time::Duration;

use bridgehead_proto::frame::MAX_DATA_PAYLOAD;
use bridgehead_proto::ErrorCode;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::Notify;

use crate::{MuxStream, StreamEnd};

/// Most chunks and bytes one vectored socket write carries.
const WRITE_BATCH_CHUNKS: usize = 16;
const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// Size of the inline buffer an idle tunnel waits on.
const IDLE_READ: usize = 512;

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
/// head); they go first. On error the stream is reset. `moved` holds the byte counts when it
/// returns.
pub async fn splice<S>(
    socket: S,
    stream: &MuxStream,
    initial: Bytes,
    moved: &mut Moved,
) -> Result<(), SpliceError>
where
    S: AsyncRead + AsyncWrite,
{
    splice_holding(socket, stream, initial, None, moved).await
}

/// [`splice`], except that with `hold` the stream's first bytes wait until the socket's side
/// has sent something or `hold` has passed. A CONNECT client that checks that nothing follows
/// the `200` in the same read (kube-apiserver does) then never sees a target's greeting glued
/// to it, while a client that waits for a speak-first target gets the greeting after `hold`.
pub async fn splice_holding<S>(
    socket: S,
    stream: &MuxStream,
    initial: Bytes,
    hold: Option<Duration>,
    moved: &mut Moved,
) -> Result<(), SpliceError>
where
    S: AsyncRead + AsyncWrite,
{
    let (rd, wr) = tokio::io::split(socket);
    let spoke = Notify::new();
    let hold = hold.filter(|_| initial.is_empty());
    let up = uplink(rd, stream, initial, &spoke, &mut moved.up);
    let down = async {
        if let Some(hold) = hold {
            let _ = tokio::time::timeout(hold, spoke.notified()).await;
        }
        downlink(wr, stream, &mut moved.down).await
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
    if let Err(error) = &result {
        let (code, reason) = match error {
            SpliceError::Stream(end) => (end.code, end.reason.clone()),
            SpliceError::Io(io) => (ErrorCode::ConnectionReset, io.to_string()),
        };
        stream.reset(code, &reason);
    }
    result
}

/// Socket to stream, reading only as much as the stream's credit allows.
///
/// An idle tunnel waits on a small inline buffer; only a read that fills it switches to large
/// heap reads, and the large buffer is let go as soon as a read comes up short again, so
/// thousands of idle tunnels hold no read buffers.
async fn uplink<S: AsyncRead>(
    mut rd: ReadHalf<S>,
    stream: &MuxStream,
    initial: Bytes,
    spoke: &Notify,
    count: &mut u64,
) -> Result<(), SpliceError> {
    if initial.is_empty() {
        // It may still pin the HTTP layer's read buffer: let it go now, not at the end.
        drop(initial);
    } else {
        *count += initial.len() as u64;
        stream.write(initial).await?;
    }
    let mut small = [0u8; IDLE_READ];
    let mut big = BytesMut::new();
    let mut streaming = false;
    loop {
        let credit = stream.writable().await?;
        let chunk = if streaming {
            let want = credit.min(MAX_DATA_PAYLOAD);
            big.reserve(want);
            let n = rd.read_buf(&mut (&mut big).limit(want)).await?;
            streaming = n == want;
            let chunk = big.split().freeze();
            if !streaming {
                big = BytesMut::new();
            }
            chunk
        } else {
            let want = credit.min(IDLE_READ);
            let n = rd.read(&mut small[..want]).await?;
            streaming = n == want;
            Bytes::copy_from_slice(&small[..n])
        };
        // The socket's side has spoken (or finished): held bytes may flow.
        spoke.notify_one();
        if chunk.is_empty() {
            stream.finish()?;
            return Ok(());
        }
        *count += chunk.len() as u64;
        stream.write(chunk).await?;
    }
}

/// Stream to socket; the peer's FIN shuts the socket's write side. Chunks that are already
/// buffered when one arrives go out with it in one vectored write.
async fn downlink<S: AsyncWrite>(
    mut wr: WriteHalf<S>,
    stream: &MuxStream,
    count: &mut u64,
) -> Result<(), SpliceError> {
    while let Some(first) = stream.read().await? {
        *count += first.len() as u64;
        let Some(second) = stream.try_read() else {
            wr.write_all(&first).await?;
            continue;
        };
        // A burst: the batch exists only while it is written, so idle tunnels hold none.
        let mut size = first.len() + second.len();
        let mut batch = vec![first, second];
        while batch.len() < WRITE_BATCH_CHUNKS && size < WRITE_BATCH_BYTES {
            let Some(chunk) = stream.try_read() else {
                break;
            };
            size += chunk.len();
            batch.push(chunk);
        }
        *count += (size - batch[0].len()) as u64;
        write_all_vectored(&mut wr, &mut batch).await?;
    }
    wr.shutdown().await?;
    Ok(())
}

/// Writes every chunk of `batch`, emptying it, in as few calls as the writer allows.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    wr: &mut W,
    batch: &mut Vec<Bytes>,
) -> io::Result<()> {
    while !batch.is_empty() {
        let slices: Vec<io::IoSlice<'_>> = batch.iter().map(|c| io::IoSlice::new(c)).collect();
        let mut written = wr.write_vectored(&slices).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while let Some(chunk) = batch.first_mut() {
            if written < chunk.len() {
                chunk.advance(written);
                break;
            }
            written -= chunk.len();
            batch.remove(0);
        }
    }
    Ok(())
}
