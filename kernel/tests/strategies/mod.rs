//! Generators shared by the audit line tests: strings over the characters
//! that matter to an escaper, and the contract values made of them.

#![allow(dead_code)]

use proptest::prelude::*;
use sharedos_protocol::{Address, Identifier, PathSegment};

/// The characters that matter to an escaper: plain, quote, backslash, the
/// short escapes, other controls, DEL, non-ASCII of every width, U+2028.
pub const ALPHABET: [char; 20] = [
    'a',
    'Z',
    '7',
    ' ',
    '.',
    '"',
    '\\',
    '/',
    '\n',
    '\r',
    '\t',
    '\u{8}',
    '\u{c}',
    '\u{0}',
    '\u{1f}',
    '\u{7f}',
    'é',
    '\u{2028}',
    '😀',
    '\u{10ffff}',
];

pub fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 0..max)
        .prop_map(|chars| chars.into_iter().collect())
}

pub fn identifier() -> impl Strategy<Value = Identifier> {
    text(12).prop_filter_map("a valid identifier", |s| Identifier::new(s).ok())
}

pub fn segment() -> impl Strategy<Value = PathSegment> {
    text(12).prop_filter_map("a valid segment", |s| PathSegment::new(s).ok())
}

pub fn address() -> impl Strategy<Value = Address> {
    prop_oneof![
        identifier().prop_map(|user_id| Address::Human { user_id }),
        identifier().prop_map(|agent_id| Address::Agent { agent_id }),
        identifier().prop_map(|conversation_id| Address::Group { conversation_id }),
        identifier().prop_map(|service_id| Address::Service { service_id }),
    ]
}
