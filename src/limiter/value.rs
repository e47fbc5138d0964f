//! The `RateLimit` field's value, written without `format!`.

/// A `RateLimit` value, `"per-ip";r=<remaining>;t=<seconds>`, written into a
/// buffer on the stack (no `format!`, no `String`).
pub(super) struct RateLimitValue {
    buf: [u8; Self::CAPACITY],
    len: usize,
}

impl RateLimitValue {
    const PREFIX: &'static [u8] = b"\"per-ip\";r=";
    /// The prefix, `u32::MAX`, `;t=` and `u64::MAX`.
    const CAPACITY: usize = Self::PREFIX.len() + 10 + 3 + 20;

    pub(super) fn new(remaining: u32, reset_secs: u64) -> Self {
        let mut value = Self {
            buf: [0; Self::CAPACITY],
            len: 0,
        };
        value.push(Self::PREFIX);
        value.push_decimal(u64::from(remaining));
        value.push(b";t=");
        value.push_decimal(reset_secs);
        value
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn push_decimal(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[start..]);
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::RateLimitValue;

    #[test]
    fn ratelimit_value_is_what_format_wrote() {
        for (remaining, reset) in [
            (0, 0),
            (1, 9),
            (10, 10),
            (299, 60),
            (u32::MAX, u64::MAX),
            (1_000_000, 12_345_678_901),
        ] {
            let value = RateLimitValue::new(remaining, reset);
            assert_eq!(
                std::str::from_utf8(value.as_bytes()).unwrap(),
                format!("\"per-ip\";r={remaining};t={reset}")
            );
        }
    }
}
