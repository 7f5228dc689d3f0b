#![no_main]
// See sluice::fuzzing::image.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::image(data));
