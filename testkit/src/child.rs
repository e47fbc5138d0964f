//! A test's body in a child process under an address-space limit, and the
//! memory it reaches: a shape that would exhaust memory ends only its child,
//! and its peak resident memory is read from the kernel, not estimated.
//!
//! The parent test runs its own binary again (`--exact <test>`) with
//! [`CASE_VAR`] set; the same test function, finding [`case`] set, runs the
//! case and reports with [`report`]. The parent reads the report from the
//! child's output and how the child ended.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable naming the case a child runs.
pub const CASE_VAR: &str = "FANOUT_CHILD_CASE";

/// In a child: the case to run; `None` in the parent.
pub fn case() -> Option<String> {
    std::env::var(CASE_VAR).ok()
}

/// How a child ended.
#[derive(Debug)]
pub struct ChildRun {
    /// The values it reported with [`report`], in order.
    pub reports: Vec<String>,
    /// Everything it printed (for failure messages).
    pub output: String,
    /// Whether it exited 0 (no abort, no signal, no panic).
    pub success: bool,
    /// How it ended, for humans.
    pub ended: String,
}

/// Runs `test` (this binary's test of that exact name) as case `case` in a
/// child limited to `address_space_mib` of address space, killed after
/// `limit`.
pub fn run(test: &str, case: &str, address_space_mib: u64, limit: Duration) -> ChildRun {
    run_with(test, case, address_space_mib, limit, &[])
}

/// [`run`], with `env` set in the child too.
pub fn run_with(
    test: &str,
    case: &str,
    address_space_mib: u64,
    limit: Duration,
    env: &[(&str, &str)],
) -> ChildRun {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {}; exec \"$0\" \"$@\"",
            address_space_mib * 1024
        ))
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CASE_VAR, case)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut output = String::new();
    use std::io::Read;
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut output);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut output);
    }
    let reports = output
        .lines()
        .filter_map(|l| l.find("REPORT ").map(|at| l[at + 7..].to_string()))
        .collect();
    let ended = match status {
        None => format!("killed after {} s", limit.as_secs()),
        Some(s) => {
            use std::os::unix::process::ExitStatusExt;
            match s.signal() {
                Some(sig) => format!("signal {sig}"),
                None => format!("exit {}", s.code().unwrap_or(-1)),
            }
        }
    };
    ChildRun {
        reports,
        success: status.is_some_and(|s| s.success()),
        output,
        ended,
    }
}

/// In a child: reports `value` to the parent.
pub fn report(value: impl std::fmt::Display) {
    println!("REPORT {value}");
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// This process's resident memory now, in MiB.
pub fn rss_mib() -> f64 {
    status_kib("VmRSS:") as f64 / 1024.0
}

/// This process's peak resident memory since [`reset_peak`] (or its start),
/// in MiB.
pub fn peak_mib() -> f64 {
    status_kib("VmHWM:") as f64 / 1024.0
}

/// Resets the peak that [`peak_mib`] reads to the memory resident now
/// (Linux: `5` written to `/proc/self/clear_refs`).
pub fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
}

/// Gives the allocator's free pages back, so that resident memory read next
/// is what the process holds, not what glibc kept of what was freed (it
/// varied by 20 MiB from run to run).
#[allow(unsafe_code)]
pub fn trim_heap() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's `malloc_trim` takes no pointer and only releases
    // free memory; the tests run on Linux with glibc.
    unsafe {
        malloc_trim(0);
    }
}
