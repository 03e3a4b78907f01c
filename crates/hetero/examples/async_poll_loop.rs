//! ns per poll of an async op at the head of a stream: `cargo run --release
//! --example async_poll_loop -- [polls]`.
use std::task::Poll;
use std::time::Instant;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dev =
        hetero::Device::new(hetero::DeviceConfig::default().compute_units(1)).expect("device");
    let s = dev.create_stream().expect("stream");
    for _ in 0..5 {
        let mut polls = 0u64;
        let t = Instant::now();
        s.enqueue_async("count", &[], move |_: &mut hetero::AsyncContext<'_>| {
            polls += 1;
            if polls < n {
                Poll::Pending
            } else {
                Poll::Ready(Ok(()))
            }
        })
        .expect("enqueue");
        s.synchronize().expect("sync");
        println!("{:.1} ns/poll", t.elapsed().as_nanos() as f64 / n as f64);
    }
    // Chains: K async ops each done at its first poll.
    for _ in 0..3 {
        let k = 100_000;
        let t = Instant::now();
        for _ in 0..k {
            s.enqueue_async("one", &[], |_: &mut hetero::AsyncContext<'_>| {
                Poll::Ready(Ok(()))
            })
            .expect("enqueue");
        }
        s.synchronize().expect("sync");
        println!(
            "{:.1} ns/op of ready async ops",
            t.elapsed().as_nanos() as f64 / k as f64
        );
    }
}
