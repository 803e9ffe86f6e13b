//! A record id's text is written by hand, eight hex digits at a time;
//! these prove it is the `uuid` crate's hyphenated lowercase text for the
//! same value: generated values, every nibble value in every position,
//! and the values at the edges.

use proptest::prelude::*;
use sharedos_kernel::RecordId;

fn assert_same(value: u128) {
    let ours = RecordId::from_u128(value);
    let theirs = uuid::Uuid::from_u128(value).hyphenated().to_string();
    assert_eq!(ours.as_str(), theirs, "for {value:#034x}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn a_generated_value_is_written_as_the_uuid_crate_writes_it(value in any::<u128>()) {
        assert_same(value);
    }
}

/// Each of the sixteen nibble values alone in each of the 32 positions,
/// over a background of zeros and of all ones: a digit in the wrong
/// place, a wrong letter or a carry into the next digit shows.
#[test]
fn every_nibble_in_every_position_is_written_as_the_uuid_crate_writes_it() {
    for position in 0..32 {
        for nibble in 0..16u128 {
            let shift = 4 * position;
            assert_same(nibble << shift);
            assert_same(!(0xF << shift) | (nibble << shift));
        }
    }
}

#[test]
fn edge_values_are_written_as_the_uuid_crate_writes_them() {
    for value in [
        0,
        1,
        u128::MAX,
        u128::MAX >> 1,
        1 << 127,
        u128::from(u64::MAX),
        u128::from(u64::MAX) << 64,
        0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        0x9999_9999_aaaa_aaaa_9a9a_9a9a_a9a9_a9a9,
    ] {
        assert_same(value);
    }
}

/// A fresh id is a v4 UUID in that text.
#[test]
fn a_fresh_id_is_a_version_4_uuid() {
    for _ in 0..100 {
        let id = RecordId::new();
        let parsed = uuid::Uuid::parse_str(id.as_str()).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(parsed.hyphenated().to_string(), id.as_str());
    }
}
