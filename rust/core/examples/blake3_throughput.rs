//! BLAKE3 throughput: the store's digest (`blake3_digest`: one core below 1 MiB, all cores
//! above) against the crate's own one-call `blake3::hash` (one core, its SIMD back-end) on
//! this machine. `cargo run --release -p xla_pcache_core --example blake3_throughput`
//! prints GB/s per size (median of rounds, buffers in cache or memory as sized), then what
//! one Ed25519 verification (`ed25519_dalek::VerifyingKey::verify_strict`, the one a trusting
//! reader makes per entry and process) costs here: with BLAKE3 over the payload, the floor
//! under a first signed hit.

use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rate(len: usize, f: &dyn Fn() -> [u8; 32]) -> f64 {
    let reps = (256 << 20) / len.max(1);
    let reps = reps.clamp(1, 10_000);
    let mut rounds = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(f());
        }
        rounds.push((len * reps) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    median(rounds)
}

fn main() {
    println!("size, ours GB/s, blake3::hash GB/s, Hasher::update_rayon GB/s");
    for len in [100 << 10, 1 << 20, 10 << 20, 100 << 20] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let ours = rate(len, &|| xla_pcache_core::blake3_digest(&data));
        let crate_one = rate(len, &|| *blake3::hash(&data).as_bytes());
        let crate_rayon = rate(len, &|| {
            *blake3::Hasher::new()
                .update_rayon(&data)
                .finalize()
                .as_bytes()
        });
        println!("{len}, {ours:.2}, {crate_one:.2}, {crate_rayon:.2}");
    }
    use ed25519_dalek::{Signer, SigningKey};
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let public = key.verifying_key();
    let message = [1u8; 256];
    let signature = key.sign(&message);
    let mut rounds = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        for _ in 0..200 {
            std::hint::black_box(public.verify_strict(&message, &signature).is_ok());
        }
        rounds.push(t.elapsed().as_secs_f64() / 200.0 * 1e6);
    }
    println!("ed25519 verify_strict, {:.1} us", median(rounds));
}
