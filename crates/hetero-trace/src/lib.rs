//! Per-thread event recorder (filled in by the profiler work).
