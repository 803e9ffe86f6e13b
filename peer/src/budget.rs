//! Budgets on what the other end may send unasked: a token bucket plus
//! absolute count and byte budgets on its notifications, requests and
//! empty lines, per connection (per turn on the host).

use std::time::Instant;

use crate::config::PeerConfig;

/// A token bucket plus absolute count and byte budgets on the plugin's
/// notifications, requests and empty lines.
pub(crate) struct Budget {
    tokens: f64,
    rate: f64,
    burst: f64,
    last: Instant,
    count: u64,
    bytes: u64,
}

impl Budget {
    pub(crate) fn new(c: &PeerConfig) -> Self {
        let (rate, burst) = c.notification_rate;
        Self {
            tokens: f64::from(burst),
            rate: f64::from(rate),
            burst: f64::from(burst),
            last: Instant::now(),
            count: 0,
            bytes: 0,
        }
    }
    pub(crate) fn take(&mut self, len: usize, c: &PeerConfig) -> Result<(), String> {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
        self.last = now;
        self.count += 1;
        self.bytes += len as u64;
        if self.count > c.notification_budget {
            return Err(format!(
                "more than {} notifications and requests in one turn",
                c.notification_budget
            ));
        }
        if self.bytes > c.notification_bytes_budget {
            return Err(format!(
                "more than {} bytes of notifications and requests in one turn",
                c.notification_bytes_budget
            ));
        }
        if self.tokens < 1.0 {
            return Err(format!(
                "notifications and requests faster than {}/s (burst {})",
                c.notification_rate.0, c.notification_rate.1
            ));
        }
        self.tokens -= 1.0;
        Ok(())
    }
}
