//! The MCP Tasks extension (SEP-2663) backed by the queue, driven by rmcp's own client over HTTP
//! against the real binary and a real OpenCode run: `run_task` answers with a task at once,
//! `tasks/get` follows it through `input_required` (the agent's question as an elicitation
//! request), TaskBridge restarts in the middle and the new process answers for the same task,
//! `tasks/update` answers the question, `tasks/cancel` cancels, and `completed` carries the
//! result.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, Implementation, ProtocolVersion, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A client that declares the tasks extension (and nothing else).
#[derive(Clone)]
struct TasksClient(ProtocolVersion);

impl rmcp::ClientHandler for TasksClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_tasks().build(),
            Implementation::new("tasks-test", "1.0"),
        )
        .with_protocol_version(self.0.clone())
    }
}

async fn connect(
    port: u16,
    token: &str,
    version: ProtocolVersion,
) -> RunningService<RoleClient, TasksClient> {
    use rmcp::ServiceExt;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    worker::install_tls();
    let cfg = StreamableHttpClientTransportConfig::with_uri(format!("http://127.0.0.1:{port}/mcp"))
        .auth_header(token);
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(cfg);
    if version == ProtocolVersion::V_2025_11_25 {
        return TasksClient(version).serve(transport).await.unwrap();
    }
    // The 2026-07-28 generation opens with `server/discover`, as Claude Code 2.1.328 does.
    let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![version.clone()] };
    TasksClient(version).serve_with_lifecycle(transport, lifecycle).await.unwrap()
}

fn call(name: &'static str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(args.as_object().cloned().unwrap())
}

/// Polls `tasks/get` until the task reaches `status`.
async fn poll_until(
    client: &RunningService<RoleClient, TasksClient>,
    id: &str,
    status: TaskStatus,
) -> rmcp::model::GetTaskResult {
    let start = Instant::now();
    loop {
        let got = client.get_task(GetTaskParams::new(id)).await.unwrap();
        if got.task.status() == status {
            return got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "task {id} never got to {status:?}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_task_lives_in_the_queue_through_a_restart_a_question_and_its_result() {
    tasks_scenario(ProtocolVersion::V_2025_11_25).await;
}

/// The same under the 2026-07-28 protocol: stateless requests that carry the client's
/// capabilities in their `_meta`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_task_under_the_2026_07_28_protocol() {
    tasks_scenario(ProtocolVersion::V_2026_07_28).await;
}

async fn tasks_scenario(version: ProtocolVersion) {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::text(
            "I need a decision.\n\n```taskbridge-question\nShould the banner be red or blue?\n```",
        ),
        Turn::tool(
            "write",
            json!({"filePath": env.worktree(1).join("banner.txt"), "content": "blue banner\n"}),
        ),
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"Added a blue banner.\", \"tests_run\": []}\n```",
        ),
    ]);
    let env = env.with_mock(&mock);
    let serve = || {
        let mut cmd = env.cmd();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--concurrency", "1"]);
        let (child, port, _) = start_http(&mut cmd);
        (child, port)
    };
    let (mut server, port) = serve();
    // The server made the token the first time it started.
    let token = env.token();
    let client = connect(port, &token, version.clone()).await;
    let init = client.peer_info().unwrap();
    assert!(init.capabilities.supports_tasks(), "the server advertises the tasks extension");
    assert_eq!(init.protocol_version, version, "the generation the client asked for");

    let repo = env.repo.display().to_string();
    let created = client
        .call_tool_once(call("run_task", json!({"prompt": "Add a banner file", "repo": repo})))
        .await
        .unwrap();
    let CallToolResponse::Task(created) = created else {
        panic!("a client with tasks gets a task at once: {created:?}")
    };
    // The MCP task id is TaskBridge's task id.
    assert_eq!(created.task.task_id, "1");
    assert!(!created.task.status.is_terminal());

    let asked = poll_until(&client, "1", TaskStatus::InputRequired).await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else { unreachable!() };
    let (key, request) = input_requests.iter().next().unwrap();
    let request = serde_json::to_value(request).unwrap();
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert!(request["params"]["message"].as_str().unwrap().contains("red or blue"), "{request}");
    assert_eq!(request["params"]["requestedSchema"]["required"], json!(["answer"]));

    // TaskBridge restarts: the task is the queue's, so the new process answers for it.
    drop(client);
    server.terminate();
    let (_server, port) = serve();
    let client = connect(port, &token, version).await;
    let again = client.get_task(GetTaskParams::new("1")).await.unwrap();
    assert_eq!(again.task.status(), TaskStatus::InputRequired, "{again:?}");

    // A second task, held back by the waiting one, cancelled through tasks/cancel.
    let second = client
        .call_tool_once(call(
            "run_task",
            json!({"prompt": "Then a footer", "repo": repo, "depends_on": [1]}),
        ))
        .await
        .unwrap();
    let CallToolResponse::Task(second) = second else { panic!("{second:?}") };
    client.cancel_task(CancelTaskParams::new(second.task.task_id.clone())).await.unwrap();
    let cancelled = client.get_task(GetTaskParams::new(second.task.task_id.clone())).await.unwrap();
    assert_eq!(cancelled.task.status(), TaskStatus::Cancelled);
    assert_eq!(env.show(2)["status"], "cancelled");

    let answer = json!({"action": "accept", "content": {"answer": "Blue, please."}});
    let responses = [(key.clone(), answer)].into_iter().collect();
    client.update_task(UpdateTaskParams::new("1", responses)).await.unwrap();
    let done = poll_until(&client, "1", TaskStatus::Completed).await;
    let TaskPayload::Completed { result } = &done.task.payload else { unreachable!() };
    let r = &result["structuredContent"];
    assert_eq!(r["summary"], "Added a blue banner.", "{result:?}");
    assert_eq!(r["files_touched"][0]["path"], "banner.txt");
    assert!(r["diff"].as_str().unwrap().contains("+blue banner"));
    // The answer reached the agent in its session, recorded as the client's elicitation.
    assert!(mock.requests()[1]["messages"].to_string().contains("Blue, please."));
    let shown = env.show(1);
    assert_eq!(shown["questions"][0]["answered_by"], "elicitation:tasks-test", "{shown}");

    // Ids that are not tasks are refused with what is wrong.
    let err = client.get_task(GetTaskParams::new("nope")).await.unwrap_err().to_string();
    assert!(err.contains("not a TaskBridge task id"), "{err}");
    let err = client.get_task(GetTaskParams::new("99")).await.unwrap_err().to_string();
    assert!(err.contains("does not exist"), "{err}");
}
