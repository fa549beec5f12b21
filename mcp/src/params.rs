//! Tool arguments, deserialized with the path of the offending field in the error, so that a
//! malformed call says which argument was wrong ("`tasks[3].priority`: invalid type ...").
//! rmcp's own `Parameters` reports serde's message alone, which often names no field.

use rmcp::ErrorData;
use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use std::borrow::Cow;

/// Named `Parameters` on purpose: rmcp's `#[tool]` macro finds the input type by this name.
pub struct Parameters<T>(pub T);

impl<T: JsonSchema> JsonSchema for Parameters<T> {
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
    fn inline_schema() -> bool {
        T::inline_schema()
    }
}

impl<S, P: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Parameters<P> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let args = serde_json::Value::Object(context.arguments.take().unwrap_or_default());
        serde_path_to_error::deserialize(args).map(Parameters).map_err(|e| {
            let path = e.path().to_string();
            let message = if path == "." || path.is_empty() {
                e.inner().to_string()
            } else {
                format!("`{path}`: {}", e.inner())
            };
            // This prefix makes rmcp answer with a tool error result (which the model can read
            // and correct) rather than a protocol error.
            ErrorData::invalid_params(format!("failed to deserialize parameters: {message}"), None)
        })
    }
}
