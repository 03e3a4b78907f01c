//! hetero memory layers (filled in by the memory work).
