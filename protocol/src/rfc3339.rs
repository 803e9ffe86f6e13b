//! The text of [`crate::Timestamp::now`]: an instant after the Unix epoch,
//! to the millisecond, in UTC, written by hand exactly as `time`'s RFC 3339
//! formatting writes it (`2026-09-18T10:00:00.12Z`: the fraction without
//! its trailing zeros, none for a whole second). Every tool call takes the
//! time several times, and a formatting through `time`'s format
//! description costs more than the call's own bookkeeping.

/// The longest text: `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub(crate) const MAX_LEN: usize = 24;

/// The text for `millis` milliseconds after the epoch, in `out`, and its
/// length; `None` past the year 9999, which RFC 3339 cannot write (`time`
/// refuses it too).
pub(crate) fn utc_millis(millis: u64, out: &mut [u8; MAX_LEN]) -> Option<usize> {
    let secs = millis / 1000;
    let (year, month, day) = civil_date(secs / 86_400);
    if year > 9999 {
        return None;
    }
    let of_day = secs % 86_400;
    put_digits(&mut out[0..4], year);
    out[4] = b'-';
    put_digits(&mut out[5..7], month);
    out[7] = b'-';
    put_digits(&mut out[8..10], day);
    out[10] = b'T';
    put_digits(&mut out[11..13], of_day / 3600);
    out[13] = b':';
    put_digits(&mut out[14..16], of_day / 60 % 60);
    out[16] = b':';
    put_digits(&mut out[17..19], of_day % 60);
    let mut len = 19;
    let ms = millis % 1000;
    if ms != 0 {
        // The fraction's digits, without the zeros `time` leaves off.
        let (digits, width) = match (ms % 10, ms % 100) {
            (0, 0) => (ms / 100, 1),
            (0, _) => (ms / 10, 2),
            _ => (ms, 3),
        };
        out[len] = b'.';
        put_digits(&mut out[len + 1..len + 1 + width], digits);
        len += 1 + width;
    }
    out[len] = b'Z';
    Some(len + 1)
}

/// `n` in decimal, zero-padded to fill `out`.
fn put_digits(out: &mut [u8], mut n: u64) {
    for b in out.iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian (year, month, day) of `days` after 1970-01-01
/// (H. Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    use super::*;

    /// `time`'s text for the same instant, as `Timestamp` wrote it before.
    fn through_time(millis: u64) -> Option<String> {
        let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).ok()?;
        at.format(&Rfc3339).ok()
    }

    fn ours(millis: u64) -> Option<String> {
        let mut out = [0u8; MAX_LEN];
        let len = utc_millis(millis, &mut out)?;
        Some(String::from_utf8(out[..len].to_vec()).unwrap())
    }

    #[test]
    fn the_text_is_times_for_generated_instants() {
        // Every leap-year rule, month ends, each fraction shape, the epoch
        // and the last writable millisecond.
        let last = 253_402_300_799_999u64; // 9999-12-31T23:59:59.999Z
        let mut fixed = vec![0, 1, 10, 100, 120, 999, 1000, 86_399_999, 86_400_000];
        for day in [
            59, 60, 365, 789, 10_956, 11_016, 11_017, 47_540, 47_541, 2_932_896,
        ] {
            for ms in [0, 7, 70, 700, 86_399_999] {
                fixed.push(day * 86_400_000 + ms);
            }
        }
        fixed.push(last);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let generated = (0..200_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (last + 1)
        });
        for millis in fixed.into_iter().chain(generated) {
            assert_eq!(ours(millis), through_time(millis), "at {millis} ms");
        }
        assert_eq!(ours(last).as_deref(), Some("9999-12-31T23:59:59.999Z"));
    }

    #[test]
    fn past_the_year_9999_there_is_no_text() {
        assert_eq!(ours(253_402_300_800_000), None);
        assert_eq!(through_time(253_402_300_800_000), None);
        assert_eq!(ours(u64::MAX), None);
    }
}
