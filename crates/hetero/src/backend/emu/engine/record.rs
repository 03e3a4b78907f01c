//! What the emulated device records of each op: its profile record (on the
//! device clock) and its part of the trace hash of a virtual-time run.
use super::{Engine, Running};
use crate::exec::op::{Body, Op};

pub(super) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over whole words (a word at a time, then a rotation so that bits
/// high in one word reach the next): deterministic, a few cycles per word.
pub(super) fn fnv(mut h: u64, words: &[u64]) -> u64 {
    for w in words {
        h ^= w;
        h = h.wrapping_mul(FNV_PRIME).rotate_left(29);
    }
    h
}

pub(super) fn kind_code(body: &Body) -> u64 {
    match body {
        Body::Copy { kind, .. } => 1 + *kind as u64,
        Body::Fill { .. } => 4,
        Body::Kernel { .. } => 5,
        Body::Host(_) => 6,
        Body::Wait { .. } | Body::WaitAll(_) => 7,
        Body::Record { .. } => 8,
        Body::HostWrite { .. } => 9,
        Body::HostRead { .. } => 10,
        Body::Graph(_) => 11,
        Body::CopyBatch(b) => 12 + b.kind as u64,
        Body::Copy2D(c) => 15 + c.kind as u64,
        Body::Async(_) => 18,
    }
}

/// The profile record of a copy merged into `r`'s chain: it ran with it.
pub(super) fn record_merged(r: &Running, op: &Op, value: u64, end: u64) {
    let (engine, index) = match r.engine {
        Engine::Copy(0, i) => (hetero_trace::EngineKind::CopyH2D, i),
        Engine::Copy(_, i) => (hetero_trace::EngineKind::CopyD2H, i),
        _ => (hetero_trace::EngineKind::Host, 0),
    };
    let kind = match &op.body {
        Body::Copy { kind, .. } => kind.trace_kind(),
        _ => hetero_trace::OpKind::H2D,
    };
    hetero_trace::record_op(hetero_trace::OpRecord {
        kind,
        name: op.name(),
        stream: r.stream.id,
        queue: r.stream.queue as u32,
        engine,
        engine_index: index as u32,
        seq: value,
        submit_ns: op.submit_ns,
        start_ns: r.start,
        end_ns: end,
        bytes: op.bytes(),
        dep: None,
        failed: false,
        node: None,
    });
}

pub(super) fn record(r: &Running, end: u64) {
    use hetero_trace::EngineKind as E;
    let (engine, index) = match r.engine {
        Engine::Copy(0, i) => (E::CopyH2D, i),
        Engine::Copy(1, i) => (E::CopyD2H, i),
        Engine::Copy(_, i) => (E::CopyD2D, i),
        Engine::Compute(first, _) => (E::Compute, first),
        Engine::None => (E::Host, 0),
    };
    let (kind, dep) = r.op.trace_kind();
    hetero_trace::record_op(hetero_trace::OpRecord {
        kind,
        name: r.op.name(),
        stream: r.stream.id,
        queue: r.stream.queue as u32,
        engine,
        engine_index: index as u32,
        seq: r.value,
        submit_ns: r.op.submit_ns,
        start_ns: r.start,
        end_ns: end,
        bytes: r.op.bytes(),
        dep,
        failed: r.result.is_err(),
        node: None,
    });
}
