//! RFC 3339 text by hand, both ways: the check of a timestamp read from
//! a peer ([`surely_valid`]) and the text of [`crate::Timestamp::now`].
//!
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

/// Whether `text` is an RFC 3339 date-time that `time`'s parser takes,
/// decided without it for the shape every writer uses:
/// `YYYY-MM-DD`, any one byte (`T`, `t`, a space: `time` takes any),
/// `HH:MM:SS`, an optional fraction of any number of digits, then
/// `Z`/`z` or `±HH:MM`. `false` means "not decided here" (a leap
/// second, the years 0 and 9999 where an offset can
/// leave `time`'s range, anything malformed): the caller then asks `time`,
/// so a text is accepted or refused exactly as `time` does. A tool call's
/// `requestedAt` is read on every call, and `time`'s general parser costs
/// more than the rest of the call's params together.
pub(crate) fn surely_valid(text: &[u8]) -> bool {
    plain_shape(text).is_some()
}

fn plain_shape(s: &[u8]) -> Option<()> {
    let (head, rest) = s.split_first_chunk::<19>()?;
    // Fixed positions in a fixed-size array: no bounds checks, no loop.
    let digit = |i: usize| u32::from(head[i].wrapping_sub(b'0'));
    const DIGITS: [usize; 14] = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18];
    // The one between date and time is any byte, as in `time` (a byte
    // that starts a longer character leaves no digit after it).
    let shape = DIGITS.iter().all(|&i| digit(i) <= 9)
        && head[4] == b'-'
        && head[7] == b'-'
        && head[13] == b':'
        && head[16] == b':';
    if !shape {
        return None;
    }
    let two = |i: usize| digit(i) * 10 + digit(i + 1);
    let year = two(0) * 100 + two(2);
    let (month, day) = (two(5), two(8));
    let in_range = (1..=9998).contains(&year)
        && (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && two(11) <= 23
        && two(14) <= 59
        && two(17) <= 59;
    if !in_range {
        return None;
    }
    let mut rest = rest;
    if let [b'.', fraction @ ..] = rest {
        let n = fraction.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        rest = &fraction[n..];
    }
    match rest {
        [b'Z' | b'z'] => Some(()),
        [b'+' | b'-', h0, h1, b':', m0, m1] => {
            let [h0, h1, m0, m1] = [h0, h1, m0, m1].map(|b| u32::from(b.wrapping_sub(b'0')));
            let ok = h0 <= 9 && h1 <= 9 && m0 <= 9 && m1 <= 9;
            (ok && h0 * 10 + h1 <= 23 && m0 * 10 + m1 <= 59).then_some(())
        }
        _ => None,
    }
}

/// Days in `month` (1..=12) of the proleptic Gregorian `year`.
fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
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

    fn time_takes(text: &str) -> bool {
        OffsetDateTime::parse(text, &Rfc3339).is_ok()
    }

    /// A generated timestamp: mostly well formed, with each field drawn
    /// around its edges, then sometimes damaged.
    fn timestamp(x: &mut u64) -> String {
        let mut next = |n: u64| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            *x % n
        };
        let pick = |r: u64, edges: &[u64], n: u64| {
            if r.is_multiple_of(3) {
                edges[(r / 3) as usize % edges.len()]
            } else {
                r % n
            }
        };
        let year = pick(
            next(1 << 20),
            &[0, 1, 4, 100, 400, 1900, 2000, 2024, 9998, 9999],
            10_000,
        );
        let month = pick(next(1 << 20), &[0, 1, 2, 12, 13, 99], 13);
        let day = pick(next(1 << 20), &[0, 1, 28, 29, 30, 31, 32], 32);
        let hour = pick(next(1 << 20), &[0, 23, 24, 99], 24);
        let minute = pick(next(1 << 20), &[0, 59, 60], 60);
        let second = pick(next(1 << 20), &[0, 59, 60, 61], 60);
        let sep = [b'T', b'T', b'T', b't', b' ', b'x', b'_'][next(7) as usize] as char;
        let fraction = match next(6) {
            0 => String::new(),
            1 => ".".into(),
            2 => ".5".into(),
            3 => format!(".{:03}", next(1000)),
            4 => format!(".{}", "9".repeat(next(40) as usize + 1)),
            _ => format!(".{:09}", next(1_000_000_000)),
        };
        let offset = match next(8) {
            0 => "Z".into(),
            1 => "z".into(),
            2 => String::new(),
            3 => "+00:00".into(),
            4 => "-00:00".into(),
            _ => format!(
                "{}{:02}:{:02}",
                ['+', '-'][next(2) as usize],
                pick(next(1 << 20), &[0, 23, 24, 99], 24),
                pick(next(1 << 20), &[0, 59, 60, 99], 60)
            ),
        };
        let mut text = format!(
            "{year:04}-{month:02}-{day:02}{sep}{hour:02}:{minute:02}:{second:02}{fraction}{offset}"
        )
        .into_bytes();
        // Damage: a byte changed, dropped or added, or the text cut.
        match next(8) {
            0 if !text.is_empty() => {
                let at = next(text.len() as u64) as usize;
                text[at] = b" +-.:09AZaz\xff"[next(12) as usize];
            }
            1 if !text.is_empty() => {
                text.remove(next(text.len() as u64) as usize);
            }
            2 => {
                let at = next(text.len() as u64 + 1) as usize;
                text.insert(at, b"0:.Z+ "[next(6) as usize]);
            }
            3 => text.truncate(next(text.len() as u64 + 1) as usize),
            _ => {}
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    #[test]
    fn what_is_taken_by_hand_time_takes() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let (mut by_hand, mut by_time) = (0, 0);
        for _ in 0..400_000 {
            let text = timestamp(&mut x);
            let hand = surely_valid(text.as_bytes());
            let time = time_takes(&text);
            assert!(!hand || time, "taken by hand, refused by time: {text:?}");
            by_hand += usize::from(hand);
            by_time += usize::from(time);
        }
        // The hand check decides most of what `time` takes (it leaves it
        // leap seconds and the years 0 and 9999).
        assert!(by_hand * 10 > by_time * 7, "{by_hand} of {by_time}");
    }

    #[test]
    fn the_writers_shapes_are_taken_by_hand() {
        for text in [
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00.123Z",
            "2026-01-01T00:00:00.123456+00:00",
            "2024-02-29T23:59:59.999-05:30",
            "2026-12-31t23:59:59z",
            "0001-01-01T00:00:00+23:59",
            "9998-12-31T23:59:59.123456789123-23:59",
        ] {
            assert!(surely_valid(text.as_bytes()), "{text}");
            assert!(time_takes(text), "{text}");
        }
        for text in [
            "2023-02-29T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00+24:00",
            "2026-01-01T00:00:00+01:60",
            "2026-01-01T00:00:00+0100",
            "2026-01-01T00:00:00Z ",
            "2026-1-01T00:00:00Z",
            "",
        ] {
            assert!(!surely_valid(text.as_bytes()), "{text}");
            assert!(!time_takes(text), "{text}");
        }
        // Any separator, as `time` takes.
        for text in ["2026-01-01 00:00:00Z", "2026-01-01_00:00:00Z"] {
            assert!(surely_valid(text.as_bytes()), "{text}");
            assert!(time_takes(text), "{text}");
        }
        // Taken by `time`, left to it.
        for text in ["2016-12-31T23:59:60Z", "0000-01-01T00:00:00Z"] {
            assert!(!surely_valid(text.as_bytes()), "{text}");
            assert!(time_takes(text), "{text}");
        }
    }
}
