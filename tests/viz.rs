//! The two ways to see a run, through the real binary: `p2ptrain plot` (SVG and PNG figures of
//! briefly trained quickstarts, and its errors) and `p2ptrain train --timeline` under mpirun
//! (a Chrome trace with both ranks' step phases, per-layer spans and all-reduces).

mod common;

use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `p2ptrain ARGS...` alone (a singleton MPI process).
fn p2ptrain(args: &[&str]) -> std::process::Output {
    let mut c = alone();
    c.args(args);
    run(&mut c)
}

/// Trains the quickstart for a few iterations into `dir`.
fn train_quickstart(dir: &Path, extra: &[&str]) {
    let mut args = with_sets(
        &["train", "--no-progress", "--output", dir.to_str().unwrap()],
        &[
            "solver.max_iter=40",
            "solver.display=5",
            "solver.test_interval=20",
        ],
    );
    args.extend_from_slice(extra);
    ok(&p2ptrain(&args));
}

#[test]
fn plot_draws_briefly_trained_quickstarts_to_svg_and_png() {
    let dir = out_dir("plot");
    train_quickstart(&dir.join("runs/quick"), &[]);
    train_quickstart(&dir.join("runs/slow"), &["--set", "solver.base_lr=0.01"]);
    let (quick, slow) = (dir.join("runs/quick/metrics.jsonl"), dir.join("runs/slow"));
    let svg = dir.join("curves.svg");
    let png = dir.join("curves.png");
    for (fig, extra) in [(&svg, None), (&png, Some("--log-loss"))] {
        let mut args = vec![
            "plot",
            quick.to_str().unwrap(),
            slow.to_str().unwrap(),
            "--label",
            "baseline",
            "-o",
            fig.to_str().unwrap(),
        ];
        args.extend(extra);
        let out = p2ptrain(&args);
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains(&format!("wrote {}", fig.display())));
    }

    // The SVG is well-formed XML whose text names both runs and the four panels.
    let doc = std::fs::read_to_string(&svg).unwrap();
    let xml = roxmltree::Document::parse(&doc).expect("the SVG parses as XML");
    assert_eq!(xml.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = xml
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .collect();
    for want in [
        "baseline",
        "slow",
        "Training loss vs iteration",
        "Training loss vs wall time (s)",
        "Test accuracy vs iteration",
        "Test accuracy vs wall time (s)",
    ] {
        assert!(
            texts.iter().any(|t| t.trim() == want),
            "no text {want:?} in {texts:?}"
        );
    }
    // Two runs: each panel has a polyline per run.
    let lines = xml
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    assert!(lines >= 8, "{lines} polylines");

    // The PNG: its signature, the figure's size, and ink on the page (lines and text).
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
    let mut reader = decoder.read_info().expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG pixels");
    assert_eq!((info.width, info.height), (1280, 960));
    let px = info.line_size / info.width as usize;
    let dark = buf[..info.buffer_size()]
        .chunks(px)
        .filter(|p| p[..3].iter().all(|&c| c < 100))
        .count();
    assert!(dark > 2_000, "only {dark} dark pixels: no text drawn?");
}

#[test]
fn plot_names_a_bad_metrics_file_and_line_and_exits_2() {
    let dir = out_dir("plot_errors");
    // The second line is cut short.
    let lines =
        "{\"iter\":0,\"phase\":\"train\",\"loss\":1,\"elapsed_s\":0.1}\n{\"iter\":1,\"phase\":\n";
    let bad = metrics_file(&dir, lines);
    let fig = dir.join("f.svg");
    let cases: [(&Path, &Path, &str); 3] = [
        (&bad, &fig, &format!("{}:2: not JSON", bad.display())),
        (
            Path::new("/nonexistent/run/metrics.jsonl"),
            &fig,
            "/nonexistent/run/metrics.jsonl",
        ),
        (&bad, Path::new("f.pdf"), "f.pdf: unknown figure format"),
    ];
    for (input, output, msg) in cases {
        let out = p2ptrain(&[
            "plot",
            input.to_str().unwrap(),
            "-o",
            output.to_str().unwrap(),
        ]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{all}");
        assert!(all.contains(msg), "expected {msg:?} in {all}");
        assert!(!all.contains("panicked"), "{all}");
    }
    assert!(!fig.exists());
}

#[test]
fn timeline_under_mpirun_holds_both_ranks_per_layer_spans_and_all_reduces() {
    let dir = out_dir("timeline");
    let file = dir.join("timeline.json");
    let out = mpi_p2ptrain(
        2,
        &[
            "--no-progress",
            "--output",
            dir.to_str().unwrap(),
            "--set",
            "solver.max_iter=12",
            "--set",
            "solver.test_interval=6",
            "--timeline",
            file.to_str().unwrap(),
            "--timeline-iters",
            "4",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("timeline: {}", file.display())));
    assert!(!dir.join("timeline.json.rank1").exists());
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap())
        .expect("the timeline is JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    let spans: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();

    // Per rank: how often each name occurs.
    let mut names: BTreeMap<u64, BTreeMap<String, usize>> = BTreeMap::new();
    for e in &spans {
        let pid = e["pid"].as_u64().expect("pid");
        let name = e["name"].as_str().expect("name").to_string();
        *names.entry(pid).or_default().entry(name).or_default() += 1;
    }
    assert_eq!(names.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
    for (pid, counts) in &names {
        // The quickstart's layers: ip1 relu1 ip2 relu2 ip3 loss; one sub-batch per iteration.
        for layer in ["ip1", "relu1", "ip2", "relu2", "ip3", "loss"] {
            for pass in ["forward", "backward"] {
                let n = counts.get(&format!("{pass} {layer}")).copied();
                assert_eq!(n, Some(4), "rank {pid}: {pass} {layer}: {counts:?}");
            }
        }
        for phase in ["data wait", "forward", "backward", "all-reduce", "update"] {
            assert_eq!(
                counts.get(phase),
                Some(&4),
                "rank {pid}: {phase}: {counts:?}"
            );
        }
        // Test passes are recorded past the window: at iteration 6 and after the last.
        assert_eq!(counts.get("test"), Some(&2), "rank {pid}: {counts:?}");
    }
    // The CPU's one gradient bucket, the whole gradient: an all-reduce span with its bytes
    // (4 per FP32 float), inside the step's all-reduce phase of the same iteration.
    let buckets: Vec<&&Value> = spans
        .iter()
        .filter(|e| e["name"] == "all-reduce bucket 0")
        .collect();
    assert_eq!(buckets.len(), 8, "4 iterations × 2 ranks");
    for b in &buckets {
        assert_eq!(b["cat"], "comm", "{b}");
        let bytes = b["args"]["bytes"].as_u64().expect("bytes");
        assert!(bytes > 0 && bytes % 4 == 0, "{b}");
        assert_eq!(b["args"]["bytes"], buckets[0]["args"]["bytes"]);
        let inside = spans.iter().any(|p| {
            let (ps, pe) = (p["ts"].as_f64().unwrap(), p["dur"].as_f64().unwrap());
            let (bs, bd) = (b["ts"].as_f64().unwrap(), b["dur"].as_f64().unwrap());
            p["name"] == "all-reduce"
                && (p["pid"].clone(), p["tid"].clone()) == (b["pid"].clone(), b["tid"].clone())
                && p["args"]["iter"] == b["args"]["iter"]
                && ps <= bs + 1e-4
                && bs + bd <= ps + pe + 1e-4
        });
        assert!(inside, "{b} lies outside its all-reduce phase");
    }

    // Non-negative times, each track in order of start, per-layer spans inside their pass.
    let mut last: BTreeMap<(u64, u64), f64> = BTreeMap::new();
    for e in &spans {
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        let track = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let prev = last.insert(track, ts).unwrap_or(0.0);
        assert!(ts >= prev, "track {track:?} goes back in time at {e}");
    }
    for e in spans.iter().filter(|e| e["cat"] == "layer") {
        let pass = e["name"].as_str().unwrap().split(' ').next().unwrap();
        let span = |v: &Value| {
            let ts = v["ts"].as_f64().unwrap();
            (ts, ts + v["dur"].as_f64().unwrap())
        };
        let (start, end) = span(e);
        // Microseconds with nanosecond digits: allow a rounding error well below a nanosecond.
        let eps = 1e-4;
        let inside = spans.iter().any(|p| {
            let (ps, pe) = span(p);
            p["name"] == pass
                && p["pid"] == e["pid"]
                && p["args"]["iter"] == e["args"]["iter"]
                && ps <= start + eps
                && pe + eps >= end
        });
        assert!(inside, "{e} lies outside its {pass} span");
    }
    let threads: BTreeSet<String> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        threads,
        BTreeSet::from(["replica 0".to_string(), "replica 1".to_string()])
    );
}

#[test]
fn an_unwritable_timeline_fails_before_training_with_exit_2() {
    let out = p2ptrain(&[
        "--no-progress",
        "--output",
        out_dir("timeline_bad").to_str().unwrap(),
        "--timeline",
        "/nonexistent/dir/t.json",
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("--timeline /nonexistent/dir/t.json"), "{all}");
    assert!(!all.contains("trained"), "{all}");
}
