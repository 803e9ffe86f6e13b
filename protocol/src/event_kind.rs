//! The kinds of event a host writes into a turn's log
//! ([`crate::ExecutionEvent::kind`]), one enum so a producer names a kind
//! the compiler knows and a reader matches on the same names. The wire
//! carries the dotted strings ([`EventKind::as_str`]); an event read back
//! keeps its `kind` as text, so a log of an older or newer host still
//! reads, and [`EventKind::from_name`] classifies it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::primitives::{ShortName, Text};

macro_rules! event_kinds {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, )*) => {
        /// What an execution event records.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EventKind {
            $( $(#[$doc])* $variant, )*
        }

        impl EventKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$variant,)*];

            /// The name the wire carries.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( EventKind::$variant => $name, )*
                }
            }

            /// The kind named `name`, if it is one.
            pub fn from_name(name: &str) -> Option<EventKind> {
                match name {
                    $( $name => Some(EventKind::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

event_kinds! {
    /// The turn started: its agent, visible tools and runtime.
    TurnStarted = "turn.started",
    /// Terminal: the plugin's outcome was a success.
    TurnCompleted = "turn.completed",
    /// Terminal: the turn failed (`source`: runtime or envelope).
    TurnFailed = "turn.failed",
    /// Terminal: the turn was stopped (deadline, caller, drain).
    TurnCancelled = "turn.cancelled",
    /// Terminal: the kernel escalated the turn to a reviewer.
    TurnEscalated = "turn.escalated",
    /// Terminal: the turn was refused before or while it ran.
    TurnDenied = "turn.denied",
    /// A tool call reached the envelope.
    ToolRequested = "tool.requested",
    /// A tool call's outcome.
    ToolCompleted = "tool.completed",
    /// An event the plugin emitted (`host/emit`).
    RuntimeEvent = "runtime.event",
    /// A model call through the egress gateway.
    EgressRequest = "egress.request",
    /// A connection through the egress gateway.
    EgressConnection = "egress.connection",
    /// A budget of the egress gateway ran out.
    EgressBudgetExceeded = "egress.budget_exceeded",
    /// A model route keeps failing.
    EgressModelFailing = "egress.model_failing",
}

impl EventKind {
    /// A turn's last event: the envelope writes one, and nothing after it.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            EventKind::TurnCompleted
                | EventKind::TurnFailed
                | EventKind::TurnCancelled
                | EventKind::TurnEscalated
                | EventKind::TurnDenied
        )
    }

    /// The terminal kinds.
    pub const TERMINAL: &'static [EventKind] = &[
        EventKind::TurnCompleted,
        EventKind::TurnFailed,
        EventKind::TurnCancelled,
        EventKind::TurnEscalated,
        EventKind::TurnDenied,
    ];

    /// The kind as an event's `type`.
    pub fn short_name(self) -> ShortName {
        // Every name above is 1 to 128 characters (tested).
        ShortName::new(self.as_str()).unwrap_or_else(|_| unreachable!())
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        EventKind::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown event kind {name:?}")))
    }
}

impl<const MIN: usize, const MAX: usize> PartialEq<EventKind> for Text<MIN, MAX> {
    fn eq(&self, kind: &EventKind) -> bool {
        self.as_str() == kind.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::EventKind;

    /// Every kind's wire name, so a rename shows here and in review.
    #[test]
    fn every_kind_has_its_wire_name() {
        let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "turn.started",
                "turn.completed",
                "turn.failed",
                "turn.cancelled",
                "turn.escalated",
                "turn.denied",
                "tool.requested",
                "tool.completed",
                "runtime.event",
                "egress.request",
                "egress.connection",
                "egress.budget_exceeded",
                "egress.model_failing",
            ]
        );
        for &kind in EventKind::ALL {
            assert_eq!(EventKind::from_name(kind.as_str()), Some(kind));
            assert_eq!(kind.short_name(), kind);
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{kind}\""));
            assert_eq!(serde_json::from_str::<EventKind>(&json).unwrap(), kind);
            assert_eq!(
                kind.is_terminal(),
                EventKind::TERMINAL.contains(&kind),
                "{kind}"
            );
        }
        assert!(EventKind::from_name("turn.unknown").is_none());
        assert!(serde_json::from_str::<EventKind>("\"turn.unknown\"").is_err());
    }
}
