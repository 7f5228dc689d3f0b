#![no_main]
// See sluice::fuzzing::resumed_view.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::resumed_view(data));
