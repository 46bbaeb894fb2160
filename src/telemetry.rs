//! Logging via `tracing`, as text or JSON lines. `RUST_LOG` overrides the configured level.
//! Nothing in goodput logs header values or content; the access log carries numbers only.
//!
//! The access log (target [`ACCESS_TARGET`], one line per request, written by the
//! aggregator) is buffered: its lines gather and go out in one `write(2)`
//! ([`flush_access_log`]) at each of the aggregator's samples (every 100 ms), once 64 KiB
//! have gathered, and when the aggregator stops, instead of one unbuffered write per line
//! (nginx's `access_log ... buffer= flush=` does the same). A line waits about 100 ms at
//! most. Every other line goes out at once, after the access lines before it, so the
//! order of lines is kept. In the text format without colour the aggregator writes its
//! access lines into that buffer itself ([`write_access_line`]), the bytes `tracing`
//! would have written.

use std::{
    io::{self, Write},
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use tracing::Metadata;
use tracing_subscriber::{EnvFilter, fmt, fmt::MakeWriter};

use crate::config::LogFormat;

/// The `tracing` target of the access log's lines.
pub const ACCESS_TARGET: &str = "goodput::access";

/// Access lines kept before they are written without waiting for the next sample: a burst
/// of thousands of finished requests is written in pieces of this size, not held whole.
const ACCESS_BUFFER_LIMIT: usize = 64 * 1024;

/// Installs the global subscriber once; later calls (tests) are ignored.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: escape codes in a file or a log shipper break
    // `grep id=...` and show up as garbage in journald and `docker logs`.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(Logs(&LOG))
        .with_ansi(ansi);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    DIRECT_ACCESS_LINES.store(
        installed.is_ok() && format == LogFormat::Text && !ansi,
        Ordering::Relaxed,
    );
}

/// Set once [`init`] installed the text formatter without colour: access lines may then be
/// written by their maker, as that formatter would write them.
static DIRECT_ACCESS_LINES: AtomicBool = AtomicBool::new(false);

/// Whether an access line is to be written with [`write_access_line`] rather than logged
/// as a `tracing` event: the subscriber is [`init`]'s text formatter without colour and
/// its filter lets the access target through.
pub fn access_lines_direct() -> bool {
    DIRECT_ACCESS_LINES.load(Ordering::Relaxed)
        && tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO)
}

/// Appends one access line, written by `line`, to the access log's buffer (in order with
/// every other line, as an access event's line would be).
pub fn write_access_line(line: impl FnOnce(&mut Vec<u8>)) {
    let _ = log().access_with(line);
}

/// Writes out the access lines gathered since the last call, in one write. The aggregator
/// calls it at each sample; it costs nothing when there are none.
pub fn flush_access_log() {
    // A log line that cannot be written has nowhere to be reported.
    let _ = log().flush_pending();
}

/// Lines waiting for the end of a batch, and where every line goes.
struct Batcher<W> {
    pending: Vec<u8>,
    out: W,
}

impl<W: Write> Batcher<W> {
    const fn new(out: W) -> Batcher<W> {
        Batcher {
            pending: Vec::new(),
            out,
        }
    }

    /// An access line: kept for the batch's write (written at once past the limit).
    fn access(&mut self, line: &[u8]) -> io::Result<()> {
        self.access_with(|pending| pending.extend_from_slice(line))
    }

    /// An access line written into the batch by `line`.
    fn access_with(&mut self, line: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        line(&mut self.pending);
        if self.pending.len() >= ACCESS_BUFFER_LIMIT {
            self.flush_pending()?;
        }
        Ok(())
    }

    /// Any other line: written now, after the access lines before it.
    fn other(&mut self, line: &[u8]) -> io::Result<usize> {
        self.flush_pending()?;
        self.out.write(line)
    }

    fn flush_pending(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let written = self.out.write_all(&self.pending);
        // Written or not, the lines are let go: a log that cannot be written must not
        // grow without bound.
        self.pending.clear();
        if self.pending.capacity() > ACCESS_BUFFER_LIMIT * 2 {
            self.pending.shrink_to(ACCESS_BUFFER_LIMIT);
        }
        written
    }
}

/// The process's standard error, unbuffered (as `std::io::Stderr` is).
struct StderrOut;

impl Write for StderrOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stderr().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

static LOG: Mutex<Batcher<StderrOut>> = Mutex::new(Batcher::new(StderrOut));

fn log() -> std::sync::MutexGuard<'static, Batcher<StderrOut>> {
    lock(&LOG)
}

fn lock<W>(batcher: &Mutex<Batcher<W>>) -> std::sync::MutexGuard<'_, Batcher<W>> {
    batcher.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The subscriber's writer: access lines to the batch, the rest written at once.
struct Logs<W: 'static>(&'static Mutex<Batcher<W>>);

/// One line being written (`tracing`'s formatter writes each line with one `write_all`).
struct Line<W: 'static> {
    to: &'static Mutex<Batcher<W>>,
    access: bool,
}

impl<'a, W: Write + 'static> MakeWriter<'a> for Logs<W> {
    type Writer = Line<W>;

    fn make_writer(&'a self) -> Line<W> {
        Line {
            to: self.0,
            access: false,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line<W> {
        Line {
            to: self.0,
            access: meta.target() == ACCESS_TARGET,
        }
    }
}

impl<W: Write> Write for Line<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut batcher = lock(self.to);
        if self.access {
            batcher.access(buf).map(|()| buf.len())
        } else {
            batcher.other(buf)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every write it is given, as a separate entry.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn access_lines_go_out_in_one_write_per_batch() -> io::Result<()> {
        let mut b = Batcher::new(Writes::default());
        b.access(b"a1\n")?;
        b.access(b"a2\n")?;
        b.access(b"a3\n")?;
        assert!(b.out.0.is_empty(), "nothing written before the batch ends");
        b.flush_pending()?;
        assert_eq!(b.out.0, vec![b"a1\na2\na3\n".to_vec()]);
        // An empty batch writes nothing.
        b.flush_pending()?;
        assert_eq!(b.out.0.len(), 1);
        Ok(())
    }

    #[test]
    fn other_lines_go_out_at_once_after_the_access_lines_before_them() -> io::Result<()> {
        let mut b = Batcher::new(Writes::default());
        b.access(b"a1\n")?;
        b.other(b"warn\n")?;
        b.access(b"a2\n")?;
        b.flush_pending()?;
        assert_eq!(
            b.out.0,
            vec![b"a1\n".to_vec(), b"warn\n".to_vec(), b"a2\n".to_vec()]
        );
        Ok(())
    }

    #[test]
    fn a_large_batch_is_written_in_pieces_of_the_limit() -> io::Result<()> {
        let mut b = Batcher::new(Writes::default());
        let line = [b'x'; 100];
        let lines = ACCESS_BUFFER_LIMIT / 100 * 3;
        for _ in 0..lines {
            b.access(&line)?;
        }
        b.flush_pending()?;
        let written: usize = b.out.0.iter().map(Vec::len).sum();
        assert_eq!(written, lines * 100, "every byte written once");
        assert!(b.out.0.len() >= 3, "{} writes", b.out.0.len());
        assert!(b.out.0.iter().all(|w| w.len() < ACCESS_BUFFER_LIMIT + 100));
        Ok(())
    }

    /// A destination that always fails.
    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("closed"))
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_that_cannot_be_written_are_let_go() {
        let mut b = Batcher::new(Broken);
        for _ in 0..ACCESS_BUFFER_LIMIT {
            let _ = b.access(b"0123456789\n");
        }
        assert!(b.pending.len() < ACCESS_BUFFER_LIMIT, "{}", b.pending.len());
        assert!(b.flush_pending().is_err());
        assert!(b.pending.is_empty());
    }

    #[test]
    fn the_subscriber_batches_the_access_target_only() {
        let batcher: &'static Mutex<Batcher<Writes>> =
            Box::leak(Box::new(Mutex::new(Batcher::new(Writes::default()))));
        let subscriber = fmt().with_writer(Logs(batcher)).with_ansi(false).finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: ACCESS_TARGET, id = "r1", "request");
            tracing::info!(target: ACCESS_TARGET, id = "r2", "request");
            assert!(
                lock(batcher).out.0.is_empty(),
                "access lines wait for the batch"
            );
            tracing::warn!("something else");
        });
        let writes = std::mem::take(&mut lock(batcher).out.0);
        let writes: Vec<String> = writes
            .into_iter()
            .map(|w| String::from_utf8_lossy(&w).into_owned())
            .collect();
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert!(
            writes[0].contains("id=\"r1\"") && writes[0].contains("id=\"r2\""),
            "{writes:?}"
        );
        assert!(writes[1].contains("something else"), "{writes:?}");
    }
}
