//! Fuzz target: `p2ptrain::inputs::datum` must return, never panic, on any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = p2ptrain::inputs::datum(data);
});
