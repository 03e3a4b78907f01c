//! No code: this crate depends on `hetero-cli` with its `bench` feature, so that
//! a workspace build (`cargo test --workspace`, `cargo clippy --workspace`),
//! which unifies features over every member, builds `hetero bench`, its peers
//! and their tests, while `cargo run --release -p hetero-cli -- demo` (hetero-cli
//! alone) builds none of them.
