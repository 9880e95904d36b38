//! The timeline file of `p2ptrain train --timeline FILE`: the replicas' recorded spans
//! (`parallel::timeline`) rendered as Chrome Trace Event Format JSON, loadable in
//! chrome://tracing and Perfetto. Each process renders its replicas' spans; process 0 gathers them
//! over MPI at the end of the run and writes one file.
//!
//! Layout: pid = MPI rank (named `rank R (host)`), tid = universal rank of the replica (named
//! `replica U`); a GPU replica's compute-stream spans go to tid `DEVICE_TID + U`
//! (`replica U (GPU)`), its communication stream's to `COMM_TID + U` (`replica U (GPU comm)`),
//! its update stream's to `UPDATE_TID + U` (`replica U (GPU update)`).
//! Every span is a complete event (`"ph": "X"`) with `ts` and `dur` in microseconds since the
//! start barrier, and `args.iter` where known. Names: `data wait`, `forward`, `backward`,
//! `all-reduce`, `update`, `test`, `parameter averaging`, `forward LAYER`, `backward LAYER`,
//! `all-reduce bucket B` (with `args.bucket` and `args.bytes`, the gradient bytes it put on the
//! wire), `update bucket B` (with `args.bucket`: the update behind the backward).

use crate::dist::Bootstrap;
use crate::error::{Error, Result};
use crate::spans::{Name, ReplicaTrace, Span, Step, Track};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;

/// Offset of the device (compute stream) tracks' thread ids.
pub const DEVICE_TID: usize = 1_000_000;
/// Offset of the device communication streams' thread ids.
pub const COMM_TID: usize = 2_000_000;
/// Offset of the device update streams' thread ids.
pub const UPDATE_TID: usize = 3_000_000;

fn tid(replica: usize, track: Track) -> usize {
    match track {
        Track::Host => replica,
        Track::Device => DEVICE_TID + replica,
        Track::Comm => COMM_TID + replica,
        Track::Update => UPDATE_TID + replica,
    }
}

fn name(span: &Span, layers: &[String]) -> String {
    let layer = |i: u32| layers.get(i as usize).map_or("?", String::as_str);
    match span.name {
        Name::Step(p) => p.label().to_string(),
        Name::Test => "test".into(),
        Name::Average => "parameter averaging".into(),
        Name::Forward(i) => format!("forward {}", layer(i)),
        Name::Backward(i) => format!("backward {}", layer(i)),
        Name::Bucket { index, .. } => format!("all-reduce bucket {index}"),
        Name::UpdatePart { index } => format!("update bucket {index}"),
    }
}

fn category(span: &Span) -> &'static str {
    match span.name {
        Name::Step(Step::AllReduce) | Name::Average | Name::Bucket { .. } => "comm",
        Name::Step(_) => "step",
        Name::Test => "test",
        Name::Forward(_) | Name::Backward(_) => "layer",
        Name::UpdatePart { .. } => "update",
    }
}

/// The events of one process (MPI rank `rank` on `host`): metadata naming the process and its
/// tracks, then each track's spans in order of start.
pub fn events(rank: usize, host: &str, traces: &[ReplicaTrace]) -> Vec<Value> {
    let mut out = vec![
        json!({"name": "process_name", "ph": "M", "pid": rank,
               "args": {"name": format!("rank {rank} ({host})")}}),
        json!({"name": "process_sort_index", "ph": "M", "pid": rank,
               "args": {"sort_index": rank}}),
    ];
    for t in traces {
        let mut spans: Vec<&Span> = t.log.spans.iter().collect();
        spans.sort_by_key(|s| (s.track, s.start_ns, std::cmp::Reverse(s.dur_ns)));
        let mut tracks: Vec<Track> = spans.iter().map(|s| s.track).collect();
        tracks.dedup();
        for track in tracks {
            let label = match track {
                Track::Host => format!("replica {}", t.replica),
                Track::Device => format!("replica {} (GPU)", t.replica),
                Track::Comm => format!("replica {} (GPU comm)", t.replica),
                Track::Update => format!("replica {} (GPU update)", t.replica),
            };
            let tid = tid(t.replica, track);
            out.push(
                json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                            "args": {"name": label}}),
            );
            out.push(
                json!({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                            "args": {"sort_index": tid}}),
            );
        }
        for s in spans {
            let mut e = json!({
                "name": name(s, &t.log.layer_names),
                "cat": category(s),
                "ph": "X",
                "ts": s.start_ns as f64 / 1e3,
                "dur": s.dur_ns as f64 / 1e3,
                "pid": rank,
                "tid": tid(t.replica, s.track),
            });
            if let Some(iter) = s.iter {
                e["args"] = json!({ "iter": iter });
            }
            match s.name {
                Name::Bucket { index, bytes } => {
                    e["args"]["bucket"] = json!(index);
                    e["args"]["bytes"] = json!(bytes);
                }
                Name::UpdatePart { index } => e["args"]["bucket"] = json!(index),
                _ => {}
            }
            out.push(e);
        }
    }
    out
}

/// Gathers every process's events on process 0, which writes `path`. A collective: every process
/// calls it, from its main thread, after its replicas have finished.
pub fn write(boot: &Bootstrap, host: &str, traces: &[ReplicaTrace], path: &Path) -> Result<()> {
    let mine = serde_json::to_vec(&events(boot.rank, host, traces))
        .map_err(|e| Error::Comm(format!("serialising the timeline: {e}")))?;
    let Some(all) = boot.gather_bytes(&mine) else {
        return Ok(());
    };
    let mut merged: Vec<Value> = Vec::new();
    for (rank, bytes) in all.iter().enumerate() {
        let events: Vec<Value> = serde_json::from_slice(bytes)
            .map_err(|e| Error::Comm(format!("the timeline of rank {rank} is corrupt: {e}")))?;
        merged.extend(events);
    }
    let doc = json!({
        "traceEvents": merged,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "p2ptrain", "clock": "microseconds since the start barrier"},
    });
    let ctx = |e| Error::io(format!("writing {}", path.display()), e);
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(ctx)?);
    serde_json::to_writer(&mut file, &doc).map_err(|e| ctx(e.into()))?;
    file.flush().map_err(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spans::SpanLog;
    use std::time::{Duration, Instant};

    #[test]
    fn spans_become_complete_events_named_by_phase_and_layer() {
        let origin = Instant::now();
        let mut log = SpanLog::with_capacity(origin, 4);
        log.layer_names = vec!["ip1".into(), "loss".into()];
        let at = |us: u64| origin + Duration::from_micros(us);
        // Pushed in the order a pass finishes them: the layer before its enclosing phase.
        log.push(Name::Forward(1), Track::Host, at(10), at(30), 0);
        log.push(Name::Step(Step::Forward), Track::Host, at(5), at(40), 0);
        log.push_ns(Name::Step(Step::Update), Track::Device, 50_000, 2_000, None);
        let ev = events(3, "node7", &[ReplicaTrace { replica: 6, log }]);
        let x: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 3);
        assert_eq!(x[0]["name"], "forward");
        assert_eq!(x[0]["ts"], 5.0);
        assert_eq!(x[0]["dur"], 35.0);
        assert_eq!(x[0]["args"]["iter"], 0);
        assert_eq!(x[1]["name"], "forward loss");
        assert_eq!(x[1]["cat"], "layer");
        assert_eq!(
            (x[1]["pid"].clone(), x[1]["tid"].clone()),
            (json!(3), json!(6))
        );
        assert_eq!(x[2]["name"], "update");
        assert_eq!(x[2]["tid"], json!(DEVICE_TID + 6));
        assert!(x[2].get("args").is_none());
        let names: Vec<&Value> = ev
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| &e["args"]["name"])
            .collect();
        assert!(names.contains(&&json!("rank 3 (node7)")), "{names:?}");
        assert!(names.contains(&&json!("replica 6 (GPU)")), "{names:?}");
    }

    /// A bucket's all-reduce is a `comm` event with its index and bytes, on the replica's
    /// communication-stream track where it ran there (a GPU), on its host track otherwise.
    #[test]
    fn bucket_spans_carry_their_index_and_bytes() {
        let mut log = SpanLog::with_capacity(Instant::now(), 2);
        let bucket = |index, bytes| Name::Bucket { index, bytes };
        log.push_ns(bucket(1, 2048), Track::Comm, 7_000, 3_000, None);
        log.push_ns(bucket(0, 4096), Track::Host, 1_000, 500, Some(4));
        let ev = events(0, "h", &[ReplicaTrace { replica: 2, log }]);
        let x: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 2);
        assert_eq!(x[0]["name"], "all-reduce bucket 0");
        assert_eq!(x[0]["cat"], "comm");
        assert_eq!(x[0]["tid"], json!(2));
        assert_eq!(x[0]["args"], json!({"iter": 4, "bucket": 0, "bytes": 4096}));
        assert_eq!(x[1]["name"], "all-reduce bucket 1");
        assert_eq!(x[1]["tid"], json!(COMM_TID + 2));
        assert_eq!(x[1]["args"], json!({"bucket": 1, "bytes": 2048}));
        assert_eq!(
            (x[1]["ts"].clone(), x[1]["dur"].clone()),
            (json!(7.0), json!(3.0))
        );
        assert!(ev
            .iter()
            .any(|e| e["ph"] == "M" && e["args"]["name"] == "replica 2 (GPU comm)"));
    }

    /// A bucket's update behind the backward is an `update` event with its index, on the
    /// replica's update-stream track.
    #[test]
    fn update_parts_carry_their_bucket_on_the_update_track() {
        let mut log = SpanLog::with_capacity(Instant::now(), 1);
        log.push_ns(
            Name::UpdatePart { index: 3 },
            Track::Update,
            2_000,
            1_500,
            None,
        );
        let ev = events(1, "h", &[ReplicaTrace { replica: 5, log }]);
        let x: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 1);
        assert_eq!(x[0]["name"], "update bucket 3");
        assert_eq!(x[0]["cat"], "update");
        assert_eq!(x[0]["tid"], json!(UPDATE_TID + 5));
        assert_eq!(x[0]["args"], json!({"bucket": 3}));
        assert!(ev
            .iter()
            .any(|e| e["ph"] == "M" && e["args"]["name"] == "replica 5 (GPU update)"));
    }
}
