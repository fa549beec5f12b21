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

/// Argument names worth aiming at besides the ones the tools declare: near misses and names
/// another tool takes.
const EXTRA_KEYS: &[&str] = &["id", "prompts", "task", "job", "token", "path"];

/// Every tool a server lists (plus one it does not have) and every argument name any of them
/// declares, read from the server itself: a tool added later is aimed at without editing this
/// test.
async fn targets(
    client: &rmcp::service::RunningService<rmcp::service::RoleClient, ()>,
) -> (Vec<String>, Vec<String>) {
    let tools = client.list_all_tools().await.unwrap();
    let mut keys: std::collections::BTreeSet<String> =
        EXTRA_KEYS.iter().map(|k| k.to_string()).collect();
    for t in &tools {
        if let Some(Value::Object(props)) = t.input_schema.get("properties") {
            keys.extend(props.keys().cloned());
        }
    }
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.push("no_such_tool".into());
    (names, keys.into_iter().collect())
}

fn args(keys: Vec<String>) -> impl Strategy<Value = Value> {
    proptest::collection::btree_map(proptest::sample::select(keys), value(), 0..5)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// What a refused call must leave as it was: every task's status and the default model (what
/// `set_default_model` writes).
fn snapshot(w: &common::World) -> (Vec<(queue::TaskId, queue::TaskStatus)>, Option<String>) {
    let tasks =
        w.store.list(&Default::default()).unwrap().iter().map(|t| (t.id, t.status)).collect();
    (tasks, w.store.setting("default_model").unwrap())
}

#[test]
fn random_arguments_to_every_tool_never_break_the_server() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let w = rt.block_on(common::world());
    let (tools, keys) = rt.block_on(async {
        w.call("submit_task", json!({"prompt": "a task to aim at"})).await;
        targets(&w.client).await
    });
    for named in
        ["followup_task", "merge_task", "restart_worker", "list_models", "set_default_model"]
    {
        assert!(tools.iter().any(|t| t == named), "{named} is not aimed at: {tools:?}");
    }
    let mut runner = TestRunner::new(Config { cases: 400, ..Config::default() });
    runner
        .run(&(proptest::sample::select(tools), args(keys)), |(tool, args)| {
            rt.block_on(async {
                let before = snapshot(&w);
                match w.raw(&tool, args.clone()).await {
                    Ok(r) if r.is_error == Some(true) => {
                        prop_assert_eq!(
                            &before,
                            &snapshot(&w),
                            "a refused {} {} changed the queue or the config",
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

/// The reverse bridge (`claude-mcp`), its Claude behind a loopback port nobody listens on: every
/// call that reaches Claude fails as a tool error, and none may break the server or leave a job
/// for a refused call.
#[test]
fn random_arguments_to_every_claude_tool_never_break_the_bridge() {
    use rmcp::ServiceExt;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(queue::Store::open(dir.path().join("q.db")).unwrap());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cfg = taskbridge_mcp::bridge::backend::BridgeConfig {
        api_key: Some("sk-test".into()),
        base_url: format!("http://127.0.0.1:{closed}"),
        claude_cli: None,
        default_model: Some("claude-sonnet-4-5".into()),
        attempts: 1,
        retry_base: std::time::Duration::from_millis(1),
        host: "test-host".into(),
    };
    let client = rt.block_on(async {
        let bridge = taskbridge_mcp::bridge::ClaudeBridge::new(store.clone(), &cfg);
        let (server_io, client_io) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let running = bridge.serve(server_io).await.unwrap();
            let _ = running.waiting().await;
        });
        ().serve(client_io).await.unwrap()
    });
    let (tools, keys) = rt.block_on(targets(&client));
    assert!(tools.iter().filter(|t| t.starts_with("claude_")).count() >= 6, "{tools:?}");
    let jobs = || store.job_counts().unwrap().values().sum::<i64>();
    let call = |tool: &str, args: &Value| {
        let args = args.as_object().cloned().unwrap_or_default();
        client.call_tool(
            rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(args),
        )
    };
    let mut runner = TestRunner::new(Config { cases: 300, ..Config::default() });
    runner
        .run(&(proptest::sample::select(tools), args(keys)), |(tool, args)| {
            rt.block_on(async {
                let before = jobs();
                match call(&tool, &args).await {
                    Ok(r) if r.is_error == Some(true) && tool != "claude_ask" => {
                        prop_assert_eq!(before, jobs(), "a refused {} {} left a job", tool, args);
                    }
                    Ok(_) => {}
                    Err(rmcp::ServiceError::McpError(_)) => {}
                    Err(e) => prop_assert!(false, "{} {} broke the connection: {}", tool, args, e),
                }
                let status = call("claude_status", &json!({})).await;
                prop_assert!(
                    status.is_ok(),
                    "the bridge stopped answering after {} {}",
                    tool,
                    args
                );
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
