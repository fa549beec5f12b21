//! A waiting task's decision put to the client that submitted it, after its call returned:
//! through rmcp's client with an elicitation handler, in process over a duplex pipe, on a real
//! SQLite file. The worker's side of the queue is played through the queue's public API.
#![allow(clippy::unwrap_used)]

mod common;

use common::world;
use queue::TaskId;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult,
    ElicitationAction, ErrorData, Implementation,
};
use rmcp::service::{RequestContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use taskbridge_mcp::TaskBridge;

/// A client that can ask its person, who answers every form "Blue" (or declines each).
#[derive(Clone, Default)]
struct Person {
    asked: Arc<Mutex<Vec<String>>>,
    declines: bool,
}

impl ClientHandler for Person {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_elicitation().build(),
            Implementation::new("elicit-test", "1.0"),
        )
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if let ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.asked.lock().unwrap().push(message);
        }
        if self.declines {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        }
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"answer": "Blue"})))
    }
}

/// A second connection to `server`, as that person's client.
async fn connect(server: &TaskBridge, person: Person) -> RunningService<RoleClient, Person> {
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let server = server.clone();
    tokio::spawn(async move {
        let running = server.serve(server_io).await.unwrap();
        let _ = running.waiting().await;
    });
    person.serve(client_io).await.unwrap()
}

/// Submits a task through `client` and makes it wait on a question, as a worker would.
async fn submit_and_ask(w: &common::World, client: &RunningService<RoleClient, Person>) {
    let args = json!({"prompt": "Ask me"}).as_object().cloned().unwrap();
    let r = client
        .call_tool(CallToolRequestParams::new("submit_task").with_arguments(args))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    common::make_it_wait(w);
}

#[tokio::test]
async fn over_stdio_the_submitter_is_asked_after_its_call_returned() {
    let w = world().await;
    w.server.ask_outside_calls();
    let person = Person::default();
    let client = connect(&w.server, person.clone()).await;
    submit_and_ask(&w, &client).await;
    // No call of the client waits: the answer can only come from the server's own request.
    let mut task = w.store.get(TaskId(1)).unwrap();
    for _ in 0..200 {
        if task.questions[0].answer.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        task = w.store.get(TaskId(1)).unwrap();
    }
    assert_eq!(task.questions[0].answer.as_deref(), Some("Blue"), "{task:?}");
    assert_eq!(task.questions[0].answered_by.as_deref(), Some("elicitation:elicit-test"));
    assert_eq!(task.status, queue::TaskStatus::Queued, "the answered task runs again");
    let asked = person.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "asked once: {asked:?}");
    assert!(asked[0].contains("Red or blue?"), "{asked:?}");
}

#[tokio::test]
async fn where_the_transport_may_not_deliver_it_the_submitter_is_asked_only_in_a_call() {
    // A Streamable HTTP server is never told it may ask outside calls.
    let w = world().await;
    let person = Person::default();
    let client = connect(&w.server, person.clone()).await;
    submit_and_ask(&w, &client).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(person.asked.lock().unwrap().is_empty(), "asked outside a call");
    assert_eq!(w.store.get(TaskId(1)).unwrap().status, queue::TaskStatus::Waiting);
    // A call that waits on it asks.
    let args = json!({"task_ids": [1], "timeout_s": 1}).as_object().cloned().unwrap();
    client.call_tool(CallToolRequestParams::new("wait_for").with_arguments(args)).await.unwrap();
    assert_eq!(person.asked.lock().unwrap().len(), 1);
    let task = w.store.get(TaskId(1)).unwrap();
    assert_eq!(task.questions[0].answered_by.as_deref(), Some("elicitation:elicit-test"));
}

#[tokio::test]
async fn a_declined_decision_is_never_put_to_the_client_again() {
    let w = world().await;
    let person = Person { declines: true, ..Default::default() };
    let client = connect(&w.server, person.clone()).await;
    submit_and_ask(&w, &client).await;
    for _ in 0..2 {
        let args = json!({"task_ids": [1], "timeout_s": 0.5}).as_object().cloned().unwrap();
        let r = client
            .call_tool(CallToolRequestParams::new("wait_for").with_arguments(args))
            .await
            .unwrap();
        assert_eq!(r.structured_content.unwrap()["waiting"], json!([1]));
    }
    assert_eq!(person.asked.lock().unwrap().len(), 1, "asked once, then never again");
    let task = w.store.get(TaskId(1)).unwrap();
    assert_eq!(task.status, queue::TaskStatus::Waiting, "declined: the task waits for the planner");
    assert_eq!(task.questions[0].answer, None);
}

#[tokio::test]
async fn a_server_that_is_shutting_down_asks_no_one() {
    let w = world().await;
    w.server.ask_outside_calls();
    let person = Person::default();
    let client = connect(&w.server, person.clone()).await;
    let args = json!({"prompt": "Ask me"}).as_object().cloned().unwrap();
    client.call_tool(CallToolRequestParams::new("submit_task").with_arguments(args)).await.unwrap();
    w.server.shutdown();
    common::make_it_wait(&w);
    // Long enough for the submitter's watcher to have asked, had it still been watching.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(person.asked.lock().unwrap().is_empty(), "asked after shutdown");
    assert_eq!(w.store.get(TaskId(1)).unwrap().status, queue::TaskStatus::Waiting);
}
