//! Chains of services (CONTRACT §14, the book's "Chains of services"):
//!
//! - [`reads`]: A → B → gateway → registry over loopback, a fan-out of ×10
//!   (and narrower) at each hop: the registry requests per edge request with
//!   propagation off and on (target: ≤ the edge's budget with it on);
//! - [`header`]: the CPU a hop's header costs, `propagate` against the same
//!   host without it, paired (target: ≤ 1 %).
//!
//! `cargo bench -p fanout-gateway --bench chain`; `CHAIN_ONLY=reads|header`
//! runs one part, `CHAIN_REQUESTS` (10) edge requests per row and side,
//! `CHAIN_ROUNDS` (31) paired rounds, `CHAIN_PAIRS=mem,get,hop` the
//! header's pairs run, `CHAIN_WORKERS=N` a multi-thread runtime of N
//! workers for them (a current-thread one by default),
//! `CHAIN_PEND=yield|wake` a pend before each of their reads (a diagnostic,
//! `header.rs`). Every server is on loopback, started and stopped here;
//! every loop is bounded.

#[path = "../../../examples/chain.rs"]
mod example;

#[path = "../common/mod.rs"]
mod common;
#[path = "../../tests/common/hops.rs"]
mod hops;

mod header;
mod reads;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench -- --list` / `--test`: nothing to list, nothing run.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let only = std::env::var("CHAIN_ONLY").unwrap_or_default();
    println!("machine: {}", common::machine());
    println!();
    if only.is_empty() || only == "reads" {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(reads::run(env("CHAIN_REQUESTS", 10).max(1)));
        println!();
    }
    if only.is_empty() || only == "header" {
        let pairs = std::env::var("CHAIN_PAIRS").unwrap_or_default();
        let workers = env("CHAIN_WORKERS", 0);
        header::run(env("CHAIN_ROUNDS", 31).max(3), 0.01, &pairs, workers);
    }
}
