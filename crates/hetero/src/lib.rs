//! hetero
