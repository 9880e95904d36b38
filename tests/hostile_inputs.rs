//! Inputs that are not what they claim to be, through the real binary: a FIFO or a device where a
//! file is expected, extreme config values, malformed IDX headers, a gzip bomb, metrics of extreme
//! values for `plot`, and a figure written onto a full device. Each is refused with exit code 2
//! naming the file or key (1 for a failed write), and none may hang: every run has a deadline.

mod common;

use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Far longer than any of these runs takes; only a hang reaches it.
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `p2ptrain args...` alone (no launcher) in `dir`, killing it and failing the test if it
/// is still running after [`DEADLINE`].
fn p2ptrain_within_deadline(dir: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args);
    within_deadline(c, dir)
}

/// Trains the equivalence config into `dir/run` with the `--set` options `sets` and then the
/// arguments `extra`, as [`p2ptrain_within_deadline`] runs it.
fn train_within_deadline(dir: &Path, sets: &[&str], extra: &[&str]) -> Output {
    let (config, run) = (repo("tests/configs/equivalence.toml"), dir.join("run"));
    let mut args = train_args(&config, &run, sets);
    args.extend_from_slice(extra);
    p2ptrain_within_deadline(dir, &args)
}

/// Runs `c` in `dir` (output to files there), killing it and failing the test if it is still
/// running after [`DEADLINE`].
fn within_deadline(mut c: Command, dir: &Path) -> Output {
    let (out_path, err_path) = (dir.join("stdout.txt"), dir.join("stderr.txt"));
    mpi_env(&mut c);
    c.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut child = c.spawn().expect("starting p2ptrain");
    let status = wait_within(&mut child, DEADLINE).unwrap_or_else(|| {
        panic!(
            "{c:?} still running after {DEADLINE:?} (hung); stderr:\n{}",
            std::fs::read_to_string(&err_path).unwrap_or_default()
        )
    });
    let out = Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    };
    eprintln!("--- {c:?}\n--- exit {:?}\n{}", status.code(), text(&out));
    out
}

/// Asserts that `out` exited with `code` and that its output names every one of `want`.
fn failed_naming(out: &Output, code: i32, want: &[&str]) {
    let all = text(out);
    assert_eq!(out.status.code(), Some(code), "{all}");
    for w in want {
        assert!(all.contains(w), "output lacks {w:?}:\n{all}");
    }
}

/// Makes a FIFO at `path` (nothing ever writes to it) and returns the path.
fn mkfifo(path: PathBuf) -> PathBuf {
    let status = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn threads_per_replica_beyond_the_limit_is_refused_naming_the_key() {
    let dir = out_dir("hostile_threads");
    let config = equivalence_config();
    let args = with_sets(&["check", &config], &["cluster.threads_per_replica=100000"]);
    let out = p2ptrain_within_deadline(&dir, &args);
    failed_naming(&out, 2, &["`cluster.threads_per_replica`", "4096"]);
    assert!(!text(&out).contains("panicked"), "{}", text(&out));
}

#[test]
fn a_fifo_as_the_config_file_is_refused_not_waited_on() {
    let dir = out_dir("hostile_fifo_config");
    let fifo = mkfifo(dir.join("config.toml"));
    let out = p2ptrain_within_deadline(&dir, &["check", s(&fifo)]);
    failed_naming(&out, 2, &[s(&fifo), "a FIFO"]);
}

#[test]
fn dev_zero_as_the_config_file_is_refused_not_read() {
    let dir = out_dir("hostile_zero_config");
    let out = p2ptrain_within_deadline(&dir, &["check", "/dev/zero"]);
    failed_naming(&out, 2, &["/dev/zero", "not a regular file"]);
}

#[test]
fn a_fifo_or_a_device_as_weights_is_refused_not_waited_on() {
    let dir = out_dir("hostile_fifo_weights");
    let fifo = mkfifo(dir.join("w.safetensors"));
    for weights in [s(&fifo), "/dev/zero"] {
        let out = train_within_deadline(&dir, &["solver.max_iter=1"], &["--weights", weights]);
        failed_naming(&out, 2, &[weights, "not a regular file"]);
    }
}

#[test]
fn a_fifo_as_the_resumed_snapshot_is_refused_not_waited_on() {
    let dir = out_dir("hostile_fifo_resume");
    let state = mkfifo(dir.join("equiv_iter_5.solverstate"));
    mkfifo(dir.join("equiv_iter_5.safetensors"));
    let out = train_within_deadline(&dir, &[], &["--resume", s(&state)]);
    failed_naming(&out, 2, &["equiv_iter_5.", "a FIFO"]);
}

#[test]
fn a_fifo_as_a_plot_input_is_refused_not_waited_on() {
    let dir = out_dir("hostile_fifo_plot");
    let fifo = mkfifo(dir.join("metrics.jsonl"));
    let out = p2ptrain_within_deadline(&dir, &["plot", s(&fifo), "-o", "fig.svg"]);
    failed_naming(&out, 2, &[s(&fifo), "a FIFO"]);
}

/// A config of the bundled digits' test set and the IDX training files given.
fn idx_config(dir: &Path, train_images: &Path, train_labels: &Path) -> PathBuf {
    let digits = repo("data/digits");
    let text = std::fs::read_to_string(equivalence_config())
        .unwrap()
        .replace(
            "format = \"digits\"",
            &format!(
                "format = \"idx\"\ntrain_images = \"{}\"\ntrain_labels = \"{}\"\n\
             test_images = \"{}\"\ntest_labels = \"{}\"",
                train_images.display(),
                train_labels.display(),
                digits.join("test-images-idx3-ubyte.gz").display(),
                digits.join("test-labels-idx1-ubyte.gz").display()
            ),
        );
    let path = dir.join("idx.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The header of an IDX u8 image file of `dims`.
fn idx_image_header(dims: [u32; 3]) -> Vec<u8> {
    let mut b = 0x0803u32.to_be_bytes().to_vec();
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b
}

fn bundled_train_labels() -> PathBuf {
    repo("data/digits/train-labels-idx1-ubyte.gz")
}

#[test]
fn idx_images_of_zero_rows_are_blamed_on_the_header_field_not_a_data_key() {
    let dir = out_dir("hostile_idx_zero_rows");
    let images = dir.join("zero-rows-idx3-ubyte");
    std::fs::write(&images, idx_image_header([1500, 0, 8])).unwrap();
    let config = idx_config(&dir, &images, &bundled_train_labels());
    let out = p2ptrain_within_deadline(&dir, &["check", s(&config)]);
    failed_naming(
        &out,
        2,
        &[s(&images), "`data.train_images`", "`rows`", "is 0"],
    );
    assert!(!text(&out).contains("data.shift"), "{}", text(&out));
}

#[test]
fn idx_dimensions_whose_product_overflows_are_blamed_on_the_header() {
    let dir = out_dir("hostile_idx_overflow");
    let images = dir.join("huge-idx3-ubyte");
    std::fs::write(&images, idx_image_header([u32::MAX; 3])).unwrap();
    let config = idx_config(&dir, &images, &bundled_train_labels());
    let out = p2ptrain_within_deadline(&dir, &["check", s(&config)]);
    failed_naming(&out, 2, &[s(&images), "`data.train_images`", "overflow"]);
    assert!(!text(&out).contains("data.batch_size"), "{}", text(&out));
    // A product that fits in 64 bits, of images far too large (gzip: no file length to compare).
    let images = dir.join("wide-idx3-ubyte.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&idx_image_header([1500, u32::MAX, u32::MAX]))
        .unwrap();
    std::fs::write(&images, gz.finish().unwrap()).unwrap();
    let config = idx_config(&dir, &images, &bundled_train_labels());
    let out = p2ptrain_within_deadline(&dir, &["check", s(&config)]);
    failed_naming(&out, 2, &[s(&images), "`rows` × `columns`", "2^31"]);
    assert!(!text(&out).contains("data.batch_size"), "{}", text(&out));
}

#[test]
fn idx_dimensions_that_disagree_with_the_file_length_are_refused_before_training() {
    let dir = out_dir("hostile_idx_length");
    let images = dir.join("short-idx3-ubyte");
    let mut bytes = idx_image_header([1500, 8, 8]);
    bytes.resize(bytes.len() + 100, 0);
    std::fs::write(&images, bytes).unwrap();
    let config = idx_config(&dir, &images, &bundled_train_labels());
    let out = p2ptrain_within_deadline(&dir, &["check", s(&config)]);
    failed_naming(&out, 2, &[s(&images), "declare 96016 bytes", "holds 116"]);
}

#[test]
fn a_gzip_bomb_is_refused_once_past_what_its_idx_header_declares() {
    let dir = out_dir("hostile_gzip_bomb");
    let images = dir.join("bomb-idx3-ubyte.gz");
    let mut raw = idx_image_header([1500, 8, 8]);
    raw.resize(raw.len() + 1500 * 64 + (64 << 20), 0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&raw).unwrap();
    std::fs::write(&images, gz.finish().unwrap()).unwrap();
    let config = idx_config(&dir, &images, &bundled_train_labels());
    let out = p2ptrain_within_deadline(
        &dir,
        &[
            s(&config),
            "--output",
            s(&dir.join("run")),
            "--set",
            "solver.max_iter=1",
        ],
    );
    failed_naming(
        &out,
        2,
        &[
            s(&images),
            "more than the 96016 bytes its IDX header declares",
        ],
    );
}

#[test]
fn a_negative_pad_says_what_the_key_accepts_and_where() {
    let dir = out_dir("hostile_negative_pad");
    let text = std::fs::read_to_string(repo("config/digits_cnn.toml")).unwrap();
    assert!(text.contains("\npad = 1\n"));
    let config = dir.join("cnn.toml");
    std::fs::write(&config, text.replacen("\npad = 1\n", "\npad = -1\n", 1)).unwrap();
    let out = p2ptrain_within_deadline(&dir, &["check", s(&config)]);
    failed_naming(
        &out,
        2,
        &[
            "cnn.toml:38:",
            "`layer[0].pad`",
            "expected a non-negative integer or a list of them",
            "found -1",
        ],
    );
    let config = dir.join("cnn_list.toml");
    let text = std::fs::read_to_string(repo("config/digits_cnn.toml")).unwrap();
    std::fs::write(
        &config,
        text.replacen("\npad = 1\n", "\npad = [1, -2]\n", 1),
    )
    .unwrap();
    let out = p2ptrain_within_deadline(&dir, &["check", s(&config)]);
    failed_naming(&out, 2, &["cnn_list.toml:38:", "`layer[0].pad", "found -2"]);
}

/// A metrics file whose losses and clock span ±1e308.
fn extreme_metrics(dir: &Path) -> PathBuf {
    metrics_file(
        dir,
        "{\"iter\":0,\"phase\":\"train\",\"loss\":1e308,\"elapsed_s\":-1e308}\n\
         {\"iter\":1,\"phase\":\"train\",\"loss\":-1e308,\"elapsed_s\":1e308}\n\
         {\"iter\":2,\"phase\":\"train\",\"loss\":1e-300,\"elapsed_s\":1.5}\n\
         {\"iter\":2,\"phase\":\"test\",\"loss\":1e308,\"accuracy\":0.5}\n",
    )
}

#[test]
fn plotting_losses_and_times_of_1e308_ends_with_a_figure() {
    let dir = out_dir("hostile_plot_extremes");
    let metrics = extreme_metrics(&dir);
    for (figure, log) in [("fig.svg", false), ("fig.png", false), ("log.svg", true)] {
        let mut args = vec!["plot", s(&metrics), "-o", figure];
        if log {
            args.push("--log-loss");
        }
        ok(&p2ptrain_within_deadline(&dir, &args));
        let len = std::fs::metadata(dir.join(figure)).unwrap().len();
        assert!(len > 1000, "{figure}: {len} bytes");
    }
}

#[test]
fn plotting_onto_a_full_device_fails_and_does_not_say_wrote() {
    let dir = out_dir("hostile_plot_full");
    let metrics = extreme_metrics(&dir);
    std::fs::write(
        &metrics,
        "{\"iter\":0,\"phase\":\"train\",\"loss\":2.3,\"elapsed_s\":0.5}\n",
    )
    .unwrap();
    let figure = dir.join("fig.svg");
    std::os::unix::fs::symlink("/dev/full", &figure).unwrap();
    let out = p2ptrain_within_deadline(&dir, &["plot", s(&metrics), "-o", s(&figure)]);
    failed_naming(&out, 1, &[s(&figure)]);
    assert!(!text(&out).contains("wrote"), "{}", text(&out));
}

#[test]
fn a_figure_that_cannot_be_written_whole_leaves_the_previous_one_intact() {
    let dir = out_dir("hostile_plot_file_size_limit");
    let metrics = metrics_file(
        &dir,
        "{\"iter\":0,\"phase\":\"train\",\"loss\":2.3,\"elapsed_s\":0.5}\n\
         {\"iter\":9,\"phase\":\"train\",\"loss\":1.1,\"elapsed_s\":2.0}\n",
    );
    ok(&p2ptrain_within_deadline(
        &dir,
        &["plot", s(&metrics), "-o", "whole.svg"],
    ));
    let size = std::fs::metadata(dir.join("whole.svg")).unwrap().len();
    assert!(size > 4096, "a figure of {size} bytes");
    std::fs::write(dir.join("fig.svg"), "the previous figure").unwrap();
    // A file size limit (in KiB, SIGXFSZ ignored) a little below the figure's size: the disk
    // fills up part way through the write.
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f {}; exec \"$0\" \"$@\"",
            size / 1024 - 1
        ))
        .arg(bin())
        .args(["plot", s(&metrics), "-o", "fig.svg"]);
    let out = within_deadline(c, &dir);
    failed_naming(&out, 1, &["fig.svg"]);
    assert!(!text(&out).contains("wrote"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(dir.join("fig.svg")).unwrap(),
        "the previous figure"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn a_fifo_as_the_mean_file_is_refused_not_waited_on() {
    let dir = out_dir("hostile_fifo_mean");
    std::fs::write(dir.join("train.bin"), cifar10_records(16, 0, 1)).unwrap();
    std::fs::write(dir.join("test.bin"), cifar10_records(8, 0, 2)).unwrap();
    mkfifo(dir.join("mean.binaryproto"));
    let config = dir.join("cifar.toml");
    std::fs::write(
        &config,
        format!(
            r#"[data]
format = "cifar10"
train_files = ["train.bin"]
test_files = ["test.bin"]
batch_size = 8
mean_file = "mean.binaryproto"

[solver]
base_lr = 0.05
max_iter = 1

{}"#,
            config_text::linear_classifier("data", 10, "")
        ),
    )
    .unwrap();
    let out = p2ptrain_within_deadline(&dir, &[s(&config), "--output", s(&dir.join("run"))]);
    failed_naming(&out, 2, &["mean.binaryproto", "a FIFO"]);
}
