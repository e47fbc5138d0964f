//! Identity: who is calling, by token, and from which address.
//!
//! - **Internal callers** present `x-internal-token`. Both the configured
//!   token and the presented value are hashed to fixed-length SHA-256 digests
//!   and compared with `subtle`'s constant-time equality, so neither the
//!   token's bytes nor its length leak through timing. Anything but an exact
//!   match — a wrong, empty or truncated token — is an ordinary caller.
//! - **The client IP** is the TCP peer, unless the peer is a trusted proxy:
//!   then it is the rightmost `X-Forwarded-For` entry that is not itself a
//!   trusted proxy. The leftmost entry is whatever the client wrote, so it is
//!   never believed.
//! - **Entries that are not a bare address.** Walking from the right, the
//!   first untrusted entry decides. `ip:port` and `[v6]:port` (and `[v6]`)
//!   are read as that address: some proxies append the peer's port. Anything
//!   else — garbage, `unknown`, an empty entry, a value that is not ASCII —
//!   is [`ForwardedError`]: the request is refused with 400 `BAD_REQUEST`
//!   before it runs. It is never charged to the proxy's own address, which
//!   would let one client's junk exhaust every client's shared bucket.
//! - **The limiter's key** is the client address masked to a prefix
//!   ([`ClientPrefix`]: `rate_limit.ipv4_prefix` / `ipv6_prefix`, 32 and 64
//!   by default), so rotating addresses inside one IPv6 /64 — what one host
//!   is usually given — is one client. IPv4-mapped IPv6 addresses
//!   (`::ffff:a.b.c.d`) count as IPv4 everywhere here.

use crate::config::cidr::{canonical, Cidr};
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use subtle::ConstantTimeEq;

/// The header internal callers present their token in.
pub const INTERNAL_TOKEN_HEADER: http::HeaderName =
    http::HeaderName::from_static("x-internal-token");

/// The header a trusted proxy names the addresses it forwarded for in.
const FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

/// Who is calling.
///
/// ```
/// use fanout_budget::{Config, Engine, inbound::{Caller, INTERNAL_TOKEN_HEADER}};
///
/// let mut config = Config::default();
/// config.rate_limit.internal_token = "s3cret".into();
/// let engine = Engine::new(config);
/// let mut headers = http::HeaderMap::new();
/// headers.insert(INTERNAL_TOKEN_HEADER, "s3cret".parse().unwrap());
/// assert_eq!(engine.identify(&headers), Caller::Internal);
/// headers.insert(INTERNAL_TOKEN_HEADER, "forged".parse().unwrap());
/// assert_eq!(engine.identify(&headers), Caller::Public);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// Presented the exact internal token: exempt from the per-IP limit,
    /// budget `internal_max_reads`.
    Internal,
    /// Everyone else, including callers with a wrong token.
    Public,
}

/// The configured internal token, kept only as a digest.
#[derive(Clone)]
pub(crate) struct InternalToken {
    digest: Option<[u8; 32]>,
}

/// What [`InternalToken::check`] saw in the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenCheck {
    /// No token header.
    Absent,
    /// The exact token.
    Valid,
    /// A token header that does not match (or there is no internal token).
    Wrong,
}

impl InternalToken {
    /// The token; empty means there are no internal callers.
    pub(crate) fn new(token: &str) -> Self {
        Self {
            digest: (!token.is_empty()).then(|| Sha256::digest(token.as_bytes()).into()),
        }
    }

    /// Compares the request's token header in constant time.
    #[inline]
    pub(crate) fn check(&self, headers: &http::HeaderMap) -> TokenCheck {
        if !has_token_header(headers) {
            return TokenCheck::Absent;
        }
        self.compare(headers)
    }

    /// The token header is there: compare it (out of line, rarely run).
    #[inline(never)]
    fn compare(&self, headers: &http::HeaderMap) -> TokenCheck {
        let Some(presented) = headers.get(&INTERNAL_TOKEN_HEADER) else {
            return TokenCheck::Absent;
        };
        let Some(expected) = &self.digest else {
            return TokenCheck::Wrong;
        };
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        if bool::from(presented.ct_eq(expected)) {
            TokenCheck::Valid
        } else {
            TokenCheck::Wrong
        }
    }

    /// [`Caller::Internal`] only when `presented` is the exact token
    /// (compared in constant time): a token sent in a message rather than
    /// a header (a WebSocket's `connection_init`).
    pub(crate) fn identify_value(&self, presented: &[u8]) -> Caller {
        let Some(expected) = &self.digest else {
            return Caller::Public;
        };
        let presented: [u8; 32] = Sha256::digest(presented).into();
        if bool::from(presented.ct_eq(expected)) {
            Caller::Internal
        } else {
            Caller::Public
        }
    }

    /// [`Caller::Internal`] only for the exact token.
    pub(crate) fn identify(&self, headers: &http::HeaderMap) -> Caller {
        match self.check(headers) {
            TokenCheck::Valid => Caller::Internal,
            TokenCheck::Absent | TokenCheck::Wrong => Caller::Public,
        }
    }
}

/// Up to this many header names are scanned for the token header; more are
/// looked up by hash.
const SCAN_HEADERS: usize = 16;

/// Whether `headers` has the token header. An ordinary request has a handful
/// of header names, mostly standard ones, and comparing a standard name with
/// a custom one is a tag compare: scanning them is cheaper than hashing
/// `x-internal-token` for `HeaderMap::get`.
#[inline]
fn has_token_header(headers: &http::HeaderMap) -> bool {
    if headers.keys_len() > SCAN_HEADERS {
        return headers.contains_key(&INTERNAL_TOKEN_HEADER);
    }
    headers.keys().any(|name| *name == INTERNAL_TOKEN_HEADER)
}

impl std::fmt::Debug for InternalToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.digest.is_some() {
            "InternalToken(<set>)"
        } else {
            "InternalToken(<none>)"
        })
    }
}

/// The networks whose `X-Forwarded-For` is believed.
#[derive(Clone, Debug, Default)]
pub(crate) struct TrustedProxies {
    nets: Vec<Cidr>,
}

impl TrustedProxies {
    /// From CIDR strings; unparsable entries are skipped (config validation
    /// rejects them before this).
    pub(crate) fn new<S: AsRef<str>>(cidrs: &[S]) -> Self {
        Self {
            nets: cidrs
                .iter()
                .filter_map(|c| Cidr::parse(c.as_ref()))
                .collect(),
        }
    }

    /// Whether `ip` is a trusted proxy.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|net| net.contains(ip))
    }

    /// The client address of a request that arrived from `peer` (CONTRACT §7);
    /// an unparsable decisive `X-Forwarded-For` entry is an error (see the
    /// module docs).
    #[inline]
    pub(crate) fn client_ip(
        &self,
        peer: IpAddr,
        headers: &http::HeaderMap,
    ) -> Result<IpAddr, ForwardedError> {
        let peer = canonical(peer);
        if self.nets.is_empty() || !self.contains(peer) {
            return Ok(peer);
        }
        self.forwarded_client(peer, headers)
    }

    /// `peer` is a trusted proxy: the rightmost untrusted forwarded address.
    #[inline(never)]
    fn forwarded_client(
        &self,
        peer: IpAddr,
        headers: &http::HeaderMap,
    ) -> Result<IpAddr, ForwardedError> {
        // Walk the chain from the right (the hop nearest us) and stop at the
        // first address we do not trust: everything left of it is hearsay.
        let mut client = peer;
        for value in headers.get_all(&FORWARDED_FOR).iter().rev() {
            let Ok(value) = value.to_str() else {
                return Err(ForwardedError::new(&String::from_utf8_lossy(
                    value.as_bytes(),
                )));
            };
            for entry in value.rsplit(',') {
                let ip =
                    canonical(parse_forwarded(entry).ok_or_else(|| ForwardedError::new(entry))?);
                if !self.contains(ip) {
                    return Ok(ip);
                }
                client = ip;
            }
        }
        Ok(client)
    }
}

/// One `X-Forwarded-For` entry: `ip`, `ip:port`, `[v6]:port` or `[v6]`.
fn parse_forwarded(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(socket) = entry.parse::<SocketAddr>() {
        return Some(socket.ip());
    }
    let bracketed = entry.strip_prefix('[')?.strip_suffix(']')?;
    bracketed.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// A decisive `X-Forwarded-For` entry that is not an address (answered 400
/// `BAD_REQUEST`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ForwardedError {
    /// The entry, trimmed and cut to [`ForwardedError::SHOWN`] characters.
    pub(crate) entry: String,
}

impl ForwardedError {
    /// Characters of the offending entry kept for the message.
    pub(crate) const SHOWN: usize = 64;

    fn new(entry: &str) -> Self {
        Self {
            entry: entry.trim().chars().take(Self::SHOWN).collect(),
        }
    }
}

impl std::fmt::Display for ForwardedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "X-Forwarded-For entry {:?} from a trusted proxy is not an IP address",
            self.entry
        )
    }
}

impl std::error::Error for ForwardedError {}

/// The per-IP limiter's key: a client address masked to its network prefix
/// (`rate_limit.ipv4_prefix`, `rate_limit.ipv6_prefix`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClientPrefix {
    v4_mask: u32,
    v6_mask: u128,
}

impl ClientPrefix {
    /// Keys IPv4 clients by their first `ipv4_prefix` bits and IPv6 clients
    /// by their first `ipv6_prefix` bits (larger values are clamped to 32 and
    /// 128; config validation rejects them before this).
    pub(crate) fn new(ipv4_prefix: u8, ipv6_prefix: u8) -> Self {
        Self {
            v4_mask: u32::MAX
                .checked_shl(32 - u32::from(ipv4_prefix.min(32)))
                .unwrap_or(0),
            v6_mask: u128::MAX
                .checked_shl(128 - u32::from(ipv6_prefix.min(128)))
                .unwrap_or(0),
        }
    }

    /// The network `ip` belongs to, as an address (host bits zero); an
    /// IPv4-mapped IPv6 address is keyed as the IPv4 address.
    #[inline]
    pub(crate) fn key(&self, ip: IpAddr) -> IpAddr {
        match canonical(ip) {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & self.v4_mask)),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & self.v6_mask)),
        }
    }
}

impl Default for ClientPrefix {
    /// The defaults: /32 for IPv4 (each address), /64 for IPv6.
    fn default() -> Self {
        Self::new(32, 64)
    }
}
