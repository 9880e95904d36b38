//! Validation errors: their keys, positions and messages; the good and bad config corpora.

use super::load_str;
use super::*;
use crate::config_text::{
    accuracy, bad_configs, convolution, digits_head, linear_classifier, mlp, position,
};
use std::path::Path;
use std::sync::LazyLock;

/// The digits MLP (16 hidden units) and its test accuracy, on the CPU.
static BASE: LazyLock<String> = LazyLock::new(|| {
    let solver = "base_lr = 0.05\nmomentum = 0.9\nmax_iter = 100\n";
    let head = digits_head("backend = \"cpu\"\n", solver);
    format!("{head}{}\n{}", mlp(16, ""), accuracy("ip2"))
});

fn check(text: &str) -> Result<()> {
    load_str("t.toml", text, Path::new("."), &[]).map(|_| ())
}

/// The error of `BASE` with `from` replaced by `to`.
fn err(from: &str, to: &str) -> String {
    edit_err(&BASE, from, to)
}

/// The error of `text` with `from` replaced by `to`.
fn edit_err(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in the config");
    match check(&text.replacen(from, to, 1)) {
        Ok(()) => panic!("no error with {to:?}"),
        Err(e) => {
            assert_eq!(e.exit_code(), 2);
            e.to_string()
        }
    }
}

/// Asserts that `text` with `from` replaced by `to` fails with `t.toml:line:col: want`, where
/// `line:col` is the place of `at` in the edited text.
fn fails_at(text: &str, (from, to): (&str, &str), at: &str, want: &str) {
    let edited = text.replacen(from, to, 1);
    has(
        &edit_err(text, from, to),
        &format!("{}: {want}", position("t.toml", &edited, at)),
    );
}

fn has(e: &str, want: &str) {
    assert!(e.contains(want), "{e:?} lacks {want:?}");
}

#[test]
fn the_base_config_is_valid() {
    check(&BASE).unwrap();
}

#[test]
fn range_errors_name_the_key_and_position() {
    fails_at(
        &BASE,
        ("batch_size = 32", "batch_size = 0"),
        "batch_size",
        "`data.batch_size`: must be at least 1",
    );
    has(
        &err("batch_size = 32", "batch_size = 32\ntest_batch_size = 0"),
        "`data.test_batch_size`: must be at least 1",
    );
    fails_at(
        &BASE,
        ("backend = \"cpu\"", "replicas_per_rank = 0"),
        "replicas_per_rank",
        "`cluster.replicas_per_rank`: must be between 1 and 1024",
    );
    has(
        &err("backend = \"cpu\"", "replicas_per_rank = 1025"),
        "`cluster.replicas_per_rank`",
    );
    fails_at(
        &BASE,
        ("backend = \"cpu\"", "threads_per_replica = 100000"),
        "threads_per_replica",
        "`cluster.threads_per_replica`: 100000 threads × 1 replicas per rank exceeds the limit \
         of 4096",
    );
    fails_at(
        &BASE,
        ("base_lr = 0.05", "base_lr = -0.1"),
        "base_lr",
        "`solver.base_lr`: must be a finite number > 0, got -0.1",
    );
    has(&err("base_lr = 0.05", "base_lr = nan"), "`solver.base_lr`");
    has(&err("base_lr = 0.05", "base_lr = inf"), "`solver.base_lr`");
    has(
        &err("momentum = 0.9", "momentum = 1.0"),
        "`solver.momentum`: must be in [0, 1), got 1",
    );
    has(
        &err("momentum = 0.9", "weight_decay = -1e-4"),
        "`solver.weight_decay`",
    );
    has(
        &err("max_iter = 100", "max_iter = 0"),
        "`solver.max_iter`: must be at least 1",
    );
    has(
        &err("max_iter = 100", "max_iter = 1\niter_size = 0"),
        "`solver.iter_size`",
    );
    has(
        &err("max_iter = 100", "max_iter = 1\naverage_loss = 0"),
        "`solver.average_loss`",
    );
    has(
        &err("max_iter = 100", "max_iter = 1\nclip_gradients = inf"),
        "`solver.clip_gradients`",
    );
    has(
        &err("batch_size = 32", "batch_size = 1\nscale = nan"),
        "`data.scale`",
    );
    has(
        &err("batch_size = 32", "batch_size = 1\nclasses = 1"),
        "`data.classes`: must be at least 2",
    );
    has(
        &err("batch_size = 32", "batch_size = 1\nclasses = 5"),
        "`data.classes`: the digits have labels 0 to 9",
    );
}

#[test]
fn the_reduce_dtype_is_fp32_or_bf16_and_bf16_is_not_for_local_sgd() {
    let with = |v: &str| BASE.replacen("backend = \"cpu\"", v, 1);
    check(&with("reduce_dtype = \"bf16\"")).unwrap();
    check(&with("reduce_dtype = \"fp32\"\nsync = \"local_sgd\"")).unwrap();
    has(
        &err("backend = \"cpu\"", "reduce_dtype = \"fp16\""),
        "`cluster.reduce_dtype`: unknown value \"fp16\"",
    );
    has(
        &err(
            "backend = \"cpu\"",
            "reduce_dtype = \"bf16\"\nsync = \"local_sgd\"",
        ),
        "t.toml:2:1: `cluster.reduce_dtype`: \"bf16\" applies to synchronous training's",
    );
}

#[test]
fn the_copy_engines_carry_the_bf16_wire_of_gpus_only() {
    let with = |v: &str| BASE.replacen("backend = \"cpu\"", v, 1);
    let ce = "reduce_transport = \"copy_engines\"";
    check(&with(&format!(
        "backend = \"cuda\"\nreduce_dtype = \"bf16\"\n{ce}"
    )))
    .unwrap();
    check(&with(&format!(
        "backend = \"auto\"\nreduce_dtype = \"bf16\"\n{ce}"
    )))
    .unwrap();
    check(&with("backend = \"cpu\"\nreduce_transport = \"nccl\"")).unwrap();
    has(
        &err("backend = \"cpu\"", &format!("backend = \"cuda\"\n{ce}")),
        "`cluster.reduce_transport`: \"copy_engines\" carries the bfloat16 gradient wire",
    );
    has(
        &err(
            "backend = \"cpu\"",
            &format!("reduce_dtype = \"bf16\"\n{ce}"),
        ),
        "`cluster.reduce_transport`: \"copy_engines\" moves gradients between GPUs",
    );
    has(
        &err("backend = \"cpu\"", "reduce_transport = \"nvlink\""),
        "`cluster.reduce_transport`: unknown value \"nvlink\"",
    );
}

#[test]
fn lr_policies_need_their_keys() {
    let p = |s: &str| err("max_iter = 100", &format!("max_iter = 100\n{s}"));
    has(
        &p("lr_policy = \"step\"\ngamma = 0.1"),
        "`solver.stepsize`: lr_policy \"step\" needs `stepsize` > 0",
    );
    has(
        &p("lr_policy = \"step\"\nstepsize = 10"),
        "`solver.gamma`: lr_policy \"step\" needs `gamma` > 0",
    );
    has(
        &p("lr_policy = \"multistep\"\ngamma = 0.1"),
        "`solver.stepvalue`",
    );
    fails_at(
        &BASE,
        (
            "max_iter = 100",
            "max_iter = 100\nlr_policy = \"multistep\"\ngamma = 0.1\nstepvalue = [10, 10]",
        ),
        "10]",
        "`solver.stepvalue`: must be strictly increasing",
    );
    has(&p("lr_policy = \"exp\""), "`solver.gamma`");
    has(
        &p("lr_policy = \"inv\"\ngamma = 1e-4"),
        "`solver.power`: lr_policy \"inv\" needs `power` > 0",
    );
    has(&p("lr_policy = \"poly\""), "`solver.power`");
    has(
        &p("lr_policy = \"sigmoid\"\nstepsize = 5"),
        "`solver.gamma`",
    );
    has(
        &p("lr_policy = \"sigmoid\"\ngamma = -0.1"),
        "`solver.stepsize`",
    );
    for ok in [
        "lr_policy = \"step\"\nstepsize = 10\ngamma = 0.1",
        "lr_policy = \"multistep\"\nstepvalue = [10, 20]\ngamma = 0.1",
        "lr_policy = \"inv\"\ngamma = 1e-4\npower = 0.75",
        "lr_policy = \"poly\"\npower = 1.0",
        "lr_policy = \"sigmoid\"\ngamma = -0.1\nstepsize = 50",
    ] {
        check(&BASE.replace("max_iter = 100", &format!("max_iter = 100\n{ok}"))).unwrap();
    }
}

#[test]
fn update_rules_check_their_keys() {
    let p = |s: &str| err("max_iter = 100", &format!("max_iter = 100\n{s}"));
    has(
        &p("type = \"adam\"\nmomentum2 = 1.0"),
        "`solver.momentum2`: must be in [0, 1)",
    );
    has(
        &p("type = \"adam\"\ndelta = 0"),
        "`solver.delta`: must be a finite number > 0",
    );
    has(
        &p("type = \"rmsprop\"\nrms_decay = 1.5"),
        "`solver.rms_decay`",
    );
    has(&p("type = \"adagrad\"\ndelta = -1"), "`solver.delta`");
    check(&BASE.replace("max_iter = 100", "max_iter = 100\ntype = \"adam\"")).unwrap();
}

#[test]
fn data_formats_take_their_own_keys() {
    has(
        &err("batch_size = 32", "batch_size = 32\ntrain_images = \"x\""),
        "`data.train_images`: does not apply to format \"digits\"",
    );
    has(
        &err("batch_size = 32", "batch_size = 32\nshape = [1, 2]"),
        "`data.shape`: does not apply to format \"digits\"",
    );
    let synth = |extra: &str| {
        err(
            "format = \"digits\"",
            &format!("format = \"synthetic\"\n{extra}"),
        )
    };
    has(
        &synth("classes = 10\ntrain_size = 9\ntest_size = 9"),
        "`data.shape`: format \"synthetic\" needs `shape`",
    );
    has(
        &synth("shape = [1, 8, 8]\nclasses = 10\ntrain_size = 9\ntest_size = 0"),
        "`data.test_size`: must be at least 1",
    );
    check(&BASE.replace(
        "format = \"digits\"",
        "format = \"synthetic\"\nshape = [64]",
    ))
    .unwrap();
    check(&BASE.replace(
        "format = \"digits\"",
        "format = \"synthetic\"\nshape = [64]\npixels = \"u8\"",
    ))
    .unwrap();
    has(
        &err("batch_size = 32", "batch_size = 32\npixels = \"u8\""),
        "`data.pixels`: does not apply to format \"digits\"",
    );
    has(
        &synth("shape = [1, 8, 8]\nclasses = 10\ntrain_size = 0\ntest_size = 9"),
        "`data.train_size`: must be at least 1",
    );
    has(
        &synth("shape = [1, 1, 8, 8]\nclasses = 10\ntrain_size = 9\ntest_size = 9"),
        "`data.shape`: must have 1 to 3 dimensions",
    );
    has(
        &synth("shape = [0, 8]\nclasses = 10\ntrain_size = 9\ntest_size = 9"),
        "`data.shape`: dimensions must be at least 1",
    );
    has(
        &synth("shape = [65536, 65536]\nclasses = 10\ntrain_size = 9\ntest_size = 9"),
        "`data.shape`: a record of [65536, 65536] has 2^31",
    );
    let ok = BASE.replace(
        "format = \"digits\"",
        "format = \"synthetic\"\nshape = [64]\nclasses = 10\ntrain_size = 9\ntest_size = 9",
    );
    check(&ok).unwrap();
    let e = err(
        "format = \"digits\"",
        "format = \"synthetic\"\nshape = [64]\nclasses = 20\ntrain_size = 9\ntest_size = 9",
    );
    has(
        &e,
        "`layer[3].bottom`: bottom `ip2` has 10 scores per sample but the data has 20 classes",
    );
}

#[test]
fn memory_limits_are_reported_in_gib() {
    let e = err("batch_size = 32", "batch_size = 300000000");
    has(&e, "`data.batch_size`: a batch of 300000000 records of 1×8×8 would need 71.5 GiB of f32 per replica (limit 64 GiB)");
    let e = err(
        "batch_size = 32",
        "batch_size = 1\ntest_batch_size = 300000000",
    );
    has(&e, "`data.test_batch_size`: a batch of 300000000");
    let e = err("batch_size = 32", &format!("batch_size = {}", u64::MAX / 2));
    has(&e, "overflows");
    let wide = BASE.replace("num_output = 16", "num_output = 1048576");
    fails_at(
        &wide,
        ("num_output = 10\n", "num_output = 65536\n"),
        "num_output = 65536",
        "`layer[2].num_output`: the weights (65536 × 1048576) would need 256.0 GiB of f32 \
         (limit 64 GiB)",
    );
    let big_batch = BASE.replace("batch_size = 32", "batch_size = 100000");
    let e = check(&big_batch.replace("num_output = 16", "num_output = 200000"))
        .unwrap_err()
        .to_string();
    has(
        &e,
        "`layer[0].num_output`: the top `ip1` (N, 200000), batch 100000 would need 74.5 GiB",
    );
    let synth = BASE.replace(
        "format = \"digits\"\nbatch_size = 32",
        "format = \"synthetic\"\nshape = [3, 4096, 4096]\nclasses = 10\ntrain_size = 9\ntest_size = 9\nbatch_size = 512",
    );
    has(
        &check(&synth).unwrap_err().to_string(),
        "`data.batch_size`: a batch of 512 records of 3×4096×4096 would need 96.0 GiB",
    );
}

#[test]
fn layer_types_reject_keys_that_do_not_apply() {
    fails_at(
        &BASE,
        ("num_output = 16", "num_output = 16\nnegative_slope = 0.1"),
        "negative_slope",
        "`layer[0].negative_slope`: `negative_slope` does not apply to a layer of type \
         inner_product",
    );
    has(
        &err("top = [\"ip1\"]\n\n", "top = [\"ip1\"]\nnum_output = 3\n\n"),
        "`layer[1].num_output`: `num_output` does not apply to a layer of type relu",
    );
    has(
        &err(
            "top = [\"accuracy\"]",
            "top = [\"accuracy\"]\nloss_weight = 1.0",
        ),
        "`layer[4].loss_weight`: `loss_weight` does not apply to a layer of type accuracy",
    );
    has(&err("top = [\"ip1\"]\n\n", "top = [\"ip1\"]\nlr_mult = [1.0]\n\n"), "`layer[1].lr_mult`: `lr_mult` does not apply to a layer of type relu (it has no learnable tensors)");
    has(
        &err("num_output = 16", "num_output = 16\nlr_mult = [1, 2, 3]"),
        "`layer[0].lr_mult`: has 3 values but the layer has 2 learnable tensors",
    );
    has(
        &err(
            "num_output = 16",
            "num_output = 16\nbias_term = false\ndecay_mult = [1, 0]",
        ),
        "`layer[0].decay_mult`: has 2 values but the layer has 1 learnable tensor",
    );
    has(
        &err(
            "num_output = 16",
            "num_output = 16\nbias_term = false\nbias_filler = { type = \"constant\" }",
        ),
        "`layer[0].bias_filler`: `bias_filler` does not apply when bias_term = false",
    );
    has(
        &err("num_output = 16", "num_output = 16\nlr_mult = [-1]"),
        "`layer[0].lr_mult[0]`: must be a finite number ≥ 0",
    );
    check(&BASE.replace(
        "num_output = 16",
        "num_output = 16\nlr_mult = [1, 2]\ndecay_mult = [1, 0]",
    ))
    .unwrap();
}

#[test]
fn layer_values_are_checked() {
    fails_at(
        &BASE,
        ("num_output = 16", "num_output = 0"),
        "num_output = 0",
        "`layer[0].num_output`: must be between 1 and 2^28, got 0",
    );
    has(
        &err("num_output = 16", "num_output = 268435457"),
        "`layer[0].num_output`: must be between 1 and 2^28",
    );
    has(
        &err("num_output = 16\n", ""),
        "`layer[0].num_output`: a layer of type inner_product needs `num_output`",
    );
    has(
        &err("phase = \"test\"", "phase = \"test\"\ntop_k = 0"),
        "`layer[4].top_k`: must be at least 1",
    );
    has(
        &err("phase = \"test\"", "phase = \"test\"\ntop_k = 11"),
        "`layer[4].top_k`: top_k 11 exceeds the 10 scores",
    );
    has(
        &err("num_output = 16", "num_output = 16\naxis = 0"),
        "`layer[0].axis`: must be 1, 2 or 3",
    );
    has(
        &err("num_output = 10", "num_output = 10\naxis = 2"),
        "`layer[2].axis`: axis 2 is out of range for bottom `ip1` of shape (N, 16)",
    );
    check(&BASE.replace("num_output = 16", "num_output = 16\naxis = 3")).unwrap();
    has(
        &err(
            "num_output = 16",
            "num_output = 16\nweight_filler = { type = \"uniform\", min = 1, max = -1 }",
        ),
        "`layer[0].weight_filler.max`: a uniform filler needs min < max",
    );
    fails_at(
        &BASE,
        (
            "num_output = 16",
            "num_output = 16\nweight_filler = { type = \"gaussian\", std = 0 }",
        ),
        "std = 0",
        "`layer[0].weight_filler.std`: a gaussian filler needs std > 0",
    );
    has(
        &err(
            "num_output = 16",
            "num_output = 16\nbias_filler = { type = \"constant\", value = nan }",
        ),
        "`layer[0].bias_filler.value`: must be a finite number",
    );
}

#[test]
fn the_graph_is_checked() {
    fails_at(
        &BASE,
        (
            "bottom = [\"ip1\"]\ntop = [\"ip2\"]",
            "bottom = [\"ip0\"]\ntop = [\"ip2\"]",
        ),
        "\"ip0\"",
        "`layer[2].bottom`: bottom `ip0` is produced by no earlier layer",
    );
    has(&err("bottom = [\"data\"]", "bottom = [\"ip2\"]"), "`layer[0].bottom`: bottom `ip2` is produced by no earlier layer: layer `ip2` produces it from this layer's output, a cycle");
    let moved = err(
        "bottom = [\"ip2\", \"label\"]\ntop = [\"loss\"]",
        "bottom = [\"x\", \"label\"]\ntop = [\"loss\"]",
    );
    has(&moved, "bottom `x` is produced by no earlier layer");
    let later = BASE.replace(
        "bottom = [\"ip2\", \"label\"]\ntop = [\"loss\"]",
        "bottom = [\"late\", \"label\"]\ntop = [\"loss\"]",
    )
        + "\n[[layer]]\nname = \"late\"\ntype = \"relu\"\nbottom = [\"ip2\"]\ntop = [\"late\"]\n";
    has(
        &check(&later).unwrap_err().to_string(),
        "only the later layer `late` produces it",
    );
    has(
        &err("name = \"relu1\"", "name = \"ip1\""),
        "`layer[1].name`: layer name `ip1` is already used by layer[0]",
    );
    has(
        &err("name = \"relu1\"", "name = \"\""),
        "`layer[1].name`: must not be empty",
    );
    has(&err("bottom = [\"ip2\", \"label\"]\ntop = [\"loss\"]", "bottom = [\"ip2\"]\ntop = [\"loss\"]"), "`layer[3].bottom`: a layer of type softmax_with_loss takes 2 bottoms (scores, label), got 1");
    has(
        &err("top = [\"ip2\"]", "top = []"),
        "`layer[2].top`: a layer of type inner_product has 1 top, got 0",
    );
    has(
        &err("top = [\"ip2\"]", "top = [\"\"]"),
        "`layer[2].top`: blob names must not be empty",
    );
    has(&err("bottom = [\"ip1\"]\ntop = [\"ip2\"]", "bottom = [\"data\"]\ntop = [\"ip1\"]"), "`layer[2].top`: top `ip1` is already produced by layer `relu1`; a layer may reuse a blob name only in place");
    has(
        &err("top = [\"ip1\"]", "top = [\"label\"]"),
        "top `label` is already produced by the data source",
    );
    has(
        &err("name = \"loss\"", "name = \"loss\"\nphase = \"test\""),
        "`layer`: no loss layer runs in the train phase",
    );
    has(
        &err("name = \"loss\"", "name = \"loss\"\nloss_weight = 0.0"),
        "no loss layer runs in the train phase",
    );
    has(&err("name = \"ip2\"", "name = \"ip2\"\nphase = \"test\""), "bottom `ip2` is produced only in the test phase (by layer `ip2`), but this layer also runs in the train phase");
    check(&BASE.replace("phase = \"test\"", "phase = \"train\"")).unwrap();
    // In place on data is allowed.
    check(&BASE.replace("[[layer]]\nname = \"ip1\"", "[[layer]]\nname = \"scale\"\ntype = \"tanh\"\nbottom = [\"data\"]\ntop = [\"data\"]\n\n[[layer]]\nname = \"ip1\"")).unwrap();
    has(&check("layer = []\n[data]\nformat = \"digits\"\nbatch_size = 1\n[solver]\nbase_lr = 0.1\nmax_iter = 1\n").unwrap_err().to_string(), "`layer`: the net needs at least one layer");
}

#[test]
fn idx_files_are_checked() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let idx = |ti: &str, tl: &str| {
        format!(
            "format = \"idx\"\ntrain_images = \"{}\"\ntrain_labels = \"{}\"\ntest_images = \"{}\"\ntest_labels = \"{}\"",
            root.join(ti).display(),
            root.join(tl).display(),
            root.join("test-images-idx3-ubyte.gz").display(),
            root.join("test-labels-idx1-ubyte.gz").display()
        )
    };
    let good = idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
    check(&BASE.replace("format = \"digits\"", &good)).unwrap();
    fails_at(
        &BASE,
        (
            "format = \"digits\"",
            &idx("nope.gz", "train-labels-idx1-ubyte.gz"),
        ),
        "train_images",
        "`data.train_images`: file not found: ",
    );
    has(
        &err(
            "format = \"digits\"",
            &idx("train-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte.gz"),
        ),
        "`data.train_images`: ",
    );
    has(
        &err(
            "format = \"digits\"",
            &idx("train-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte.gz"),
        ),
        "magic 0x00000801 (an IDX label file), expected IDX u8 images",
    );
    has(
        &err(
            "format = \"digits\"",
            &idx("train-images-idx3-ubyte.gz", "test-labels-idx1-ubyte.gz"),
        ),
        "`data.train_labels`: holds 297 labels but `data.train_images` holds 1500 images",
    );
    has(
        &err(
            "format = \"digits\"",
            &idx("README.md", "train-labels-idx1-ubyte.gz"),
        ),
        "`data.train_images`: ",
    );
    has(
        &err("format = \"digits\"", "format = \"idx\""),
        "`data.train_images`: format \"idx\" needs this file",
    );
    has(
        &err(
            "format = \"digits\"",
            &idx(".", "train-labels-idx1-ubyte.gz"),
        ),
        "not a file: ",
    );
}

#[test]
fn cifar10_files_and_transform_keys_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let record = crate::data::cifar10::RECORD_BYTES;
    let good = dir.path().join("data_batch_1.bin");
    std::fs::write(&good, vec![0u8; 2 * record]).unwrap();
    let short = dir.path().join("short.bin");
    std::fs::write(&short, vec![0u8; 2 * record - 1]).unwrap();
    let cifar = |train: &str, extra: &str| {
        format!(
            "format = \"cifar10\"\ntrain_files = [\"{}\", \"{}\"]\ntest_files = [\"{}\"]\n{extra}",
            good.display(),
            dir.path().join(train).display(),
            good.display()
        )
    };
    let e = |train: &str, extra: &str| err("format = \"digits\"", &cifar(train, extra));
    check(&BASE.replace("format = \"digits\"", &cifar("data_batch_1.bin", ""))).unwrap();
    has(
        &e("gone.bin", ""),
        "`data.train_files[1]`: file not found: ",
    );
    has(&e("gone.bin", ""), "gone.bin");
    has(&e("short.bin", ""), "`data.train_files[1]`: ");
    has(
        &e("short.bin", ""),
        "short.bin: size 6145 is not a positive multiple of the CIFAR-10 record size 3073",
    );
    has(
        &err("format = \"digits\"", "format = \"cifar10\""),
        "`data.train_files`: format \"cifar10\" needs this list of files",
    );
    has(
        &err("batch_size = 32", "batch_size = 32\ntrain_files = []"),
        "`data.train_files`: does not apply to format \"digits\"",
    );
    // Transform keys against the 3×32×32 records.
    let ok = "data_batch_1.bin";
    has(
        &e(ok, "crop_size = 33"),
        "`data.crop_size`: must not exceed the records' height and width (32×32), got 33",
    );
    has(
        &e(ok, "mean_value = [1.0, 2.0]"),
        "`data.mean_value`: 2 values given for records of 3 channels: give 1 or 3",
    );
    has(
        &e(ok, "mean_value = [1.0]\nmean = 3.0"),
        "`data.mean_value`: set `mean`",
    );
    for means in ["mean_value = [1.0]", "mean = 3.0"] {
        has(
            &e(ok, &format!("{means}\nmean_file = \"mean.binaryproto\"")),
            "`data.mean_file`: set one of `mean`, `mean_value` and `mean_file`, not several",
        );
    }
    // The file itself is read when the data are opened (compute-mean writes it).
    check(&BASE.replace(
        "format = \"digits\"",
        &cifar(ok, "mean_file = \"not_yet.binaryproto\""),
    ))
    .unwrap();
    has(
        &e(ok, "crop_size = 8\nshift = 8"),
        "`data.shift`: must be smaller than the crop's height and width (8×8), got 8",
    );
    check(&BASE.replace(
        "format = \"digits\"",
        &cifar(
            ok,
            "crop_size = 28\nmirror = true\nmean_value = [125.3, 123.0, 113.9]\nscale = 0.017",
        ),
    ))
    .unwrap();
    check(&BASE.replace("format = \"digits\"", &cifar(ok, "mean_value = [128]"))).unwrap();
    // The digits are one channel.
    has(
        &err("batch_size = 32", "batch_size = 32\nmean_value = [1, 2, 3]"),
        "give 1 or 1",
    );
}

#[test]
fn the_quickstart_is_valid() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/quickstart.toml"),
    )
    .unwrap();
    check(&text).unwrap();
}

/// Every `tests/configs/bad/<name>.toml` fails with exit code 2 and a message holding each line
/// of `<name>.expect` (the key, the message, and the `name.toml:line:col:` where one applies);
/// `<name>.sets`, where present, holds `--set` options, one a line.
#[test]
fn the_bad_config_corpus_fails_as_expected() {
    let files = bad_configs();
    assert!(files.len() >= 12, "only {} bad configs", files.len());
    for file in files {
        let expect = std::fs::read_to_string(file.with_extension("expect"))
            .unwrap_or_else(|e| panic!("{}: no .expect file: {e}", file.display()));
        let sets: Vec<String> = std::fs::read_to_string(file.with_extension("sets"))
            .map(|t| t.lines().map(str::to_string).collect())
            .unwrap_or_default();
        let e = match super::load(&file, &sets) {
            Ok(_) => panic!("{} loads without error", file.display()),
            Err(e) => e,
        };
        assert_eq!(e.exit_code(), 2, "{}: {e}", file.display());
        let msg = e.to_string();
        let lines: Vec<&str> = expect.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.iter().any(|l| l.contains('`')),
            "{}: the .expect names no key",
            file.display()
        );
        for want in lines {
            assert!(
                msg.contains(want),
                "{}:\n  error: {msg}\n  lacks: {want}",
                file.display()
            );
        }
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if let Error::Config { pos: Some(p), .. } = &e {
            assert!(
                msg.contains(&format!("{name}:{}:{}: ", p.line, p.col)),
                "{msg}"
            );
        }
    }
}

#[test]
fn the_good_configs_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/good");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            super::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 1);
}

/// conv1 (8 3×3, pad 1) → pool1 (2×2 max, stride 2) → a linear classifier, on the digits.
static CNN: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"[data]
format = "digits"
batch_size = 32

[solver]
base_lr = 0.05
max_iter = 10

{}
[[layer]]
name = "pool1"
type = "pooling"
bottom = ["conv1"]
top = ["pool1"]
kernel_size = 2
stride = 2

{}"#,
        convolution("conv1", "data", 8, "kernel_size = 3\npad = 1\n"),
        linear_classifier("pool1", 10, "")
    )
});

/// The error of `CNN` with `from` replaced by `to`.
fn cnn_err(from: &str, to: &str) -> String {
    edit_err(&CNN, from, to)
}

/// `CNN` with the layers in `extra` (TOML) inserted before the inner product, which then
/// reads `bottom`.
fn cnn_with(extra: &str, bottom: &str) -> String {
    CNN.replace(
        "[[layer]]\nname = \"ip\"",
        &format!("{extra}\n\n[[layer]]\nname = \"ip\""),
    )
    .replace(
        "bottom = [\"pool1\"]\ntop = [\"ip\"]",
        &format!("bottom = [\"{bottom}\"]\ntop = [\"ip\"]"),
    )
}

#[test]
fn the_cnn_config_is_valid() {
    check(&CNN).unwrap();
    check(&CNN.replace("kernel_size = 2\nstride = 2", "global_pooling = true")).unwrap();
}

#[test]
fn spatial_keys_are_checked() {
    fails_at(
        &CNN,
        ("kernel_size = 3", "kernel_size = 0"),
        "kernel_size = 0",
        "`layer[0].kernel_size`: must be between 1 and 1048576, got 0",
    );
    fails_at(
        &CNN,
        ("kernel_size = 3\n", ""),
        "[[layer]]\nname = \"conv1\"",
        "`layer[0].kernel_size`: a layer of type convolution needs `kernel_size`",
    );
    has(
        &cnn_err("kernel_size = 2\nstride = 2", "stride = 2"),
        "`layer[1].kernel_size`: a layer of type pooling needs `kernel_size` (or global_pooling = true)",
    );
    fails_at(
        &CNN,
        ("stride = 2", "stride = 0"),
        "stride",
        "`layer[1].stride`: must be between 1",
    );
    fails_at(
        &CNN,
        ("pad = 1", "pad = 1\ndilation = 0"),
        "dilation",
        "`layer[0].dilation`: must be between 1",
    );
    fails_at(
        &CNN,
        ("stride = 2", "stride = 2\npad = 2"),
        "pad = 2",
        "`layer[1].pad`: must be smaller than the kernel [2, 2], got [2, 2]",
    );
    fails_at(
        &CNN,
        ("kernel_size = 3", "kernel_size = [3, 3, 3]"),
        "kernel_size = [",
        "`layer[0].kernel_size`: takes 1 or 2 values (one per spatial axis; 2-D only)",
    );
    fails_at(
        &CNN,
        ("kernel_size = 3", "kernel_size = [3, 0]"),
        "0]",
        "`layer[0].kernel_size`: must be between 1 and 1048576, got 0",
    );
    fails_at(
        &CNN,
        ("kernel_size = 3", "kernel_size = 11"),
        "kernel_size = 11",
        "`layer[0].kernel_size`: the kernel spans 11 pixels, more than the padded input (10)",
    );
    fails_at(
        &CNN,
        ("stride = 2", "stride = 2\nglobal_pooling = true"),
        "kernel_size = 2",
        "`layer[1].kernel_size`: `kernel_size` does not apply with global_pooling = true",
    );
    has(
        &cnn_err("kernel_size = 3", "kernel_size = 3\nnegative_slope = 1.0"),
        "`layer[0].negative_slope`: `negative_slope` does not apply to a layer of type convolution",
    );
    // Pooling needs an image: after the inner product there is none.
    let text = CNN.replace(
        "[[layer]]\nname = \"loss\"",
        "[[layer]]\nname = \"p2\"\ntype = \"pooling\"\nbottom = [\"ip\"]\ntop = [\"p2\"]\nkernel_size = 1\n\n[[layer]]\nname = \"loss\"",
    );
    has(
        &check(&text).unwrap_err().to_string(),
        "`layer[3].bottom`: bottom `ip` of shape (N, 10) is not an image (N, C, H, W)",
    );
}

#[test]
fn convolution_counts_and_groups_are_checked() {
    fails_at(
        &CNN,
        ("num_output = 8", "num_output = 8\ngroup = 3"),
        "group",
        "`layer[0].group`: must be at least 1 and divide num_output 8, got 3",
    );
    has(
        &cnn_err("num_output = 8", "num_output = 8\ngroup = 2"),
        "`layer[0].group`: group 2 does not divide the 1 channels of bottom `data`",
    );
    has(
        &cnn_err("num_output = 8\n", ""),
        "`layer[0].num_output`: a layer of type convolution needs `num_output`",
    );
    has(
        &cnn_err("num_output = 8", "num_output = 8\nlr_mult = [1, 2, 3]"),
        "`layer[0].lr_mult`: has 3 values but the layer has 2 learnable tensors (weight, bias)",
    );
    has(
        &cnn_err(
            "num_output = 8",
            "num_output = 8\nbias_term = false\ndecay_mult = [1, 0]",
        ),
        "`layer[0].decay_mult`: has 2 values but the layer has 1 learnable tensor",
    );
    check(&CNN.replace("num_output = 8", "num_output = 8\nlr_mult = [1, 2]")).unwrap();
}

#[test]
fn convolution_memory_is_reported_in_gib() {
    let big = CNN.replace("batch_size = 32", "batch_size = 100000");
    fails_at(
        &big,
        ("num_output = 8", "num_output = 100000"),
        "num_output = 100000",
        "`layer[0].num_output`: the top `conv1` (N, 100000, 8, 8), batch 100000 would need \
         2384.2 GiB of f32 (limit 64 GiB)",
    );
    let synth = CNN.replace(
        "format = \"digits\"",
        "format = \"synthetic\"\nshape = [64, 1024, 1024]\ntrain_size = 1\ntest_size = 1",
    );
    let e = check(
        &synth
            .replace("batch_size = 32", "batch_size = 1")
            .replace("kernel_size = 3", "kernel_size = 31"),
    )
    .unwrap_err()
    .to_string();
    has(&e, "`layer[0].kernel_size`: the column buffer");
    has(&e, "GiB of f32 (limit 64 GiB)");
}

#[test]
fn other_layer_types_are_checked() {
    let eltwise = "[[layer]]\nname = \"sum\"\ntype = \"eltwise\"\nbottom = [\"pool1\", \"pool1b\"]\ntop = [\"sum\"]";
    let twin = "[[layer]]\nname = \"twin\"\ntype = \"pooling\"\nbottom = [\"conv1\"]\ntop = [\"pool1b\"]\nkernel_size = 2\nstride = 2";
    check(&cnn_with(
        &format!("{twin}\n\n{eltwise}\ncoeff = [1.0, -1.0]"),
        "sum",
    ))
    .unwrap();
    has(
        &check(&cnn_with(
            &format!("{twin}\n\n{eltwise}\ncoeff = [1.0]"),
            "sum",
        ))
        .unwrap_err()
        .to_string(),
        "`layer[3].coeff`: has 1 values but the layer has 2 bottoms",
    );
    has(
        &check(&cnn_with(
            &format!("{twin}\n\n{eltwise}\noperation = \"max\"\ncoeff = [1.0, 1.0]"),
            "sum",
        ))
        .unwrap_err()
        .to_string(),
        "`layer[3].coeff`: `coeff` applies only to operation \"sum\"",
    );
    let one =
        "[[layer]]\nname = \"sum\"\ntype = \"eltwise\"\nbottom = [\"pool1\"]\ntop = [\"sum\"]";
    has(
        &check(&cnn_with(one, "sum")).unwrap_err().to_string(),
        "`layer[2].bottom`: a layer of type eltwise takes 2 or more bottoms, got 1",
    );
    let cat = "[[layer]]\nname = \"cat\"\ntype = \"concat\"\nbottom = [\"pool1\", \"conv1\"]\ntop = [\"cat\"]";
    has(
        &check(&cnn_with(cat, "cat")).unwrap_err().to_string(),
        "`layer[2].bottom`: bottoms [32, 8, 4, 4] and [32, 8, 8, 8] differ on an axis other than 1",
    );
    check(&cnn_with(&format!("{twin}\n\n[[layer]]\nname = \"cat\"\ntype = \"concat\"\nbottom = [\"pool1\", \"pool1b\"]\ntop = [\"cat\"]\naxis = 2"), "cat")).unwrap();
    let scale = "[[layer]]\nname = \"s\"\ntype = \"scale\"\nbottom = [\"pool1\"]\ntop = [\"s\"]";
    check(&cnn_with(
        &format!("{scale}\nbias_term = true\nlr_mult = [1, 2]"),
        "s",
    ))
    .unwrap();
    has(
        &check(&cnn_with(&format!("{scale}\nlr_mult = [1, 2]"), "s"))
            .unwrap_err()
            .to_string(),
        "`layer[2].lr_mult`: has 2 values but the layer has 1 learnable tensor (scale)",
    );
    has(
        &check(&cnn_with(
            &format!("{scale}\nbias_filler = {{ type = \"constant\" }}"),
            "s",
        ))
        .unwrap_err()
        .to_string(),
        "`layer[2].bias_filler`: `bias_filler` does not apply unless bias_term = true",
    );
    has(
        &check(&cnn_with(&format!("{scale}\nnum_axes = 4"), "s"))
            .unwrap_err()
            .to_string(),
        "`layer[2].num_axes`: `num_axes` 4 is out of range",
    );
    let reshape =
        "[[layer]]\nname = \"r\"\ntype = \"reshape\"\nbottom = [\"pool1\"]\ntop = [\"r\"]";
    check(&cnn_with(&format!("{reshape}\nshape = [0, -1, 2]"), "r")).unwrap();
    has(
        &check(&cnn_with(reshape, "r")).unwrap_err().to_string(),
        "`layer[2].shape`: a layer of type reshape needs `shape`",
    );
    has(
        &check(&cnn_with(&format!("{reshape}\nshape = [0, -1, -1]"), "r"))
            .unwrap_err()
            .to_string(),
        "`layer[2].shape`: may infer (-1) one axis only",
    );
    has(
        &check(&cnn_with(&format!("{reshape}\nshape = [0, 7, -1]"), "r"))
            .unwrap_err()
            .to_string(),
        "`layer[2].shape`: cannot infer the −1",
    );
    let power = "[[layer]]\nname = \"p\"\ntype = \"power\"\nbottom = [\"pool1\"]\ntop = [\"p\"]";
    has(
        &check(&cnn_with(&format!("{power}\npower = nan"), "p"))
            .unwrap_err()
            .to_string(),
        "`layer[2].power`: must be a finite number",
    );
    let flat = "[[layer]]\nname = \"f\"\ntype = \"flatten\"\nbottom = [\"pool1\"]\ntop = [\"f\"]";
    check(&cnn_with(flat, "f")).unwrap();
    has(
        &check(&cnn_with(&format!("{flat}\nend_axis = 7"), "f"))
            .unwrap_err()
            .to_string(),
        "`layer[2].end_axis`: axes 1 ..= 7 are out of range",
    );
}

/// The error (exit code 2) of `CNN` with the layer `extra` (TOML) inserted before the inner
/// product, which then reads `bottom`.
fn cnn_with_err(extra: &str, bottom: &str) -> String {
    let e = check(&cnn_with(extra, bottom)).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    e.to_string()
}

#[test]
fn elu_prelu_lrn_and_arg_max_are_checked() {
    let layer = |kind: &str, keys: &str| {
        format!("[[layer]]\nname = \"x\"\ntype = \"{kind}\"\nbottom = [\"pool1\"]\ntop = [\"x\"]\n{keys}")
    };
    check(&cnn_with(&layer("elu", "alpha = 0.5"), "x")).unwrap();
    check(&cnn_with(
        &layer("prelu", "channel_shared = true\nlr_mult = [1]"),
        "x",
    ))
    .unwrap();
    let within = "local_size = 3\nalpha = 1e-4\nbeta = 0.75\nnorm_region = \"within_channel\"";
    check(&cnn_with(&layer("lrn", within), "x")).unwrap();
    has(
        &cnn_with_err(&layer("elu", "alpha = inf"), "x"),
        "`layer[2].alpha`: must be a finite number, got inf",
    );
    has(
        &cnn_with_err(&layer("relu", "alpha = 0.5"), "x"),
        "`layer[2].alpha`: `alpha` does not apply to a layer of type relu",
    );
    has(
        &cnn_with_err(&layer("prelu", "lr_mult = [1, 2]"), "x"),
        "`layer[2].lr_mult`: has 2 values but the layer has 1 learnable tensor (slope)",
    );
    has(
        &cnn_with_err(
            &layer(
                "prelu",
                "filler = { type = \"uniform\", min = 1.0, max = 0.0 }",
            ),
            "x",
        ),
        "`layer[2].filler.max`: a uniform filler needs min < max",
    );
    has(
        &cnn_with_err(&layer("lrn", "local_size = 4"), "x"),
        "`layer[2].local_size`: must be odd",
    );
    has(
        &cnn_with_err(&layer("lrn", "beta = nan"), "x"),
        "`layer[2].beta`: must be a finite number",
    );
    has(
        &cnn_with_err(&layer("lrn", "norm_region = \"sideways\""), "x"),
        "norm_region",
    );
    // After the inner product the bottom is (N, 10): not an image.
    let text = CNN.replace(
        "[[layer]]\nname = \"loss\"",
        "[[layer]]\nname = \"n\"\ntype = \"lrn\"\nbottom = [\"ip\"]\ntop = [\"n\"]\n\n[[layer]]\nname = \"loss\"",
    );
    has(
        &check(&text).unwrap_err().to_string(),
        "`layer[3].bottom`: needs a 4-D (N, C, H, W) bottom, got [32, 10]",
    );
    // pool1 is (N, 8, 4, 4): 128 values per sample, 8 along axis 1.
    let arg_max = |keys: &str| {
        layer("arg_max", keys).replace(
            "bottom = [\"pool1\"]",
            "bottom = [\"pool1\"]\nphase = \"test\"",
        )
    };
    check(&cnn_with(
        &arg_max("top_k = 128\nout_max_val = true"),
        "pool1",
    ))
    .unwrap();
    has(
        &cnn_with_err(&arg_max("top_k = 129"), "pool1"),
        "`layer[2].top_k`: `top_k` 129 exceeds the 128 values searched",
    );
    has(
        &cnn_with_err(&arg_max("axis = 1\ntop_k = 9"), "pool1"),
        "`layer[2].top_k`: `top_k` 9 exceeds the 8 values searched",
    );
    has(
        &cnn_with_err(&arg_max("top_k = 0"), "pool1"),
        "`layer[2].top_k`: must be at least 1",
    );
    has(
        &cnn_with_err(&arg_max("axis = 0"), "pool1"),
        "`layer[2].axis`: must be 1, 2 or 3",
    );
}

#[test]
fn a_euclidean_loss_trains_a_net_and_pairs_its_bottoms() {
    let euclid = CNN
        .replace("num_output = 10", "num_output = 1")
        .replace("type = \"softmax_with_loss\"", "type = \"euclidean_loss\"");
    check(&euclid).unwrap();
    has(
        &cnn_err("type = \"softmax_with_loss\"", "type = \"euclidean_loss\""),
        "`layer[3].bottom`: the prediction [32, 10] and the target [32] must have the same batch and the same number of values per sample",
    );
    let one = euclid.replace("bottom = [\"ip\", \"label\"]", "bottom = [\"ip\"]");
    has(
        &check(&one).unwrap_err().to_string(),
        "`layer[3].bottom`: a layer of type euclidean_loss takes 2 bottoms (prediction, target), got 1",
    );
    has(
        &check(&euclid.replace("top = [\"loss\"]", "top = [\"loss\"]\nloss_weight = 0"))
            .unwrap_err()
            .to_string(),
        "no loss layer runs in the train phase",
    );
}

/// `[data]` reading the bundled Caffe digit PNGs through a list file, with `extra` lines.
fn image_list(extra: &str) -> String {
    let png = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/caffe/png");
    BASE.replacen(
        "format = \"digits\"",
        &format!(
            "format = \"image_list\"\nis_color = false\ntrain_source = \"{png}/train.txt\"\n\
             test_source = \"{png}/test.txt\"\n{extra}"
        ),
        1,
    )
}

fn image_err(extra: &str) -> String {
    check(&image_list(extra)).unwrap_err().to_string()
}

#[test]
fn image_formats_take_their_shape_from_the_first_record() {
    check(&image_list("")).unwrap();
    check(&image_list(
        "new_height = 10\nnew_width = 12\ncrop_size = 9",
    ))
    .unwrap();
    check(&image_list(
        "random_resized_crop = 6\nmirror = true\nresize_shorter = 8",
    ))
    .unwrap();
    let e = image_err("crop_size = 9");
    assert!(e.contains("`data.crop_size`") && e.contains("(8×8)"), "{e}");
    let colour = BASE.replacen(
        "format = \"digits\"",
        &format!(
            "format = \"lmdb\"\ntrain_source = \"{0}/tests/data/caffe/digits_train_lmdb\"\n\
             test_source = \"{0}/tests/data/caffe/digits_test_lmdb\"\nmean_value = [1, 2, 3]",
            env!("CARGO_MANIFEST_DIR")
        ),
        1,
    );
    let e = check(&colour).unwrap_err().to_string();
    assert!(
        e.contains("`data.mean_value`") && e.contains("give 1 or 1"),
        "{e}"
    );
}

#[test]
fn image_format_keys_are_checked_and_refused_elsewhere() {
    for (extra, key, what) in [
        ("new_height = 10", "data.new_width", "together"),
        (
            "random_resized_crop = 6\ncrop_size = 4",
            "data.crop_size",
            "not both",
        ),
        (
            "random_resized_crop = 6\ncenter_crop = 5",
            "data.center_crop",
            "must equal",
        ),
        (
            "random_resized_crop = 6\nresize_shorter = 5",
            "data.resize_shorter",
            "at least",
        ),
        (
            "random_resized_crop = 6\ncrop_area = [0.5, 1.5]",
            "data.crop_area",
            "0 < min",
        ),
        (
            "random_resized_crop = 6\ncrop_aspect = [2.0, 1.0]",
            "data.crop_aspect",
            "min ≤ max",
        ),
        (
            "resize_shorter = 8",
            "data.resize_shorter",
            "with `random_resized_crop` only",
        ),
    ] {
        let e = image_err(extra);
        assert!(
            e.contains(&format!("`{key}`")) && e.contains(what),
            "{extra}: {e}"
        );
    }
    let e = err(
        "format = \"digits\"",
        "format = \"digits\"\ntrain_source = \"a\"",
    );
    assert!(
        e.contains("`data.train_source`") && e.contains("only to \"lmdb\""),
        "{e}"
    );
    let e = err(
        "format = \"digits\"",
        "format = \"digits\"\nrandom_resized_crop = 8",
    );
    assert!(e.contains("`data.random_resized_crop`"), "{e}");
    let e = err("format = \"digits\"", "format = \"lmdb\"");
    assert!(e.contains("`data.train_source`"), "{e}");
}

/// The routing layers' blob counts: Split and Slice 1 bottom and 1+ tops, Silence 1+ bottoms
/// and no top, Input no bottom and 1 or 2 tops; their tops get their own shapes (a slice's
/// pieces differ), and an input layer's top may be named after the input it reads.
#[test]
fn routing_layers_have_their_blob_counts_and_shapes() {
    let relu = "type = \"relu\"\nbottom = [\"ip1\"]\ntop = [\"ip1\"]";
    let e = err(relu, "type = \"split\"\nbottom = [\"ip1\"]\ntop = []");
    has(&e, "`layer[1].top`");
    has(&e, "1 or more tops, got 0");
    let e = err(
        relu,
        "type = \"silence\"\nbottom = [\"ip1\"]\ntop = [\"x\"]",
    );
    has(&e, "has 0 tops, got 1");
    let e = err(
        relu,
        "type = \"slice\"\nbottom = [\"ip1\", \"data\"]\ntop = [\"a\"]",
    );
    has(&e, "`layer[1].bottom`");
    // ip1 (16) cut at 6: pieces of 6 and 10; ip2 reads the 10.
    let sliced = BASE.replacen(
        relu,
        "type = \"slice\"\nbottom = [\"ip1\"]\ntop = [\"six\", \"ten\"]\nslice_point = [6]",
        1,
    );
    let sliced = sliced.replacen(
        "bottom = [\"ip1\"]\ntop = [\"ip2\"]",
        "bottom = [\"ten\"]\ntop = [\"ip2\"]",
        1,
    );
    let (cfg, _) = load_str("t.toml", &sliced, Path::new("."), &[]).unwrap();
    let (net, _) = crate::net::Net::build(&cfg, [1, 8, 8], 2).unwrap();
    let shape = |name: &str| net.blob_shape(net.blob_named(name).unwrap()).to_vec();
    assert_eq!((shape("six"), shape("ten")), (vec![2, 6], vec![2, 10]));
    let input = "[[layer]]\nname = \"in\"\ntype = \"input\"\ntop = [\"data\", \"label\"]\nshape = [1, 1, 8, 8]\n\n[[layer]]\nname = \"ip1\"";
    check(&BASE.replacen("[[layer]]\nname = \"ip1\"", input, 1)).unwrap();
    let e = err(
        "[[layer]]\nname = \"ip1\"",
        "[[layer]]\nname = \"in\"\ntype = \"input\"\nbottom = [\"data\"]\ntop = [\"x\"]\nshape = [1, 1, 8, 8]\n\n[[layer]]\nname = \"ip1\"",
    );
    has(&e, "`layer[0].bottom`");
}

/// A net with an input layer validates without a loss (a deploy net); without one, it does not.
#[test]
fn only_a_deploy_net_may_lack_a_loss() {
    let no_loss = BASE
        .replacen(
            "name = \"loss\"\ntype = \"softmax_with_loss\"",
            "name = \"loss\"\ntype = \"softmax\"",
            1,
        )
        .replacen(
            "bottom = [\"ip2\", \"label\"]\ntop = [\"loss\"]",
            "bottom = [\"ip2\"]\ntop = [\"loss\"]",
            1,
        );
    let e = check(&no_loss).unwrap_err().to_string();
    assert!(e.contains("no loss layer"), "{e}");
    let input = "[[layer]]\nname = \"in\"\ntype = \"input\"\ntop = [\"data\"]\nshape = [1, 1, 8, 8]\n\n[[layer]]\nname = \"ip1\"";
    let deploy = no_loss.replacen("[[layer]]\nname = \"ip1\"", input, 1);
    let (cfg, source) = load_str("t.toml", &deploy, Path::new("."), &[]).unwrap();
    let e = train_loss(&cfg, &source).unwrap_err();
    assert!(
        e.to_string().contains("`layer`") && e.exit_code() == 2,
        "{e}"
    );
}
