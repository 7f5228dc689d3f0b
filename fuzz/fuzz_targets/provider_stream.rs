#![no_main]
// See sluice::fuzzing::provider_stream.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::provider_stream(data));
