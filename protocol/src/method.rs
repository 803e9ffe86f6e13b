//! The protocol's methods, declared once with their types.
//!
//! Each method is a zero-sized type implementing [`Method`] (its name, its
//! direction, its params) and, when it is a request, [`Request`] (its
//! result). Everything that lists methods derives from these declarations:
//! the name constants in [`crate::methods`], the schema bundle's `methods`
//! index ([`TABLE`]), and the peers' dispatch, which parses a message's
//! params as `M::Params` and answers a request with `M::Result`. A new
//! method is one declaration here and one line in [`TABLE`], plus its
//! handler on the side that receives it.

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

macro_rules! request {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $dir:ident, $params:ty => $result:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $ty;
        impl Method for $ty {
            const NAME: &'static str = $name;
            const DIRECTION: Direction = Direction::$dir;
            type Params = $params;
        }
        impl Request for $ty {
            type Result = $result;
        }
    };
}

macro_rules! notification {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $dir:ident, $params:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $ty;
        impl Method for $ty {
            const NAME: &'static str = $name;
            const DIRECTION: Direction = Direction::$dir;
            type Params = $params;
        }
        impl Notification for $ty {}
    };
}

request!(
    /// The handshake: versions, limits, the plugin's identity.
    Initialize, "initialize", HostToPlugin, InitializeParams => InitializeResult
);
request!(
    /// One turn; its result is the turn's outcome.
    TurnRun, "turn/run", HostToPlugin, TurnRunParams => RuntimeTurnOutcome
);
notification!(
    /// The turn is draining: no new decision, finish what is in flight.
    TurnDraining, "turn/draining", HostToPlugin, TurnDrainingParams
);
notification!(
    /// The turn is aborted: stop, exit at end of input.
    TurnAbort, "turn/abort", HostToPlugin, TurnAbortParams
);
request!(
    /// A tool call, re-authorized by the host's kernel.
    InvokeTool, "host/invokeTool", PluginToHost, InvokeToolParams => ToolResult
);
notification!(
    /// A runtime event of the turn.
    Emit, "host/emit", PluginToHost, EmitParams
);
notification!(
    /// A provenance annotation of the turn.
    Annotate, "host/annotate", PluginToHost, AnnotateParams
);

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

/// Every method of the protocol, in the order the documentation lists them.
pub const TABLE: &[MethodEntry] = &[
    MethodEntry::request::<Initialize>(),
    MethodEntry::request::<TurnRun>(),
    MethodEntry::notification::<TurnDraining>(),
    MethodEntry::notification::<TurnAbort>(),
    MethodEntry::request::<InvokeTool>(),
    MethodEntry::notification::<Emit>(),
    MethodEntry::notification::<Annotate>(),
];

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
}
