#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sharedos_fuzz::frame_lines(data));
