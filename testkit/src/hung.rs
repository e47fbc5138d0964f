//! A collector that takes connections and never answers, on a loopback
//! port, and the sockets this process holds open to it: what an exporter
//! does when its collector hangs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::AsyncReadExt as _;
use tokio::task::JoinSet;

/// What a [`Hung`] collector does with a connection it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hangs {
    /// Keeps the socket and never reads it: a sender's writes stall once the
    /// socket buffers are full.
    Holds,
    /// Reads everything sent, never answers, and lets the socket go when
    /// the sender closes it.
    Reads,
}

/// The collector; stops, and lets its sockets go, when dropped.
pub struct Hung {
    /// `http://127.0.0.1:PORT`: the `otlp_endpoint`.
    pub base: String,
    /// Its port.
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hung {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hung {
    /// Starts one on a free loopback port.
    pub async fn start(hangs: Hangs) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            // Aborted with the task: the held sockets and the readers.
            let mut held = Vec::new();
            let mut readers = JoinSet::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                match hangs {
                    Hangs::Holds => held.push(socket),
                    Hangs::Reads => {
                        readers.spawn(async move {
                            let mut buffer = vec![0; 64 * 1024];
                            while matches!(socket.read(&mut buffer).await, Ok(n) if n > 0) {}
                        });
                    }
                }
            }
        });
        Self {
            base: format!("http://127.0.0.1:{port}"),
            port,
            accepted,
            task,
        }
    }

    /// The connections it took so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// The TCP sockets this process holds open (a file descriptor of its own)
/// to `port` on 127.0.0.1: one a connection, whatever the other side does
/// with it. A socket closed here while the other side holds its end is
/// not counted (the kernel keeps it, orphaned, with no descriptor). Linux
/// only (`/proc/self/fd`, `/proc/net/tcp`).
pub fn sockets_open_to(port: u16) -> usize {
    let inodes: HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_str()?;
            link.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let remote = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .expect("/proc/net/tcp")
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(2) == Some(&remote.as_str())
                && fields
                    .get(9)
                    .and_then(|inode| inode.parse().ok())
                    .is_some_and(|inode: u64| inodes.contains(&inode))
        })
        .count()
}
