//! The MCP Tasks extension through rmcp's client, in process over a duplex pipe, on a real
//! SQLite file: `run_task` answers with a task, `tasks/get` reads the queue (a waiting task is
//! `input_required` until its decision was put to the client once), `tasks/update` answers or
//! declines, `tasks/cancel` cancels. The worker's side is played through the queue's public API.
#![allow(clippy::unwrap_used)]

mod common;

use common::world;
use queue::TaskId;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, Implementation, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::{RoleClient, RunningService};
use serde_json::json;

#[derive(Clone)]
struct TasksClient;

impl rmcp::ClientHandler for TasksClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_tasks().build(),
            Implementation::new("tasks-unit", "1.0"),
        )
    }
}

async fn connect(w: &common::World) -> RunningService<RoleClient, TasksClient> {
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let server = w.server.clone();
    tokio::spawn(async move {
        let running = server.serve(server_io).await.unwrap();
        let _ = running.waiting().await;
    });
    TasksClient.serve(client_io).await.unwrap()
}

async fn run_task(client: &RunningService<RoleClient, TasksClient>, prompt: &str) -> String {
    let args = json!({"prompt": prompt}).as_object().cloned().unwrap();
    let r = client
        .call_tool_once(CallToolRequestParams::new("run_task").with_arguments(args))
        .await
        .unwrap();
    let CallToolResponse::Task(created) = r else { panic!("a task at once: {r:?}") };
    created.task.task_id
}

async fn get(
    client: &RunningService<RoleClient, TasksClient>,
    id: &str,
) -> rmcp::model::GetTaskResult {
    client.get_task(GetTaskParams::new(id)).await.unwrap()
}

#[tokio::test]
async fn a_waiting_task_is_input_required_until_its_decision_is_answered_or_declined() {
    let w = world().await;
    let client = connect(&w).await;
    let id = run_task(&client, "Ask me").await;
    assert_eq!(id, "1", "the MCP task id is the task's id");
    assert_eq!(get(&client, &id).await.task.status(), TaskStatus::Working);

    common::make_it_wait(&w);
    // Asked for as often as the client looks, until it answers.
    for _ in 0..2 {
        let got = get(&client, &id).await;
        let TaskPayload::InputRequired { input_requests } = &got.task.payload else {
            panic!("a waiting task is input_required: {got:?}")
        };
        assert_eq!(input_requests.keys().collect::<Vec<_>>(), ["task-1-decision-0"]);
    }
    // Declined: the task keeps waiting for the planner, and is not put to the client again.
    let decline = [("task-1-decision-0".to_owned(), json!({"action": "decline"}))];
    client.update_task(UpdateTaskParams::new(&id, decline.into_iter().collect())).await.unwrap();
    assert_eq!(w.store.get(TaskId(1)).unwrap().status, queue::TaskStatus::Waiting);
    assert_eq!(get(&client, &id).await.task.status(), TaskStatus::Working);

    // The next decision is asked, and an accepted answer reaches the task.
    let args = json!({"task_id": 1, "answer": "Red"}).as_object().cloned().unwrap();
    client.call_tool(CallToolRequestParams::new("answer_task").with_arguments(args)).await.unwrap();
    common::make_it_wait(&w);
    let got = get(&client, &id).await;
    let TaskPayload::InputRequired { input_requests } = &got.task.payload else {
        panic!("the second round is asked: {got:?}")
    };
    let key = input_requests.keys().next().unwrap().clone();
    assert_eq!(key, "task-1-decision-1");
    let accept = [(key, json!({"action": "accept", "content": {"answer": "Blue"}}))];
    client.update_task(UpdateTaskParams::new(&id, accept.into_iter().collect())).await.unwrap();
    let task = w.store.get(TaskId(1)).unwrap();
    assert_eq!(task.status, queue::TaskStatus::Queued, "{task:?}");
    assert_eq!(task.questions[1].answer.as_deref(), Some("Blue"));
    assert_eq!(task.questions[1].answered_by.as_deref(), Some("elicitation:tasks-unit"));
}

#[tokio::test]
async fn tasks_cancel_cancels_the_queued_task() {
    let w = world().await;
    let client = connect(&w).await;
    let id = run_task(&client, "Never mind").await;
    client.cancel_task(CancelTaskParams::new(&id)).await.unwrap();
    assert_eq!(w.store.get(TaskId(1)).unwrap().status, queue::TaskStatus::Cancelled);
    assert_eq!(get(&client, &id).await.task.status(), TaskStatus::Cancelled);
}
