//! The TaskBridge tools through rmcp's own client, in process over a duplex pipe, on a real
//! SQLite file and a real git repository. The worker's side of the queue is played through the
//! queue's public API where a test needs a task to finish or ask.
#![allow(clippy::unwrap_used)]

mod common;

use common::{world, world_with};
use queue::{Outcome, TaskId};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

#[tokio::test]
async fn the_tool_list_matches_the_snapshot() {
    let w = world().await;
    let tools = w.client.list_all_tools().await.unwrap();
    let got: Vec<Value> =
        tools
        .iter()
        .map(|t| json!({"name": t.name, "input_schema": t.input_schema, "output_schema": t.output_schema}))
        .collect();
    let got = serde_json::to_string_pretty(&got).unwrap() + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/tools.json");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(got, want, "tool list changed; rerun with UPDATE_SNAPSHOTS=1 and review the diff");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for expected in [
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
        "restart_worker",
        "add_task_note",
        "cancel_task",
        "retry_task",
        "clear_finished",
        "list_models",
        "set_default_model",
        "ping",
    ] {
        assert!(names.contains(&expected), "missing tool {expected}");
    }
    let info = w.client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "taskbridge");
    assert!(info.instructions.as_deref().unwrap().contains("wait_for"));
}

#[tokio::test]
async fn submit_then_read_the_task_back() {
    let w = world().await;
    let t = w
        .call(
            "submit_task",
            json!({"prompt": "Add docs", "priority": 7, "readonly": true, "request_id": "k1"}),
        )
        .await;
    assert_eq!(t["task_id"], 1);
    assert_eq!(t["status"], "queued");
    assert_eq!(t["repo"], w.repo.display().to_string());
    assert_eq!(t["created"], true);
    let again = w.call("submit_task", json!({"prompt": "Other", "request_id": "k1"})).await;
    assert_eq!((again["task_id"].as_i64(), again["created"].as_bool()), (Some(1), Some(false)));
    let got = w.call("get_task", json!({"task_id": 1})).await;
    assert_eq!(got["priority"], 7);
    assert_eq!(got["readonly"], true);
    let list = w.call("list_tasks", json!({"status": "queued"})).await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), 1);
    let st = w.call("queue_status", json!({})).await;
    assert_eq!(st["counts"]["queued"], 1);
    let ping = w.call("ping", json!({})).await;
    assert_eq!(ping["version"], env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn a_batch_links_its_items_and_is_all_or_nothing() {
    let w = world().await;
    let out = w
        .call(
            "submit_batch",
            json!({"tasks": [{"prompt": "first"}, {"prompt": "second", "depends_on": ["#0"]}, {"prompt": "third", "depends_on": ["#1", "#0"]}]}),
        )
        .await;
    let tasks = out["tasks"].as_array().unwrap();
    assert_eq!(tasks[1]["depends_on"], json!([1]));
    assert_eq!(tasks[2]["status"], "queued");
    assert_eq!(tasks[2]["display_status"], "blocked");
    let before = w.task_count();
    let msg = w
        .refused("submit_batch", json!({"tasks": [{"prompt": "a", "depends_on": ["#1"]}, {"prompt": "b", "depends_on": ["#0"]}]}))
        .await;
    assert!(msg.contains("dependency cycle"), "{msg}");
    let msg =
        w.refused("submit_batch", json!({"tasks": [{"prompt": "ok"}, {"prompt": " "}]})).await;
    assert!(msg.contains("task #1 of the batch") && msg.contains("prompt"), "{msg}");
    assert_eq!(w.task_count(), before, "a refused batch writes nothing");
}

#[tokio::test]
async fn every_bad_call_is_refused_by_name_and_the_server_keeps_serving() {
    let w = world().await;
    w.call("submit_task", json!({"prompt": "x"})).await;
    let before = w.task_count();
    let cases = [
        ("get_task", json!({"task_id": 99}), "task #99 does not exist"),
        (
            "answer_task",
            json!({"task_id": 1, "answer": "yes"}),
            "task #1 is queued; answer needs a task that is waiting",
        ),
        ("cancel_task", json!({"task_id": 42}), "does not exist"),
        (
            "submit_batch",
            json!({"tasks": (0..21).map(|i| json!({"prompt": format!("t{i}")})).collect::<Vec<_>>()}),
            "a batch holds 1 to 20 tasks; this one has 21",
        ),
        ("submit_batch", json!({"tasks": []}), "a batch holds 1 to 20"),
        (
            "wait_for",
            json!({"task_ids": [1], "timeout_s": 500}),
            "invalid timeout_s: 500 is out of range",
        ),
        ("get_task_logs", json!({"task_id": 1, "max_bytes": 262145}), "invalid max_bytes"),
        (
            "submit_task",
            json!({"prompt": "x", "priority": 101}),
            "invalid priority: 101 is out of range",
        ),
        ("submit_task", json!({"prompt": "x", "repo": "/"}), "is not inside a git repository"),
        ("submit_task", json!({"prompt": "x", "ref": "nope"}), "unknown ref 'nope'"),
        ("submit_task", json!({"prompt": "x", "depends_on": [77]}), "task 77 does not exist"),
        ("submit_task", json!({"prompt": 5}), "prompt"),
        ("submit_task", json!({}), "missing field `prompt`"),
        ("submit_task", json!({"prompt": "x", "bogus": 1}), "unknown field `bogus`"),
        ("get_task", json!({"task_id": "one"}), "task_id"),
        ("list_tasks", json!({"status": "sleeping"}), "unknown status 'sleeping'"),
        ("clear_finished", json!({"statuses": ["queued"]}), "only done, failed and cancelled"),
    ];
    for (tool, args, expected) in cases {
        let msg = match w.raw(tool, args.clone()).await {
            Ok(r) => {
                assert_eq!(r.is_error, Some(true), "{tool} {args} should fail: {r:?}");
                r.content[0].as_text().unwrap().text.clone()
            }
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(expected), "{tool} {args}: expected '{expected}' in '{msg}'");
        // The next call works.
        w.call("ping", json!({})).await;
    }
    assert_eq!(w.task_count(), before, "refused calls write nothing");
    let e = w.raw("no_such_tool", json!({})).await.unwrap_err().to_string();
    assert!(e.contains("-32602") && e.contains("unknown tool 'no_such_tool'"), "{e}");
    w.call("ping", json!({})).await;
}

#[tokio::test]
async fn wait_for_wakes_on_change_and_answer_task_requeues() {
    let w = world().await;
    w.call("submit_task", json!({"prompt": "Ask me"})).await;
    let timed = w.call("wait_for", json!({"task_ids": [1], "timeout_s": 0.2})).await;
    assert_eq!(timed["timed_out"], true);
    assert_eq!(timed["pending"], json!([1]));

    // A stand-in worker claims the task and asks a question once wait_for is waiting: it
    // holds a subscription to the queue's changes from before its first read of the task.
    let store = w.store.clone();
    let claim = store.claim_next("w", "h", Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(w.server.waiting_calls(), 0, "no wait_for is waiting yet");
    let server = w.server.clone();
    let asker = tokio::spawn(async move {
        while server.waiting_calls() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Long past its first read, so the answer can only come through the wake.
        tokio::time::sleep(Duration::from_millis(200)).await;
        store
            .finish(
                claim.task.id,
                claim.token,
                Outcome::Waiting {
                    question: "Red or blue?".into(),
                    session_id: "ses_x".into(),
                    result: None,
                    ask: None,
                },
            )
            .unwrap();
    });
    let started = Instant::now();
    let r = w.call("wait_for", json!({"task_ids": [1], "timeout_s": 30})).await;
    asker.await.unwrap();
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["waiting"], json!([1]));
    assert_eq!(r["tasks"][0]["question"], "Red or blue?");
    assert!(started.elapsed() < Duration::from_secs(29), "woke on the change, not at the timeout");

    let t = w.call("answer_task", json!({"task_id": 1, "answer": "Blue"})).await;
    assert_eq!(t["status"], "queued");
    let claim = w.store.claim_next("w", "h", Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(claim.resume.unwrap().answer, "Blue");

    // A finished task's result, with the diff cut where asked.
    let diff = "+".repeat(500);
    let result = json!({"summary": "did it", "diff": diff, "files_touched": [{"path": "a.txt", "status": "modified"}]});
    let result = Box::new(serde_json::from_value(result).unwrap());
    w.store.finish(TaskId(1), claim.token, Outcome::Done { result }).unwrap();
    let r = w.call("get_task_result", json!({"task_id": 1, "max_diff_bytes": 100})).await;
    assert_eq!(r["summary"], "did it");
    assert_eq!(r["diff"].as_str().unwrap().len(), 100);
    assert_eq!(r["diff_truncated"], true);
    let all = w.call("wait_for", json!({"task_ids": [1], "mode": "all"})).await;
    assert_eq!(all["done"], json!([1]));
}

#[tokio::test]
async fn logs_are_paged_by_offset() {
    let w = world().await;
    w.call("submit_task", json!({"prompt": "x"})).await;
    let text: String = (0..200).map(|i| format!("line {i}\n")).collect();
    std::fs::write(w.home.logs_dir().join("1.log"), &text).unwrap();
    let mut offset = 0u64;
    let mut got = String::new();
    loop {
        let page = w
            .call("get_task_logs", json!({"task_id": 1, "offset": offset, "max_bytes": 333}))
            .await;
        got.push_str(page["text"].as_str().unwrap());
        assert_eq!(page["size"], text.len());
        assert_eq!(page["running"], false);
        offset = page["next_offset"].as_u64().unwrap();
        if page["eof"] == true {
            break;
        }
    }
    assert_eq!(got, text);
    let tail = w.call("get_task_logs", json!({"task_id": 1, "max_bytes": 9})).await;
    assert_eq!(tail["text"], "line 199\n");
}

#[tokio::test]
async fn notes_priority_cancel_retry_and_clear() {
    let w = world().await;
    w.call("submit_task", json!({"prompt": "x"})).await;
    let t = w.call("add_task_note", json!({"task_id": 1, "note": "use tabs"})).await;
    assert_eq!(t["notes"][0]["note"], "use tabs");
    let t = w.call("set_task_priority", json!({"task_id": 1, "priority": -5})).await;
    assert_eq!(t["priority"], -5);
    let t = w.call("cancel_task", json!({"task_id": 1})).await;
    assert_eq!(t["status"], "cancelled");
    let t = w.call("retry_task", json!({"task_id": 1})).await;
    assert_eq!(t["status"], "queued");
    w.call("cancel_task", json!({"task_id": 1})).await;
    std::fs::write(w.home.logs_dir().join("1.log"), "old").unwrap();
    let c = w.call("clear_finished", json!({"statuses": ["cancelled"]})).await;
    assert_eq!(c["cleared"], json!([1]));
    assert!(!w.home.logs_dir().join("1.log").exists());
    assert_eq!(w.task_count(), 0);
    let workers = w.call("list_workers", json!({})).await;
    assert_eq!(workers["workers"], json!([]));
    // The tool's earlier name still answers, with the same result, and is not listed.
    assert_eq!(w.call("worker_heartbeat", json!({})).await, workers);
    let tools = w.client.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| t.name != "worker_heartbeat"));
    // The history, on request.
    w.store.register_worker("w-old", 1, "h", 1, "opencode serve").unwrap();
    w.store.worker_stopped("w-old").unwrap();
    let all = w.call("list_workers", json!({"all": true})).await;
    assert_eq!(all["workers"][0]["id"], "w-old", "{all}");
}

/// The host a server goes by is the one its environment names (`TASKBRIDGE_HOST`), not the
/// system's: a dead worker registered under that name is this host's, one under the system's
/// name another host's.
#[tokio::test]
async fn restart_worker_knows_this_host_by_the_name_the_server_was_started_with() {
    let env = queue::Environment::from_vars([("TASKBRIDGE_HOST", "box-under-test")]);
    let w = world_with(worker::WorkerConfig { env, ..Default::default() }).await;
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    exited.wait().unwrap();
    let system = worker::hostname(&queue::Environment::default());
    assert_ne!(system, "box-under-test");
    w.store.register_worker("named", exited.id(), "box-under-test", 1, "opencode serve").unwrap();
    w.store.register_worker("system", exited.id(), &system, 1, "opencode serve").unwrap();
    let r = w.call("restart_worker", json!({})).await;
    assert_eq!(r["restarted"], json!(["named"]), "{r}");
    // A task a worker of this host (by that name) runs has its log here: no word of another.
    w.store
        .register_worker("local", std::process::id(), "box-under-test", 1, "opencode serve")
        .unwrap();
    let base = "0123456789abcdef0123456789abcdef01234567";
    let (t, _) = w.store.submit(queue::TaskSpec::new("t", "/tmp/r", base)).unwrap();
    w.store.claim_next("local", "box-under-test", Duration::from_secs(600)).unwrap().unwrap();
    let logs = w.call("get_task_logs", json!({"task_id": t.id.0})).await;
    assert_eq!(logs["host"], "box-under-test", "{logs}");
    assert!(logs.get("where").is_none(), "the log is on this host: {logs}");
}

/// `restart_worker` gives back the running tasks of a worker of this host whose process is
/// gone, and leaves alone a live one, a stopped one, and one of another host (its pid means
/// nothing here).
#[tokio::test]
async fn restart_worker_requeues_only_a_dead_local_workers_tasks() {
    let w = world().await;
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    exited.wait().unwrap();
    let dead_pid = exited.id();
    let here = worker::hostname(&queue::Environment::default());
    let s = &w.store;
    s.register_worker("dead", dead_pid, &here, 1, "opencode serve").unwrap();
    s.register_worker("live", std::process::id(), &here, 1, "opencode serve").unwrap();
    s.register_worker("elsewhere", dead_pid, "another-host", 1, "opencode serve").unwrap();
    s.register_worker("stopped", dead_pid, &here, 1, "opencode serve").unwrap();
    s.worker_stopped("stopped").unwrap();
    let base = "0123456789abcdef0123456789abcdef01234567";
    let mut ids = vec![];
    for (title, by, host) in [("a", "dead", here.as_str()), ("b", "elsewhere", "another-host")] {
        let (t, _) = s.submit(queue::TaskSpec::new(title, "/tmp/r", base)).unwrap();
        let c = s.claim_next(by, host, Duration::from_secs(600)).unwrap().unwrap();
        assert_eq!(c.task.id, t.id);
        ids.push(t.id);
    }
    let r = w.call("restart_worker", json!({})).await;
    assert_eq!(r["restarted"], json!(["dead"]), "{r}");
    assert_eq!(r["requeued_tasks"], json!([ids[0].0]), "{r}");
    assert_eq!(r["workers_alive_before"], 2, "the live one and another host's: {r}");
    // Its lease is over; the next sweep puts it back in the queue.
    s.reap_expired().unwrap();
    let a = s.get(ids[0]).unwrap();
    assert_eq!(a.status, queue::TaskStatus::Queued, "{:?} {:?}", a.worker, a.display_status);
    assert_eq!(s.get(ids[1]).unwrap().status, queue::TaskStatus::Running);
}

/// With no worker alive, a server that runs none of its own (and no installed service) says
/// what to start; with one alive, on any host, it says nothing of the kind. Stopped workers
/// are not alive.
#[tokio::test]
async fn restart_worker_without_a_worker_of_its_own_says_what_to_start_when_none_is_alive() {
    let w = world().await;
    let r = w.call("restart_worker", json!({})).await;
    assert_eq!(r["workers_alive_before"], 0, "{r}");
    let note = r["note"].as_str().unwrap_or_default();
    assert!(note.contains("start `taskbridge worker`"), "{r}");
    assert_eq!((&r["service"], &r["started_worker"]), (&Value::Null, &Value::Null), "{r}");
    for gone in ["gone", "gone too"] {
        w.store.register_worker(gone, 1, "another-host", 1, "opencode serve").unwrap();
        w.store.worker_stopped(gone).unwrap();
    }
    w.store.register_worker("elsewhere", 1, "another-host", 1, "opencode serve").unwrap();
    let r = w.call("restart_worker", json!({})).await;
    assert_eq!(r["workers_alive_before"], 1, "{r}");
    assert_eq!((&r["note"], &r["started_worker"]), (&Value::Null, &Value::Null), "{r}");
}

/// A server that runs a worker of its own starts it again when it has stopped, and starts
/// nothing while it lives.
#[tokio::test]
async fn restart_worker_starts_the_servers_own_worker_again_only_once_it_has_stopped() {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut first = None;
    let w = common::world_running(worker::WorkerConfig::default(), |store, home| {
        let running = worker::Worker::start(
            store.clone(),
            home.clone(),
            worker::WorkerConfig::default(),
            stop.clone(),
        );
        let embedded = running.worker.clone();
        first = Some(running);
        Some(embedded)
    })
    .await;
    let first = first.unwrap();
    let id = first.worker.id().to_owned();
    let live = |w: &common::World| -> Vec<String> {
        w.store.list_workers().unwrap().into_iter().filter(|w| !w.stopped).map(|w| w.id).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while live(&w) != vec![id.clone()] {
        assert!(Instant::now() < deadline, "the worker never registered: {:?}", live(&w));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = w.call("restart_worker", json!({})).await;
    assert_eq!(r["workers_alive_before"], 1, "{r}");
    assert_eq!(r["started_worker"], Value::Null, "{r}");

    stop.cancel();
    first.handle.await.unwrap().unwrap();
    assert_eq!(live(&w), Vec::<String>::new());
    let r = w.call("restart_worker", json!({})).await;
    assert_eq!(r["workers_alive_before"], 0, "{r}");
    let started = r["started_worker"].as_str().unwrap().to_owned();
    assert_ne!(started, id, "{r}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while live(&w) != vec![started.clone()] {
        assert!(Instant::now() < deadline, "the new worker never registered: {:?}", live(&w));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.server.shutdown();
}

#[tokio::test]
async fn a_server_with_repository_roots_runs_and_shows_only_tasks_under_them() {
    let w = world().await;
    let outside = w._dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    common::git(&outside, &["init", "-q", "-b", "main"]);
    common::git(&outside, &["commit", "-q", "--allow-empty", "-m", "init"]);
    let theirs =
        w.call("submit_task", json!({"prompt": "x", "repo": outside})).await["task_id"].clone();
    w.server.restrict_repos(vec![w.repo.clone()]);
    let err = w.refused("submit_task", json!({"prompt": "y", "repo": outside})).await;
    assert!(err.contains("outside the roots"), "{err}");
    let err = w.refused("get_task", json!({"task_id": theirs})).await;
    assert!(err.contains(&format!("task #{theirs} does not exist")), "{err}");
    let mine = w.call("submit_task", json!({"prompt": "z", "repo": w.repo})).await;
    assert_eq!(mine["status"], "queued");
    assert_eq!(
        w.call("wait_for", json!({"task_ids": [mine["task_id"]], "timeout_s": 0})).await["pending"],
        json!([mine["task_id"]])
    );
    assert_eq!(w.server.waiting_calls(), 0, "a wait that ended holds no subscription");
    // A page counts only what the server may show; clearing leaves the outside task alone.
    let page = w.call("list_tasks", json!({"limit": 1})).await;
    assert_eq!(page["tasks"][0]["task_id"], mine["task_id"], "{page}");
    for id in [&theirs, &mine["task_id"]] {
        w.store.cancel(TaskId(id.as_i64().unwrap())).unwrap();
    }
    let cleared = w.call("clear_finished", json!({})).await;
    assert_eq!(cleared["cleared"], json!([mine["task_id"]]), "{cleared}");
    w.store.get(TaskId(theirs.as_i64().unwrap())).unwrap();
}
