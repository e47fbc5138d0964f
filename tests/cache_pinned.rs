//! The engine's answer cache holds what it weighs with the real HTTP
//! transport too. An answer read by `HttpTransport` (reqwest over hyper)
//! has header values that are slices of the connection's read buffer, so a
//! kept entry whose body was copied into an allocation of its own may still
//! hold that whole buffer through its headers: 8 KiB or more per entry of
//! about 1.3 KiB weighed — and as much as hyper's read buffer has grown to
//! (up to ~400 KiB) when the same connection carried a large answer before.
//!
//! A loopback server answers `GET /blob/N` with a 100-byte body and
//! `GET /big` with 512 KiB, on keep-alive connections. Two cases, each in a
//! child process under an address-space limit, the resident memory gained
//! read from the kernel:
//! - `small`: an 8 MiB cache is offered 20,000 small answers (about three
//!   times its size by weight);
//! - `after-big`: 400 small answers, each read in a request of its own
//!   after a large answer that is not kept (about 0.5 MiB weighed in all).
//!
//! `cargo test --test cache_pinned -- --nocapture` prints the figures.
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use fanout_testkit::child;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const BOUND_MIB: u64 = 8;
const BIG: usize = 512 << 10;

/// Answers `/big` with `BIG` bytes, anything else with 100, each
/// connection kept alive.
async fn serve() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read);
                let answer = |size: usize| {
                    let body = "x".repeat(size);
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n{body}")
                };
                let (small, big) = (answer(100), answer(BIG));
                let mut line = String::new();
                let mut asked_big = false;
                loop {
                    line.clear();
                    match lines.read_line(&mut line).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" => {
                            let answer = if asked_big { &big } else { &small };
                            if write.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) if line.starts_with("GET ") => {
                            asked_big = line.starts_with("GET /big");
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

/// In the child: the cache's weight and the resident memory gained.
fn fill(case: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let base = serve().await;
        let mut config = Config::default();
        config.upstream.cache_bytes = BOUND_MIB << 20;
        let engine = Engine::new(config);
        let get = |path: String| Read::get(format!("{base}{path}").parse().unwrap());
        // The connection and the runtime warmed before the baseline.
        let request = engine.begin_request(Caller::Internal);
        let op = request.operation();
        op.upstream().read(get("/big".into())).await.unwrap();
        op.upstream().read(get("/warm".into())).await.unwrap();
        drop(op);
        drop(request);
        let before = child::rss_mib();
        let (answers, after_big) = match case {
            "small" => (20_000, false),
            _ => (400, true),
        };
        // Requests of 100 kept reads (one, after a large answer), each
        // dropped (with what it read) after.
        let per_request = if after_big { 1 } else { 100 };
        for batch in 0..answers / per_request {
            let request = engine.begin_request(Caller::Internal);
            let op = request.operation();
            for i in 0..per_request {
                let id = batch * per_request + i;
                if after_big {
                    let big = get(format!("/big?{id}"));
                    op.upstream().read(big).await.unwrap();
                }
                let blob = get(format!("/blob/{id}")).immutable();
                op.upstream().read(blob).await.unwrap();
            }
        }
        let weight = engine.cache_weight() as f64 / f64::from(1 << 20);
        let gained = child::rss_mib() - before;
        child::report(format!("{weight:.2} {gained:.1}"));
    });
}

#[test]
fn a_cache_of_answers_read_over_http_holds_no_more_than_its_bound() {
    if let Some(case) = child::case() {
        return fill(&case);
    }
    let test = "a_cache_of_answers_read_over_http_holds_no_more_than_its_bound";
    let bound = BOUND_MIB as f64;
    let mut failures = Vec::new();
    for case in ["small", "after-big"] {
        let run = child::run(test, case, 2048, Duration::from_secs(300));
        assert!(
            run.success,
            "the child ended {}:\n{}",
            run.ended, run.output
        );
        let (weight, gained) = run.reports[0].split_once(' ').unwrap();
        let (weight, gained): (f64, f64) = (weight.parse().unwrap(), gained.parse().unwrap());
        println!(
            "{case}: weighs {weight:.2} MiB, resident gained {gained:.1} MiB, bound {bound} MiB"
        );
        assert!(weight <= bound, "weighs {weight} MiB");
        // What the process holds for the cache: within twice the bound
        // (and within twice what the entries weigh, when that is less, but
        // not below 4 MiB: the allocator's own slack after 400 large
        // answers is a MiB or two, while an entry pinning a grown read
        // buffer holds hundreds of KiB each, 400 of them tens of MiB).
        let allowed = 2.0 * bound.min(weight.max(2.0));
        if gained >= allowed {
            failures.push(format!(
                "{case}: {gained:.1} MiB resident for entries weighing {weight:.2} MiB (bound {bound} MiB)"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
