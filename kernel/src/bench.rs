//! Benchmark figures (filled below).
