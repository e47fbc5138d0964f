//! The gateway binary on a loopback port, and clients bound to other
//! loopback addresses (`127.0.0.0/8` is all on `lo` on Linux), so one test
//! can be many clients.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use tokio::net::{TcpSocket, TcpStream};

/// The `host:port` a gateway binary just started says it listens on (its
/// first line of output, `… http://HOST:PORT/graphql`).
pub fn listening_address(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string()
}

/// The gateway binary (on its embedded demo registry), killed on drop.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    _config: TempFile,
}

impl Gateway {
    /// Starts the binary with `config` (TOML) on `127.0.0.1:0`, logging as
    /// deployed (info and above), and waits for its address.
    pub fn start(config: &str) -> Self {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let n = STARTED.fetch_add(1, SeqCst);
        let path =
            std::env::temp_dir().join(format!("fanout-loopback-{}-{n}.toml", std::process::id()));
        std::fs::write(&path, config).unwrap();
        let config = TempFile(path);
        let mut child = Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(&config.0)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = listening_address(&mut child).parse().unwrap();
        Self {
            child,
            addr,
            _config: config,
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file removed on drop.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A connection to `addr` from the loopback address `from`.
pub async fn connect_from(addr: SocketAddr, from: Ipv4Addr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(addr).await
}
