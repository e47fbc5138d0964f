//! The tables printed after criterion: medians of this run, then the paired figures.

use crate::support::{human, ratio, show, verdict, Medians, Paired};
use crate::{PairedFigures, CONTENDED, LOOPBACK, UNCONTENDED};

pub(crate) fn summary(m: &Medians, paired: Option<&PairedFigures>) {
    let u = |id| m.get(UNCONTENDED, id);
    let k = |id| m.get(CONTENDED, id);
    let sub = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
    let atomic = u("atomic_charge");
    let semaphore = u("semaphore_acquire_release");
    let slot = u("dashmap_semaphore_slot");
    let timer = sub(u("timeout_armed"), u("yield_once"));
    let path = sub(u("engine_miss"), u("transport_yield"));
    let path_ready = sub(u("engine_miss_ready"), u("transport_ready"));
    let hit = u("engine_hit");
    let get = m.get(LOOPBACK, "reqwest");
    let engine_get = m.get(LOOPBACK, "engine");

    println!();
    println!("## read_path summary (criterion medians of this run)");
    println!();
    println!("| figure | median | ratio |");
    println!("|---|---|---|");
    let row = |name: &str, v: Option<f64>, r: String| println!("| {name} | {} | {r} |", show(v));
    row(
        "floor: `Arc<AtomicU64>` charge",
        atomic,
        "1.00× (reference)".into(),
    );
    row(
        "floor: `Semaphore` acquire/release",
        semaphore,
        format!("{} of atomic", ratio(semaphore, atomic)),
    );
    row(
        "floor: `DashMap` + `Semaphore` slot",
        slot,
        format!("{} of atomic", ratio(slot, atomic)),
    );
    row(
        "floor: `timeout`, ready future",
        u("timeout_ready"),
        String::new(),
    );
    row(
        "floor: `timeout` armed (armed − yield once)",
        timer,
        String::new(),
    );
    row(
        "in-memory transport alone, pends once",
        u("transport_yield"),
        String::new(),
    );
    row(
        "engine read, dedup miss, pends once (total)",
        u("engine_miss"),
        String::new(),
    );
    row(
        "**engine path per read** (miss − transport)",
        path,
        format!(
            "{} of atomic, {} of semaphore",
            ratio(path, atomic),
            ratio(path, semaphore)
        ),
    );
    row(
        "engine path, ready transport (miss − transport)",
        path_ready,
        format!("{} of atomic", ratio(path_ready, atomic)),
    );
    row(
        "engine read, dedup hit",
        hit,
        format!("{} of the miss path", ratio(hit, path)),
    );
    row(
        "begin_request + operation (per inbound request)",
        u("begin_request"),
        String::new(),
    );
    row(
        "2 threads: atomic charge",
        k("atomic_charge"),
        format!("{} of 1 thread", ratio(k("atomic_charge"), atomic)),
    );
    row(
        "2 threads: semaphore",
        k("semaphore_acquire_release"),
        format!(
            "{} of 1 thread",
            ratio(k("semaphore_acquire_release"), semaphore)
        ),
    );
    let two = sub(k("engine_miss_two_requests"), u("transport_yield"));
    let one = sub(k("engine_miss_one_request"), u("transport_yield"));
    row(
        "2 threads: engine path, two requests",
        two,
        format!("{} of 1 thread", ratio(two, path)),
    );
    row(
        "2 threads: engine path, one request",
        one,
        format!("{} of 1 thread", ratio(one, path)),
    );
    row("loopback GET, reqwest", get, "1.00× (reference)".into());
    row(
        "loopback GET through the engine",
        engine_get,
        format!("{} of reqwest", ratio(engine_get, get)),
    );
    println!();
    println!(
        "sum of the floors (atomic + DashMap/Semaphore slot + armed timeout): {}",
        match (atomic, slot, timer) {
            (Some(a), Some(s), Some(t)) => human(a + s + t),
            _ => "n/a".into(),
        }
    );

    let Some(f) = paired else {
        println!("(paired pass not run)");
        return;
    };
    println!();
    println!(
        "## read_path, paired (a and b turn about, medians of {} rounds)",
        f.path.rounds
    );
    println!();
    println!("| a vs b | a | b | a − b | a / b |");
    println!("|---|---|---|---|---|");
    let prow = |name: &str, x: &Paired| {
        println!(
            "| {name} | {} | {} | {} | {:.3}× |",
            human(x.a_ns),
            human(x.b_ns),
            human(x.diff_ns),
            x.ratio
        )
    };
    prow(
        "engine read (miss, pends once) vs the transport alone",
        &f.path,
    );
    prow("`timeout` armed vs yield once", &f.timer);
    prow(
        "engine read: budget and quota in measure mode vs enforce",
        &f.measure,
    );
    if let Some(get) = &f.get {
        prow("loopback GET: through the engine vs plain reqwest", get);
    }
    let fl = &f.floors;
    println!();
    println!(
        "## read_path against its floors (engine, floors, transport turn about, medians of {} rounds)",
        fl.rounds
    );
    println!();
    println!("| engine read | floors' routine | transport alone | engine path (engine − transport) | floors (floors − transport) | path / floors (min–max) |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {:.2}× ({:.2}–{:.2}) |",
        human(fl.engine_ns),
        human(fl.floors_total_ns),
        human(fl.transport_ns),
        human(fl.path_ns),
        human(fl.floors_ns),
        fl.ratio,
        fl.ratio_min,
        fl.ratio_max
    );
    println!(
        "target: engine path ≤ 4× the floors beside it (interim; 3× the stretch): {:.2}× — {}",
        fl.ratio,
        verdict(Some(fl.ratio <= 4.0))
    );
    let path = f.path.diff_ns;
    println!();
    println!(
        "target: engine path per read ≤ 200 ns (paired a − b): {} ({:.2}× the target) — {}",
        human(path),
        path / 200.0,
        verdict(Some(path <= 200.0))
    );
    if let Some(get) = &f.get {
        let share = path / get.b_ns;
        println!(
            "target: ≤ 0.5% of a loopback GET ({} median, plain reqwest): {:.3}% — {}",
            human(get.b_ns),
            share * 100.0,
            verdict(Some(share <= 0.005))
        );
        println!(
            "  (against the issue's ~120 µs loopback GET: {:.3}%; the engine's whole extra per GET here: {} = {:.1}%)",
            path / 120_000.0 * 100.0,
            human(get.diff_ns),
            (get.ratio - 1.0) * 100.0
        );
    }
}
