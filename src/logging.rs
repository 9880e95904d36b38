//! Logging through `tracing`: every line carries the MPI rank; rank 0 logs at info, the others at
//! warn; `RUST_LOG` overrides both.

use std::fmt;
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
        .with_writer(std::io::stderr)
        .event_format(RankFormat { rank, size })
        .try_init();
}
