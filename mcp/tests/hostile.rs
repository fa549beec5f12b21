//! Hostile input: random and malformed arguments to every tool. The server never panics, always
//! answers, keeps serving, and writes nothing for a refused call. Plus oversized and deeply
//! nested input.
#![allow(clippy::unwrap_used)]

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        prop_oneof![Just(-1i64), Just(0), Just(1), Just(21), Just(101), Just(500), Just(262_145)]
            .prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,40}".prop_map(Value::String),
        prop_oneof![
            Just("#0"),
            Just("#99"),
            Just("any"),
            Just("all"),
            Just("done"),
            Just("/"),
            Just("")
        ]
        .prop_map(|s| json!(s)),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,12}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const KEYS: &[&str] = &[
    "prompt",
    "task_id",
    "task_ids",
    "answer",
    "note",
    "priority",
    "repo",
    "ref",
    "tasks",
    "mode",
    "timeout_s",
    "offset",
    "max_bytes",
    "max_diff_bytes",
    "status",
    "limit",
    "depends_on",
    "older_than_s",
    "statuses",
    "model",
    "provider",
    "max_attempts",
    "request_id",
];

fn args() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map(proptest::sample::select(KEYS), value(), 0..5)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

const TOOLS: &[&str] = &[
    "submit_task",
    "submit_batch",
    "get_task",
    "get_task_result",
    "get_task_logs",
    "wait_for",
    "answer_task",
    "list_tasks",
    "queue_status",
    "list_workers",
    "add_task_note",
    "cancel_task",
    "retry_task",
    "set_task_priority",
    "clear_finished",
    "ping",
    "no_such_tool",
];

#[test]
fn random_arguments_to_every_tool_never_break_the_server() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let w = rt.block_on(common::world());
    rt.block_on(async {
        w.call("submit_task", json!({"prompt": "a task to aim at"})).await;
    });
    let mut runner = TestRunner::new(Config { cases: 300, ..Config::default() });
    runner
        .run(&(proptest::sample::select(TOOLS), args()), |(tool, args)| {
            rt.block_on(async {
                let before = w.task_count();
                let statuses: Vec<_> = w
                    .store
                    .list(&Default::default())
                    .unwrap()
                    .iter()
                    .map(|t| (t.id, t.status))
                    .collect();
                match w.raw(tool, args.clone()).await {
                    Ok(r) if r.is_error == Some(true) => {
                        let after: Vec<_> = w
                            .store
                            .list(&Default::default())
                            .unwrap()
                            .iter()
                            .map(|t| (t.id, t.status))
                            .collect();
                        prop_assert_eq!(
                            before,
                            w.task_count(),
                            "a refused {} {} wrote a task",
                            tool,
                            args
                        );
                        prop_assert_eq!(
                            statuses,
                            after,
                            "a refused {} {} changed a task",
                            tool,
                            args
                        );
                    }
                    Ok(_) => {}
                    // A protocol error (unknown tool, bad params) is an answer too.
                    Err(rmcp::ServiceError::McpError(_)) => {}
                    Err(e) => prop_assert!(false, "{} {} broke the connection: {}", tool, args, e),
                }
                let ping = w.raw("ping", json!({})).await;
                prop_assert!(ping.is_ok(), "the server stopped answering after {} {}", tool, args);
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn oversized_and_deeply_nested_input_is_refused_cleanly() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let w = common::world().await;
        let msg = w.refused("submit_task", json!({"prompt": "x".repeat(300 * 1024)})).await;
        assert!(msg.contains("the limit is 262144"), "{msg}");
        let mut deep = json!("bottom");
        // Under serde_json's recursion limit (128), so the message parses and the tool answers.
        for _ in 0..100 {
            deep = json!([deep]);
        }
        let r = w.raw("submit_task", json!({"prompt": deep})).await;
        assert!(r.is_err() || r.unwrap().is_error == Some(true));
        let batch: Vec<Value> = (0..1000).map(|i| json!({"prompt": format!("t{i}")})).collect();
        let msg = w.refused("submit_batch", json!({"tasks": batch})).await;
        assert!(msg.contains("1 to 20"), "{msg}");
        assert_eq!(w.task_count(), 0);
        w.call("ping", json!({})).await;
    });
}
