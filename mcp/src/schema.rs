//! Tool schemas as clients validate them. schemars marks integers with formats of its own
//! (`uint`, `uint32`, `int8`, …) that JSON Schema does not define; a strict validator such as
//! Claude Code's (ajv) prints a warning for each one on every start, 44–66 lines a run. The
//! range they carry is kept as `minimum`/`maximum` where it says something.

use rmcp::handler::server::router::tool::ToolRouter;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The formats a client may know: JSON Schema 2020-12's and the OpenAPI ones ajv-formats adds.
const KNOWN: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "binary",
    "password",
];

/// Every tool's input and output schema in `router`, cleaned (see the module's comment).
pub(crate) fn cleaned<S>(mut router: ToolRouter<S>) -> ToolRouter<S> {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        tool.input_schema = Arc::new(clean_object(&tool.input_schema));
        if let Some(out) = &tool.output_schema {
            tool.output_schema = Some(Arc::new(clean_object(out)));
        }
    }
    router
}

fn clean_object(schema: &Map<String, Value>) -> Map<String, Value> {
    match clean(Value::Object(schema.clone())) {
        Value::Object(m) => m,
        _ => schema.clone(),
    }
}

/// `value` without unknown formats, at any depth. An unsigned integer keeps `minimum: 0`.
pub(crate) fn clean(value: Value) -> Value {
    match value {
        Value::Object(mut m) => {
            let unknown = m
                .get("format")
                .and_then(Value::as_str)
                .filter(|f| !KNOWN.contains(f))
                .map(str::to_owned);
            if let Some(format) = unknown {
                m.remove("format");
                if format.starts_with("uint") && !m.contains_key("minimum") {
                    m.insert("minimum".to_owned(), Value::from(0));
                }
            }
            Value::Object(m.into_iter().map(|(k, v)| (k, clean(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(clean).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_formats_go_at_any_depth_and_known_ones_stay() {
        let schema = json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "format": "uint", "minimum": 0},
                "when": {"type": "string", "format": "date-time"},
                "list": {"type": "array", "items": {"type": "integer", "format": "int64"}},
            },
            "$defs": {"D": {"properties": {"x": {"type": ["integer", "null"], "format": "uint32"}}}},
        });
        assert_eq!(
            clean(schema),
            json!({
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "minimum": 0},
                    "when": {"type": "string", "format": "date-time"},
                    "list": {"type": "array", "items": {"type": "integer", "format": "int64"}},
                },
                "$defs": {"D": {"properties": {"x": {"type": ["integer", "null"], "minimum": 0}}}},
            })
        );
    }

    #[test]
    fn a_signed_small_integer_loses_its_format_without_gaining_a_minimum() {
        assert_eq!(clean(json!({"type": "integer", "format": "int8"})), json!({"type": "integer"}));
    }

    #[test]
    fn no_tool_of_either_server_keeps_a_format_a_validator_does_not_know() {
        fn formats(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(f) = m.get("format").and_then(Value::as_str) {
                        out.push(f.to_owned());
                    }
                    m.values().for_each(|v| formats(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| formats(v, out)),
                _ => {}
            }
        }
        let mut tools = crate::server::listed_tools();
        tools.extend(crate::bridge::listed_tools());
        let mut found = Vec::new();
        for tool in &tools {
            formats(&Value::Object((*tool.input_schema).clone()), &mut found);
            if let Some(out) = &tool.output_schema {
                formats(&Value::Object((**out).clone()), &mut found);
            }
        }
        let unknown: Vec<_> = found.iter().filter(|f| !KNOWN.contains(&f.as_str())).collect();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert!(!tools.is_empty());
    }
}
