//! The `[[layer]]` tables of the small classifiers that most test configs end with, and the
//! tables of a config on the bundled digits before them, written out once so that a fixture
//! spells only what sets it apart; and the corpus of bad configs ([`bad_configs`]). Shared by the integration tests
//! (`common::config_text`) and the crate's unit tests (`crate::config_text`, compiled from this
//! file in test builds only), so it names nothing of either.
//!
//! Every function returns whole tables, each ending in a newline, with a blank line between
//! tables, as a config file lays them out; a test that asserts a position finds it in the text
//! it loaded (never a line number written by hand).

#![allow(dead_code)]

/// The tables a config on the bundled digits starts with: `[cluster]` with the lines `cluster`,
/// `[data]` (the digits, batch 32) and `[solver]` with the lines `solver` (each line ending in a
/// newline), then the blank line before the layers.
pub fn digits_head(cluster: &str, solver: &str) -> String {
    format!(
        "[cluster]\n{cluster}\n[data]\nformat = \"digits\"\nbatch_size = 32\n\n\
         [solver]\n{solver}\n"
    )
}

/// `[[layer]]` `name`: an inner product of `bottom` with `outputs` outputs into the top `name`,
/// then the lines `keys` (each ending in a newline; "" for none).
pub fn inner_product(name: &str, bottom: &str, outputs: usize, keys: &str) -> String {
    format!(
        "[[layer]]\nname = \"{name}\"\ntype = \"inner_product\"\nbottom = [\"{bottom}\"]\n\
         top = [\"{name}\"]\nnum_output = {outputs}\n{keys}"
    )
}

/// `[[layer]]` `name`: a convolution of `bottom` with `outputs` output channels into the top
/// `name`, then the lines `keys` (the kernel, padding, stride, fillers).
pub fn convolution(name: &str, bottom: &str, outputs: usize, keys: &str) -> String {
    format!(
        "[[layer]]\nname = \"{name}\"\ntype = \"convolution\"\nbottom = [\"{bottom}\"]\n\
         top = [\"{name}\"]\nnum_output = {outputs}\n{keys}"
    )
}

/// `[[layer]]` `loss`: the softmax loss of `scores` against `label`.
pub fn softmax_loss(scores: &str) -> String {
    format!(
        "[[layer]]\nname = \"loss\"\ntype = \"softmax_with_loss\"\nbottom = [\"{scores}\", \
         \"label\"]\ntop = [\"loss\"]\n"
    )
}

/// `[[layer]]` `accuracy`: the test-phase accuracy of `scores` against `label`.
pub fn accuracy(scores: &str) -> String {
    format!(
        "[[layer]]\nname = \"accuracy\"\ntype = \"accuracy\"\nbottom = [\"{scores}\", \
         \"label\"]\ntop = [\"accuracy\"]\nphase = \"test\"\n"
    )
}

/// A linear classifier of `bottom`: `ip` (`outputs` outputs, then the lines `ip_keys`) →
/// `loss` ([`softmax_loss`]).
pub fn linear_classifier(bottom: &str, outputs: usize, ip_keys: &str) -> String {
    format!(
        "{}\n{}",
        inner_product("ip", bottom, outputs, ip_keys),
        softmax_loss("ip")
    )
}

/// The MLP on `data`: `ip1` (`hidden` outputs) → `relu1` (in place) → `ip2` (10 outputs, then
/// the lines `ip2_keys`) → `loss` ([`softmax_loss`]).
pub fn mlp(hidden: usize, ip2_keys: &str) -> String {
    let relu =
        "[[layer]]\nname = \"relu1\"\ntype = \"relu\"\nbottom = [\"ip1\"]\ntop = [\"ip1\"]\n";
    format!(
        "{}\n{relu}\n{}\n{}",
        inner_product("ip1", "data", hidden, ""),
        inner_product("ip2", "ip1", 10, ip2_keys),
        softmax_loss("ip2")
    )
}

/// The configs of the bad corpus, `tests/configs/bad/*.toml` (each beside its `.expect` and
/// maybe `.sets` file), sorted by name.
pub fn bad_configs() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/bad");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

/// `file:line:col` (1-based, as the loader reports positions) of the one place `needle` stands
/// in `text`; panics unless it stands there exactly once, so that a test cannot point at the
/// wrong place.
pub fn position(file: &str, text: &str, needle: &str) -> String {
    let mut hits = text.match_indices(needle);
    let (at, _) = hits
        .next()
        .unwrap_or_else(|| panic!("{needle:?} is not in the text"));
    assert!(hits.next().is_none(), "{needle:?} stands more than once");
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |n| n + 1);
    let col = before[line_start..].chars().count() + 1;
    format!("{file}:{line}:{col}")
}
