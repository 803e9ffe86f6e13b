//! The protocol's methods, declared once with their types.
//!
//! Each method is a zero-sized type implementing [`Method`] (its name, its
//! direction, its params) and, when it is a request, [`Request`] (its
//! result). Everything that lists methods derives from these declarations:
//! the name constants in [`crate::methods`], the schema bundle's `methods`
//! index ([`TABLE`]), and the peers' dispatch, which parses a message's
//! params as `M::Params` and answers a request with `M::Result`. The
//! [`methods!`] list below declares every method once; it generates the
//! marker types, [`TABLE`] and, per side, the enums of what that side
//! receives ([`to_host`], [`to_plugin`]), on which the dispatchers match
//! exhaustively. A new method is one line in that list plus its handler on
//! the side that receives it: the compiler points at the dispatcher.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    AnnotateParams, EmitParams, InitializeParams, InitializeResult, InvokeToolParams,
    RuntimeTurnOutcome, ToolResult, TurnAbortParams, TurnDrainingParams, TurnRunParams,
};

/// Who sends a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The host sends it; the plugin handles it.
    HostToPlugin,
    /// The plugin sends it; the host handles it.
    PluginToHost,
}

impl Direction {
    /// The name the schema bundle uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            Direction::HostToPlugin => "host_to_plugin",
            Direction::PluginToHost => "plugin_to_host",
        }
    }
}

/// One method of the protocol.
pub trait Method {
    /// Its wire name.
    const NAME: &'static str;
    /// Who sends it.
    const DIRECTION: Direction;
    /// Its params.
    type Params: Serialize + DeserializeOwned + JsonSchema;
}

/// A method that is answered (a JSON-RPC request, with an id).
pub trait Request: Method {
    /// Its result.
    type Result: Serialize + DeserializeOwned + JsonSchema;
}

/// A method that is not answered (a JSON-RPC notification, no id).
pub trait Notification: Method {}

/// A set of methods one side receives, as an enum: dispatch matches on it
/// exhaustively, so a new method makes the compiler point at every
/// dispatcher that must handle it.
pub trait Received: Copy + Eq + std::fmt::Debug + Send + Sync + 'static {
    /// The method of this set named `name`, if any.
    fn from_name(name: &str) -> Option<Self>;
    /// Its wire name.
    fn name(self) -> &'static str;
}

/// One side of a connection: the requests and notifications it receives.
pub trait Side: Send + Sync + 'static {
    /// Who sends what this side receives.
    const SENDER: Direction;
    /// The requests it serves.
    type Request: Received;
    /// The notifications it takes.
    type Notification: Received;
}

/// One side's enum of the methods of one kind it receives.
macro_rules! received_enum {
    ($(#[$doc:meta])* $enum:ident { $( $variant:ident = $name:literal, )* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $enum {
            $( #[doc = concat!("`", $name, "`")] $variant, )*
        }

        impl Received for $enum {
            fn from_name(name: &str) -> Option<Self> {
                match name {
                    $( $name => Some(Self::$variant), )*
                    _ => None,
                }
            }

            fn name(self) -> &'static str {
                match self {
                    $( Self::$variant => $name, )*
                }
            }
        }
    };
}

/// The method table: each method's marker type (with its [`Method`] and
/// [`Request`] or [`Notification`] impl), the enums of what each side
/// receives ([`to_plugin`], [`to_host`]) and [`TABLE`], all from one list.
macro_rules! methods {
    ($(
        $side:ident ($dir:ident, $marker:ident) {
            requests { $( $(#[$rdoc:meta])* $req:ident = $rname:literal, $rparams:ty => $result:ty; )* }
            notifications { $( $(#[$ndoc:meta])* $note:ident = $nname:literal, $nparams:ty; )* }
        }
    )*) => {
        $(
            $(
                $(#[$rdoc])*
                #[derive(Debug, Clone, Copy)]
                pub struct $req;
                impl Method for $req {
                    const NAME: &'static str = $rname;
                    const DIRECTION: Direction = Direction::$dir;
                    type Params = $rparams;
                }
                impl Request for $req {
                    type Result = $result;
                }
            )*
            $(
                $(#[$ndoc])*
                #[derive(Debug, Clone, Copy)]
                pub struct $note;
                impl Method for $note {
                    const NAME: &'static str = $nname;
                    const DIRECTION: Direction = Direction::$dir;
                    type Params = $nparams;
                }
                impl Notification for $note {}
            )*

            #[doc = concat!("What the receiving side of `", stringify!($dir), "` takes.")]
            pub mod $side {
                use super::{Direction, Received};

                received_enum!(
                    /// The requests this side serves.
                    Request { $( $req = $rname, )* }
                );
                received_enum!(
                    /// The notifications this side takes.
                    Notification { $( $note = $nname, )* }
                );

                /// This side, as a type.
                #[derive(Debug, Clone, Copy)]
                pub struct $marker;

                impl super::Side for $marker {
                    const SENDER: Direction = Direction::$dir;
                    type Request = Request;
                    type Notification = Notification;
                }
            }
        )*

        /// Every method of the protocol, in the order the documentation lists them.
        pub const TABLE: &[MethodEntry] = &[
            $(
                $( MethodEntry::request::<$req>(), )*
                $( MethodEntry::notification::<$note>(), )*
            )*
        ];
    };
}

methods! {
    to_plugin (HostToPlugin, Plugin) {
        requests {
            /// The handshake: versions, limits, the plugin's identity.
            Initialize = "initialize", InitializeParams => InitializeResult;
            /// One turn; its result is the turn's outcome.
            TurnRun = "turn/run", TurnRunParams => RuntimeTurnOutcome;
        }
        notifications {
            /// The turn is draining: no new decision, finish what is in flight.
            TurnDraining = "turn/draining", TurnDrainingParams;
            /// The turn is aborted: stop, exit at end of input.
            TurnAbort = "turn/abort", TurnAbortParams;
        }
    }
    to_host (PluginToHost, Host) {
        requests {
            /// A tool call, re-authorized by the host's kernel.
            InvokeTool = "host/invokeTool", InvokeToolParams => ToolResult;
        }
        notifications {
            /// A runtime event of the turn.
            Emit = "host/emit", EmitParams;
            /// A provenance annotation of the turn.
            Annotate = "host/annotate", AnnotateParams;
        }
    }
}

/// One row of [`TABLE`]: a method as data, for what lists every method.
#[derive(Debug, Clone, Copy)]
pub struct MethodEntry {
    /// Its wire name.
    pub name: &'static str,
    /// Who sends it.
    pub direction: Direction,
    /// The schema of its params, registered in a generator.
    pub params: fn(&mut SchemaGenerator) -> Schema,
    /// The schema of its result; `None` for a notification.
    pub result: Option<fn(&mut SchemaGenerator) -> Schema>,
}

fn schema_of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

impl MethodEntry {
    const fn request<M: Request>() -> MethodEntry {
        MethodEntry {
            name: M::NAME,
            direction: M::DIRECTION,
            params: schema_of::<M::Params>,
            result: Some(schema_of::<M::Result>),
        }
    }

    const fn notification<M: Notification>() -> MethodEntry {
        MethodEntry {
            name: M::NAME,
            direction: M::DIRECTION,
            params: schema_of::<M::Params>,
            result: None,
        }
    }

    /// `"request"` or `"notification"`.
    pub const fn kind(&self) -> &'static str {
        if self.result.is_some() {
            "request"
        } else {
            "notification"
        }
    }
}

/// The methods `direction`'s receiver handles, by name.
pub fn received_by(direction: Direction) -> impl Iterator<Item = &'static MethodEntry> {
    TABLE.iter().filter(move |m| m.direction == direction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_the_constants_derive_from_the_declarations() {
        let mut names: Vec<_> = TABLE.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
        assert_eq!(crate::methods::HOST_INVOKE_TOOL, InvokeTool::NAME);
        assert_eq!(received_by(Direction::PluginToHost).count(), 3);
        assert_eq!(received_by(Direction::HostToPlugin).count(), 4);
    }

    /// Each side's enums hold exactly its half of the table, split by
    /// kind, and name each method as the table does.
    #[test]
    fn each_sides_enums_are_its_half_of_the_table() {
        fn check<S: Side>() {
            for m in TABLE {
                let ours = m.direction == S::SENDER;
                let request = S::Request::from_name(m.name);
                let notification = S::Notification::from_name(m.name);
                assert_eq!(request.is_some(), ours && m.result.is_some(), "{}", m.name);
                assert_eq!(
                    notification.is_some(),
                    ours && m.result.is_none(),
                    "{}",
                    m.name
                );
                assert!(request.is_none_or(|r| r.name() == m.name));
                assert!(notification.is_none_or(|n| n.name() == m.name));
            }
            assert!(S::Request::from_name("probe/unknown").is_none());
        }
        check::<to_host::Host>();
        check::<to_plugin::Plugin>();
        assert_eq!(to_host::Request::InvokeTool.name(), "host/invokeTool");
        assert_eq!(to_plugin::Notification::TurnAbort.name(), "turn/abort");
    }
}
