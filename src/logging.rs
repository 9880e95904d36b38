//! Logging through `tracing`: every line carries the MPI rank; rank 0 logs at info, the others at
//! warn; `RUST_LOG` overrides both.
//!
//! The log lines, the summary lines on stdout and the progress bar go through one writer thread
//! ([`emit`]), in order. Normally the caller waits until its line is written, as with a direct
//! write. Once the process has a stop signal (SIGINT, SIGTERM, SIGHUP) it no longer waits: a
//! launcher shutting the job down (`mpirun` on SIGTERM) stops reading the ranks' output, and a
//! rank blocked writing a line would never reach its snapshot. Lines beyond a backlog of
//! [`BACKLOG`] are then dropped, and [`drain`] at the end waits for the backlog only briefly.

use crate::signals;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Prefixes each line with `[rank r/n]` and the level.
struct RankFormat {
    rank: usize,
    size: usize,
}

impl<S, N> FormatEvent<S, N> for RankFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(
            w,
            "[rank {}/{}] {:>5} ",
            self.rank,
            self.size,
            event.metadata().level()
        )?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// Installs the global subscriber for MPI rank `rank` of `size`. Logs go to stderr.
pub fn init(rank: usize, size: usize) {
    let default = if rank == 0 { "info" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| SinkWriter(Stream::Stderr))
        .event_format(RankFormat { rank, size })
        .try_init();
}

/// Where a line goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn fd(self) -> libc::c_int {
        match self {
            Stream::Stdout => libc::STDOUT_FILENO,
            Stream::Stderr => libc::STDERR_FILENO,
        }
    }
}

/// Lines a process with a stop signal keeps for a slow reader before it drops the next ones.
pub const BACKLOG: usize = 1024;
/// How often a caller waiting for its line looks again for a stop signal.
const RECHECK: Duration = Duration::from_millis(20);
/// How long [`drain`] waits for the backlog once the process has a stop signal.
const DRAIN_AFTER_STOP: Duration = Duration::from_secs(1);

/// The lines not yet written and the count of those queued and written so far.
#[derive(Default)]
struct Queue {
    lines: VecDeque<(Stream, Vec<u8>)>,
    queued: u64,
    written: u64,
}

struct Sink {
    queue: Mutex<Queue>,
    /// Signalled when a line is queued.
    more: Condvar,
    /// Signalled when a line is written.
    done: Condvar,
}

impl Sink {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until line `seq` is written; once the process has a stop signal, at most `grace`.
    fn wait_written(&self, seq: u64, grace: Duration) {
        let mut stopped_at: Option<Instant> = None;
        let mut q = self.lock();
        while q.written < seq {
            if signals::stop_signalled() {
                let since = *stopped_at.get_or_insert_with(Instant::now);
                if since.elapsed() >= grace {
                    return;
                }
            }
            q = self
                .done
                .wait_timeout(q, RECHECK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The writer thread's loop: one line at a time, in order.
    fn write_forever(&self) {
        loop {
            let (stream, bytes) = {
                let mut q = self.lock();
                loop {
                    if let Some(line) = q.lines.pop_front() {
                        break line;
                    }
                    q = self.more.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            write_fd(stream.fd(), &bytes);
            self.lock().written += 1;
            self.done.notify_all();
        }
    }
}

/// Writes all of `bytes` to `fd` (a failed write, such as a closed pipe, drops the rest).
fn write_fd(fd: libc::c_int, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid buffer of `bytes.len()` bytes.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

/// The process's output, once used.
static SINK: OnceLock<&'static Sink> = OnceLock::new();

/// The process's sink, its writer thread started on first use.
fn sink() -> &'static Sink {
    SINK.get_or_init(|| {
        let sink: &'static Sink = Box::leak(Box::new(Sink {
            queue: Mutex::new(Queue::default()),
            more: Condvar::new(),
            done: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("p2ptrain-output".into())
            .spawn(move || sink.write_forever())
            .expect("spawning the output thread");
        sink
    })
}

/// Writes `bytes` to `stream` through the writer thread. Waits until they are written unless
/// the process has a stop signal; then queues them, or drops them when [`BACKLOG`] lines wait.
pub fn emit(stream: Stream, bytes: &[u8]) {
    let sink = sink();
    let stopping = signals::stop_signalled();
    let seq = {
        let mut q = sink.lock();
        if stopping && q.lines.len() >= BACKLOG {
            return;
        }
        q.lines.push_back((stream, bytes.to_vec()));
        q.queued += 1;
        q.queued
    };
    sink.more.notify_one();
    if !stopping {
        sink.wait_written(seq, Duration::ZERO);
    }
}

/// `text` and a newline on stdout, through [`emit`].
pub fn out_line(text: &str) {
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    emit(Stream::Stdout, line.as_bytes());
}

/// Waits until every queued line is written, before the process exits; once the process has a
/// stop signal, at most a second (its reader may be gone).
pub fn drain() {
    let Some(sink) = SINK.get() else {
        return;
    };
    let last = sink.lock().queued;
    sink.wait_written(last, DRAIN_AFTER_STOP);
}

/// An `io::Write` whose every write is one [`emit`] (`tracing` writes each event at once).
#[derive(Debug, Clone, Copy)]
pub struct SinkWriter(pub Stream);

impl std::io::Write for SinkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        emit(self.0, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The progress bar's terminal: its escape sequences and text, gathered until indicatif flushes
/// a redraw and then written to stdout through [`emit`], so that a redraw never blocks a
/// stopping process either.
#[derive(Debug)]
pub struct SinkTerminal {
    width: u16,
    pending: Mutex<String>,
}

impl SinkTerminal {
    /// A terminal of stdout's width (80 columns when unknown).
    pub fn stdout() -> Self {
        // SAFETY: TIOCGWINSZ only fills the zeroed `winsize`.
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        let known = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
        SinkTerminal {
            width: if known && size.ws_col > 0 {
                size.ws_col
            } else {
                80
            },
            pending: Mutex::new(String::new()),
        }
    }

    fn push(&self, s: &str) -> std::io::Result<()> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_str(s);
        Ok(())
    }
}

impl indicatif::TermLike for SinkTerminal {
    fn width(&self) -> u16 {
        self.width
    }

    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.push(&format!("\x1b[{n}A"))
    }

    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.push(&format!("\x1b[{n}B"))
    }

    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.push(&format!("\x1b[{n}C"))
    }

    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.push(&format!("\x1b[{n}D"))
    }

    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.push(s)?;
        self.push("\n")
    }

    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.push(s)
    }

    fn clear_line(&self) -> std::io::Result<()> {
        self.push("\r\x1b[2K")
    }

    fn flush(&self) -> std::io::Result<()> {
        let text = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if !text.is_empty() {
            emit(Stream::Stdout, text.as_bytes());
        }
        Ok(())
    }
}
