//! The store's conformance suite, run on both backends (a real SQLite file and a real
//! PostgreSQL server, see `support`): transitions, claim order, dependencies, idempotency,
//! bad input, leases and fencing, jobs, several processes at once, and kill -9 during submits.
//! Tests of one backend's own machinery (SQLite's file and its schema versions) are named so.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod support;
use support::{Backend, Db, child, child_db};

use proptest::prelude::*;
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use taskbridge_queue::*;

const LEASE: Duration = Duration::from_secs(30);

on_both!(
    a_note_reads_back_as_given_to_the_agent_or_as_ended_first,
    settings_and_the_ids_a_row_lists_read_back,
    a_listener_hears_each_committed_change_and_not_a_claim_that_found_nothing,
    submit_stores_every_field_and_defaults,
    happy_path_queued_running_done,
    forbidden_transitions_are_errors_and_write_nothing,
    cancel_queued_waiting_and_running,
    question_answer_resumes_the_same_session_without_using_an_attempt,
    failed_attempt_is_retried_with_backoff_then_fails,
    dependency_failure_propagates_transitively_and_retry_revives_the_chain,
    cancelling_a_dependency_fails_its_dependents_with_its_name,
    idempotent_submit_returns_the_first_task,
    bad_input_is_refused_with_a_message_naming_the_problem,
    a_batch_with_a_cycle_is_refused_whole,
    expired_lease_requeues_then_fails_and_stale_completion_is_rejected,
    question_timeout_fails_a_waiting_task,
    clear_removes_only_finished_tasks,
    clear_under_roots_leaves_other_repositories_alone,
    status_counts_blocked_apart_from_queued,
    jobs_run_queued_running_done_and_finished_jobs_never_change,
    a_cancelled_job_keeps_its_state_when_its_runner_reports_late,
    jobs_of_a_dead_owner_are_failed_as_interrupted_and_live_ones_are_left_alone,
    an_agent_blocked_in_a_live_workers_server_is_resumed_by_that_worker_only,
    answers_are_checked_against_the_decision_they_answer,
    a_budget_stop_continues_raised_or_stops_naming_the_spend,
    a_batch_budget_counts_what_the_batchs_other_tasks_spent,
    an_answer_survives_a_resume_that_fails_and_its_attempt_still_counts,
    a_database_from_a_newer_build_is_refused,
    four_processes_never_claim_a_task_twice,
    kill_9_during_submits_loses_no_acknowledged_task,
    several_processes_creating_the_database_at_once_all_open_it,
    concurrent_duplicate_submits_make_one_task,
    fencing_rejects_every_write_from_an_expired_lease,
    a_session_is_resumed_on_the_host_that_keeps_it_while_a_worker_lives_there,
    orphans_wait_for_a_worker_on_their_own_host,
    a_task_for_another_agent_waits_for_a_worker_that_has_its_cli,
    the_queue_counts_states_submissions_and_what_finished_with_its_timings,
    the_registry_tells_live_silent_and_stopped_workers_and_frees_a_dead_ones_tasks,
    doctor_hears_what_the_queue_runs_on_and_that_it_is_sound,
    every_bound_takes_its_limit_and_refuses_one_past_it,
    an_answer_and_a_note_take_the_limit_and_clearing_takes_only_an_age_and_finished_states,
    a_merge_is_recorded_on_done_tasks_only_and_all_or_nothing,
    a_queued_prompt_is_edited_until_it_runs_and_a_paused_queue_hands_nothing_out,
);

fn open(b: Backend) -> (Db, Store) {
    let db = Db::new(b);
    let store = db.open();
    (db, store)
}

fn spec(prompt: &str) -> TaskSpec {
    TaskSpec::new(prompt, "/tmp/repo", "0123456789abcdef0123456789abcdef01234567")
}

fn submit(store: &Store, prompt: &str) -> TaskId {
    store.submit(spec(prompt)).unwrap().0.id
}

fn claim(store: &Store) -> Option<Claim> {
    store.claim_next("w1", "host", LEASE).unwrap()
}

fn done() -> Outcome {
    Outcome::Done { result: Box::new(TaskResult { summary: "ok".into(), ..Default::default() }) }
}

fn a_listener_hears_each_committed_change_and_not_a_claim_that_found_nothing(b: Backend) {
    let (_db, store) = open(b);
    let heard = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = heard.clone();
    store.on_change(move || {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let heard = || heard.load(std::sync::atomic::Ordering::SeqCst);
    submit(&store, "one");
    assert_eq!(heard(), 1, "a submit is a change");
    let c = claim(&store).unwrap();
    assert_eq!(heard(), 2, "a claim that took a task is one");
    assert!(claim(&store).is_none());
    assert_eq!(heard(), 2, "a claim that found nothing wakes no one");
    store.finish(c.task.id, c.token, done()).unwrap();
    assert_eq!(heard(), 3);
}

fn a_note_reads_back_as_given_to_the_agent_or_as_ended_first(b: Backend) {
    let (_db, store) = open(b);
    let id = submit(&store, "a");
    let c = claim(&store).unwrap();
    store.add_note(id, "given").unwrap();
    assert_eq!(store.take_notes(id, c.token).unwrap(), vec!["given".to_owned()]);
    store.add_note(id, "late").unwrap();
    let fresh = store.get(id).unwrap().notes;
    let flags = |t: &Task| t.notes.iter().map(|n| (n.delivered, n.ended_first)).collect::<Vec<_>>();
    assert_eq!(fresh.len(), 2);
    assert_eq!(flags(&store.get(id).unwrap()), vec![(true, false), (false, false)]);
    store.finish(id, c.token, done()).unwrap();
    assert_eq!(
        flags(&store.get(id).unwrap()),
        vec![(true, false), (false, true)],
        "the note the agent never got is marked so when its task ends"
    );
}

fn settings_and_the_ids_a_row_lists_read_back(b: Backend) {
    let (_db, store) = open(b);
    assert_eq!(store.setting("default_model").unwrap(), None);
    assert_eq!(store.queue_status().unwrap().default_model, None);
    store.set_setting("default_model", "anthropic/claude-x").unwrap();
    assert_eq!(store.setting("default_model").unwrap().as_deref(), Some("anthropic/claude-x"));
    assert_eq!(store.queue_status().unwrap().default_model.as_deref(), Some("anthropic/claude-x"));
    let (a, c) = (submit(&store, "a"), submit(&store, "c"));
    let mut after = spec("b");
    after.depends_on = vec![DepRef::Task(a), DepRef::Task(c)];
    let b_id = store.submit(after).unwrap().0.id;
    let rows = store.rows(None).unwrap();
    let mut waiting = rows.iter().find(|r| r.id == b_id).unwrap().waiting_on.clone();
    waiting.sort();
    assert_eq!(waiting, vec![a, c]);
    assert_eq!(rows.iter().find(|r| r.id == a).unwrap().waiting_on, vec![]);
    store.register_worker("w1", std::process::id(), "host", 2, "opencode serve").unwrap();
    let first = claim(&store).unwrap().task.id;
    let workers = store.list_workers().unwrap();
    assert_eq!(workers.iter().find(|w| w.id == "w1").unwrap().current_tasks, vec![first]);
}

fn submit_stores_every_field_and_defaults(b: Backend) {
    let (_d, store) = open(b);
    let (task, created) = store.submit(spec("Fix the parser\nmore detail")).unwrap();
    assert!(created);
    assert_eq!(task.status, TaskStatus::Queued);
    assert_eq!(task.title, "Fix the parser");
    assert_eq!(task.priority, 0);
    assert_eq!(task.max_attempts, 2);
    assert_eq!(task.timeout_s, 3600);
    assert_eq!(store.get(task.id).unwrap(), task);
}

fn happy_path_queued_running_done(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let c = claim(&store).unwrap();
    assert_eq!(c.task.id, id);
    assert_eq!(c.task.status, TaskStatus::Running);
    assert_eq!(c.task.attempts, 1);
    assert!(claim(&store).is_none(), "a running task is never claimed twice");
    let t = store.finish(id, c.token, done()).unwrap();
    assert_eq!(t.status, TaskStatus::Done);
    assert!(t.finished_at.is_some());
    assert_eq!(t.result.unwrap().summary, "ok");
}

fn forbidden_transitions_are_errors_and_write_nothing(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let before = store.get(id).unwrap();
    assert!(matches!(store.answer(id, "x", "test"), Err(Error::InvalidTransition { .. })));
    assert!(matches!(store.retry(id), Err(Error::InvalidTransition { .. })));
    assert_eq!(store.get(id).unwrap(), before);

    let c = claim(&store).unwrap();
    store.finish(id, c.token, done()).unwrap();
    for (what, r) in [
        ("cancel", store.cancel(id)),
        ("retry", store.retry(id)),
        ("answer", store.answer(id, "x", "test")),
        ("note", store.add_note(id, "x")),
        ("priority", store.set_priority(id, 5)),
    ] {
        let err = r.unwrap_err();
        assert!(matches!(err, Error::InvalidTransition { .. }), "{what}: {err}");
        assert!(err.to_string().contains("is done"), "{what}: {err}");
    }
    // A finished run cannot be finished again, even with the right token.
    assert!(matches!(store.finish(id, c.token, done()), Err(Error::StaleLease { .. })));
}

fn cancel_queued_waiting_and_running(b: Backend) {
    let (_d, store) = open(b);
    let q = submit(&store, "queued");
    assert_eq!(store.cancel(q).unwrap().status, TaskStatus::Cancelled);

    let r = submit(&store, "running");
    let c = claim(&store).unwrap();
    let t = store.cancel(r).unwrap();
    assert_eq!(t.status, TaskStatus::Running, "a running task is cancelled by its worker");
    assert!(t.cancel_requested);
    assert!(store.heartbeat(r, c.token, LEASE).unwrap().cancel_requested);
    let t = store.finish(r, c.token, Outcome::Cancelled { result: None }).unwrap();
    assert_eq!(t.status, TaskStatus::Cancelled);

    let w = submit(&store, "waiting");
    let c = claim(&store).unwrap();
    store
        .finish(
            w,
            c.token,
            Outcome::Waiting {
                question: "A or B?".into(),
                session_id: "ses_1".into(),
                result: None,
                ask: None,
            },
        )
        .unwrap();
    assert_eq!(store.cancel(w).unwrap().status, TaskStatus::Cancelled);
}

fn question_answer_resumes_the_same_session_without_using_an_attempt(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let c = claim(&store).unwrap();
    assert!(c.resume.is_none());
    let t = store
        .finish(
            id,
            c.token,
            Outcome::Waiting {
                question: "Which DB?".into(),
                session_id: "ses_9".into(),
                result: None,
                ask: None,
            },
        )
        .unwrap();
    assert_eq!(t.status, TaskStatus::Waiting);
    assert_eq!(t.question.as_deref(), Some("Which DB?"));
    assert!(claim(&store).is_none(), "a waiting task is not runnable");

    store.add_note(id, "remember the migration").unwrap();
    let t = store.answer(id, "Postgres", "test").unwrap();
    assert_eq!(t.status, TaskStatus::Queued);
    assert_eq!(t.questions.len(), 1);
    assert_eq!(t.questions[0].answer.as_deref(), Some("Postgres"));

    let c = claim(&store).unwrap();
    assert_eq!(
        c.resume,
        Some(Resume { session_id: "ses_9".into(), answer: "Postgres".into(), ask: None })
    );
    assert_eq!(c.new_notes, vec!["remember the migration".to_string()]);
    assert_eq!(c.task.attempts, 1, "resuming is the same attempt");
    // A second round works the same way.
    store
        .finish(
            id,
            c.token,
            Outcome::Waiting {
                question: "Index?".into(),
                session_id: "ses_9".into(),
                result: None,
                ask: None,
            },
        )
        .unwrap();
    store.answer(id, "yes", "test").unwrap();
    let c = claim(&store).unwrap();
    assert_eq!(c.resume.unwrap().answer, "yes");
    assert_eq!(store.get(id).unwrap().questions.len(), 2);
}

fn failed_attempt_is_retried_with_backoff_then_fails(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let c = claim(&store).unwrap();
    let t = store
        .finish(
            id,
            c.token,
            Outcome::Failed {
                error: "API 500".into(),
                kind: FailureKind::Provider,
                result: None,
                backoff_s: 3600.0,
            },
        )
        .unwrap();
    assert_eq!(t.status, TaskStatus::Queued);
    assert_eq!(t.error.as_deref(), Some("API 500"));
    assert!(claim(&store).is_none(), "the backoff delays the retry");

    let id2 = submit(&store, "b");
    let c = claim(&store).unwrap();
    assert_eq!(c.task.id, id2);
    store
        .finish(
            id2,
            c.token,
            Outcome::Failed {
                error: "e1".into(),
                kind: FailureKind::Exit,
                result: None,
                backoff_s: 0.0,
            },
        )
        .unwrap();
    let c = claim(&store).unwrap();
    assert_eq!(c.task.attempts, 2);
    let t = store
        .finish(
            id2,
            c.token,
            Outcome::Failed {
                error: "e2".into(),
                kind: FailureKind::Timeout,
                result: None,
                backoff_s: 0.0,
            },
        )
        .unwrap();
    assert_eq!(t.status, TaskStatus::Failed, "max_attempts 2 is used up");
    assert_eq!(t.error.as_deref(), Some("e2"));

    let t = store.retry(id2).unwrap();
    assert_eq!((t.status, t.attempts, t.error), (TaskStatus::Queued, 0, None));
}

fn dependency_failure_propagates_transitively_and_retry_revives_the_chain(b: Backend) {
    let (_d, store) = open(b);
    let a = submit(&store, "a");
    let mut s = spec("b");
    s.depends_on = vec![DepRef::Task(a)];
    let b = store.submit(s).unwrap().0.id;
    let mut s = spec("c");
    s.depends_on = vec![DepRef::Task(b)];
    let c_id = store.submit(s).unwrap().0.id;
    assert_eq!(store.get(b).unwrap().display_status, "blocked");

    let c = claim(&store).unwrap();
    assert_eq!(c.task.id, a, "blocked tasks are not claimed");
    store
        .finish(
            a,
            c.token,
            Outcome::FailedPermanently {
                error: "boom".into(),
                kind: FailureKind::Launch,
                result: None,
            },
        )
        .unwrap();
    let tb = store.get(b).unwrap();
    let tc = store.get(c_id).unwrap();
    assert_eq!(tb.status, TaskStatus::Failed);
    assert_eq!(tb.error.as_deref(), Some(format!("dependency task {} failed", a.0).as_str()));
    assert_eq!(tc.status, TaskStatus::Failed);
    assert_eq!(tc.error.as_deref(), Some(format!("dependency task {} failed", b.0).as_str()));

    let err = store.retry(b).unwrap_err().to_string();
    assert!(err.contains(&format!("retry task {}", a.0)), "{err}");
    store.retry(a).unwrap();
    assert_eq!(store.get(b).unwrap().display_status, "blocked");
    assert_eq!(store.get(c_id).unwrap().status, TaskStatus::Queued);
}

fn cancelling_a_dependency_fails_its_dependents_with_its_name(b: Backend) {
    let (_d, store) = open(b);
    let a = submit(&store, "a");
    let mut s = spec("b");
    s.depends_on = vec![DepRef::Task(a)];
    let b = store.submit(s).unwrap().0.id;
    store.cancel(a).unwrap();
    let t = store.get(b).unwrap();
    assert_eq!(t.status, TaskStatus::Failed);
    assert_eq!(t.error.unwrap(), format!("dependency task {} was cancelled", a.0));
}

fn idempotent_submit_returns_the_first_task(b: Backend) {
    let (_d, store) = open(b);
    let mut s = spec("a");
    s.request_id = Some("req-1".into());
    let (first, created) = store.submit(s.clone()).unwrap();
    assert!(created);
    s.prompt = "different".into();
    let (again, created) = store.submit(s).unwrap();
    assert!(!created);
    assert_eq!(again.id, first.id);
    assert_eq!(again.prompt, "a");
    assert_eq!(store.list(&ListFilter::default()).unwrap().len(), 1);
}

fn bad_input_is_refused_with_a_message_naming_the_problem(b: Backend) {
    let (_d, store) = open(b);
    let cases: Vec<(TaskSpec, &str)> = vec![
        (spec("   "), "prompt: it is empty"),
        (spec(&"x".repeat(MAX_PROMPT_BYTES + 1)), "limit is 262144"),
        (
            {
                let mut s = spec("a");
                s.priority = 101;
                s
            },
            "priority: 101 is out of range",
        ),
        (
            {
                let mut s = spec("a");
                s.priority = -101;
                s
            },
            "-100 to 100",
        ),
        (
            {
                let mut s = spec("a");
                s.depends_on = vec![DepRef::Task(TaskId(42))];
                s
            },
            "task 42 does not exist",
        ),
        (
            {
                let mut s = spec("a");
                s.repo = "relative/path".into();
                s
            },
            "not an absolute path",
        ),
        (
            {
                let mut s = spec("a");
                s.model = Some("sonnet".into());
                s
            },
            "provider/model",
        ),
        (
            {
                let mut s = spec("a");
                s.max_attempts = 0;
                s
            },
            "max_attempts",
        ),
        (
            {
                let mut s = spec("a");
                s.timeout_s = 0;
                s
            },
            "timeout_s",
        ),
    ];
    for (s, expected) in cases {
        let err = store.submit(s).unwrap_err().to_string();
        assert!(err.contains(expected), "expected '{expected}' in '{err}'");
    }
    assert!(store.list(&ListFilter::default()).unwrap().is_empty(), "nothing was written");
    let err = store.get(TaskId(7)).unwrap_err().to_string();
    assert!(err.contains("task #7 does not exist"), "{err}");
}

fn a_batch_with_a_cycle_is_refused_whole(b: Backend) {
    let (_d, store) = open(b);
    let mut a = spec("a");
    a.depends_on = vec![DepRef::Batch(2)];
    let mut b = spec("b");
    b.depends_on = vec![DepRef::Batch(0)];
    let mut c = spec("c");
    c.depends_on = vec![DepRef::Batch(1)];
    let err = store.submit_batch(vec![a, b, c]).unwrap_err();
    assert!(matches!(err, Error::DependencyCycle(_)));
    assert!(err.to_string().contains("#0 -> #2 -> #1 -> #0"), "{err}");
    let mut selfdep = spec("self");
    selfdep.depends_on = vec![DepRef::Batch(0)];
    assert!(matches!(store.submit_batch(vec![selfdep]), Err(Error::DependencyCycle(_))));
    assert!(store.list(&ListFilter::default()).unwrap().is_empty());

    let mut b = spec("b");
    b.depends_on = vec![DepRef::Batch(0)];
    let out = store.submit_batch(vec![spec("a"), b]).unwrap();
    assert_eq!(out[1].0.depends_on, vec![out[0].0.id]);
}

fn expired_lease_requeues_then_fails_and_stale_completion_is_rejected(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let c1 = store.claim_next("w1", "host", Duration::from_millis(1)).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let reaped = store.reap_expired().unwrap();
    assert_eq!(reaped.len(), 1);
    assert!(reaped[0].requeued);
    let c2 = store.claim_next("w2", "host", Duration::from_millis(1)).unwrap().unwrap();
    assert!(c2.token > c1.token);
    assert!(matches!(store.finish(id, c1.token, done()), Err(Error::StaleLease { .. })));
    assert!(matches!(store.heartbeat(id, c1.token, LEASE), Err(Error::StaleLease { .. })));
    std::thread::sleep(Duration::from_millis(20));
    let reaped = store.reap_expired().unwrap();
    assert!(!reaped[0].requeued, "two attempts are used up");
    let t = store.get(id).unwrap();
    assert_eq!(t.status, TaskStatus::Failed);
    assert!(t.error.unwrap().contains("lease expired"));
}

fn question_timeout_fails_a_waiting_task(b: Backend) {
    let (_d, store) = open(b);
    let mut s = spec("a");
    s.question_timeout_s = Some(1);
    let id = store.submit(s).unwrap().0.id;
    let c = claim(&store).unwrap();
    store
        .finish(
            id,
            c.token,
            Outcome::Waiting {
                question: "q".into(),
                session_id: "s".into(),
                result: None,
                ask: None,
            },
        )
        .unwrap();
    assert_eq!(store.reap_expired().unwrap(), []);
    assert_eq!(store.get(id).unwrap().status, TaskStatus::Waiting);
    std::thread::sleep(Duration::from_millis(1100));
    let reaped = store.reap_expired().unwrap();
    assert_eq!(reaped, [Reaped { id, requeued: false, question_timed_out: true }]);
    let t = store.get(id).unwrap();
    assert_eq!(t.status, TaskStatus::Failed);
    assert!(t.error.unwrap().contains("not answered within 1 s"));
}

fn clear_under_roots_leaves_other_repositories_alone(b: Backend) {
    let (_d, store) = open(b);
    let inside = submit(&store, "inside");
    let base = "0123456789abcdef0123456789abcdef01234567";
    let beside = store.submit(TaskSpec::new("beside", "/tmp/repo-two", base)).unwrap().0.id;
    let below = store.submit(TaskSpec::new("below", "/tmp/repo/sub", base)).unwrap().0.id;
    for id in [inside, beside, below] {
        store.cancel(id).unwrap();
    }
    let cleared =
        store.clear_finished(0.0, &[TaskStatus::Cancelled], &["/tmp/repo".to_owned()]).unwrap();
    let mut ids: Vec<TaskId> = cleared.iter().map(|t| t.id).collect();
    ids.sort();
    assert_eq!(ids, vec![inside, below], "/tmp/repo-two is not under /tmp/repo");
    assert!(store.get(beside).is_ok());
}

fn clear_removes_only_finished_tasks(b: Backend) {
    let (_d, store) = open(b);
    let a = submit(&store, "a");
    let b = submit(&store, "b");
    store.cancel(a).unwrap();
    let cleared = store
        .clear_finished(0.0, &[TaskStatus::Cancelled, TaskStatus::Done, TaskStatus::Failed], &[])
        .unwrap();
    assert_eq!(cleared.iter().map(|t| t.id).collect::<Vec<_>>(), vec![a]);
    assert!(store.get(b).is_ok());
    assert!(store.clear_finished(0.0, &[TaskStatus::Queued], &[]).is_err());
    assert!(store.clear_finished(3600.0, &[TaskStatus::Done], &[]).unwrap().is_empty());
}

fn status_counts_blocked_apart_from_queued(b: Backend) {
    let (_d, store) = open(b);
    let a = submit(&store, "a");
    let mut s = spec("b");
    s.depends_on = vec![DepRef::Task(a)];
    store.submit(s).unwrap();
    let st = store.queue_status().unwrap();
    assert_eq!(st.counts["queued"], 1);
    assert_eq!(st.counts["blocked"], 1);
    assert_eq!(st.total, 2);
}

#[test]
fn sqlite_database_and_home_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home")).unwrap();
    home.ensure().unwrap();
    let _store = Store::open(home.db_path()).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(home.root()), 0o700);
    assert_eq!(mode(&home.db_path()), 0o600);
    assert_eq!(mode(&home.logs_dir()), 0o700);
}

fn a_database_from_a_newer_build_is_refused(b: Backend) {
    let d = Db::new(b);
    drop(d.open());
    match &d.location {
        Location::Sqlite(path) => set_user_version(path, 99),
        Location::Postgres(_) => {
            let mut c =
                ::postgres::Client::connect(&support::pg_server(), ::postgres::NoTls).unwrap();
            let schema = d.arg.split("schema=").nth(1).unwrap();
            c.batch_execute(&format!("INSERT INTO \"{schema}\".schema_version VALUES (99)"))
                .unwrap();
        }
    }
    let err = Store::connect(&d.location).err().unwrap().to_string();
    assert!(err.contains("newer TaskBridge") && err.contains("schema 99"), "{err}");
}

fn set_user_version(path: &std::path::Path, v: i64) {
    // The database header keeps user_version at byte offset 60 (sqlite.org/fileformat.html).
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(60)).unwrap();
    f.write_all(&(v as u32).to_be_bytes()).unwrap();
}

// ---- claim order, as a property -----------------------------------------------------------

/// The model: runnable = not finished and all deps finished; pick max priority, min id.
fn claims_follow_priority_then_age(
    b: Backend,
    items: &[(i64, Vec<usize>)],
) -> Result<(), proptest::test_runner::TestCaseError> {
    let (_d, store) = open(b);
    // Only backward references, so the graph is acyclic.
    let mut ids: Vec<TaskId> = Vec::new();
    let mut deps_of: Vec<Vec<TaskId>> = Vec::new();
    for (i, (prio, deps)) in items.iter().enumerate() {
        let mut s = spec(&format!("t{i}"));
        s.priority = *prio;
        let d: Vec<TaskId> = deps
            .iter()
            .filter(|&&j| j < i)
            .map(|&j| ids[j])
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        s.depends_on = d.iter().map(|&t| DepRef::Task(t)).collect();
        ids.push(store.submit(s).unwrap().0.id);
        deps_of.push(d);
    }
    let mut finished: HashSet<TaskId> = HashSet::new();
    while let Some(c) = claim(&store) {
        // The model: runnable = not finished and all deps finished; pick max priority, min id.
        let expected = ids
            .iter()
            .enumerate()
            .filter(|(i, id)| {
                !finished.contains(id) && deps_of[*i].iter().all(|d| finished.contains(d))
            })
            .max_by(|(i, a), (j, b)| items[*i].0.cmp(&items[*j].0).then(b.cmp(a)))
            .map(|(_, id)| *id);
        prop_assert_eq!(Some(c.task.id), expected);
        store.finish(c.task.id, c.token, done()).unwrap();
        finished.insert(c.task.id);
    }
    prop_assert_eq!(finished.len(), ids.len());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn claims_follow_priority_then_age_and_respect_dependencies_sqlite(
        items in proptest::collection::vec((-3i64..=3, proptest::collection::vec(0usize..12, 0..3)), 1..12)
    ) {
        claims_follow_priority_then_age(Backend::Sqlite, &items)?;
    }

    #[test]
    fn claims_follow_priority_then_age_and_respect_dependencies_postgres(
        items in proptest::collection::vec((-3i64..=3, proptest::collection::vec(0usize..12, 0..3)), 1..12)
    ) {
        claims_follow_priority_then_age(Backend::Postgres, &items)?;
    }
}

// ---- several processes --------------------------------------------------------------------

/// A child process of its test: see `support::child`.
fn claimer(db: &str) {
    let store = Store::connect(&Location::parse(db).unwrap()).unwrap();
    let me = format!("w{}", std::process::id());
    let mut idle = 0;
    while idle < 200 {
        match store.claim_next(&me, "host", LEASE).unwrap() {
            Some(c) => {
                idle = 0;
                println!("CLAIMED {}", c.task.id.0);
                store.finish(c.task.id, c.token, done()).unwrap();
            }
            None => {
                idle += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

fn four_processes_never_claim_a_task_twice(b: Backend) {
    if let Some(db) = child_db() {
        return claimer(&db);
    }
    let (d, store) = open(b);
    let db = d.arg.clone();
    let n = 400;
    for i in 0..n {
        store.submit(spec(&format!("t{i}"))).unwrap();
    }
    let kids: Vec<_> = (0..4).map(|_| child(&db).stdout(Stdio::piped()).spawn().unwrap()).collect();
    let mut claimed = Vec::new();
    let mut per_process = Vec::new();
    for kid in kids {
        let out = kid.wait_with_output().unwrap();
        assert!(out.status.success());
        let ids: Vec<i64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            // The harness prints "test <name> ... " without a newline before the first line.
            .filter_map(|l| l.split_once("CLAIMED ").map(|(_, s)| s.parse().unwrap()))
            .collect();
        per_process.push(ids.len());
        claimed.extend(ids);
    }
    let unique: HashSet<_> = claimed.iter().collect();
    assert_eq!(unique.len(), claimed.len(), "a task was claimed twice");
    assert_eq!(claimed.len(), n, "every task was claimed once: {per_process:?}");
    // The claims really raced: more than one process won some.
    let winners = per_process.iter().filter(|&&c| c > 0).count();
    assert!(winners >= 2, "only one process claimed anything: {per_process:?}");
    let st = store.queue_status().unwrap();
    assert_eq!(st.counts["done"], n as i64);
}

/// A child process of its test: see `support::child`.
fn submitter(db: &str) {
    let store = Store::connect(&Location::parse(db).unwrap()).unwrap();
    for i in 0.. {
        let (t, _) = store.submit(spec(&format!("burst {i}"))).unwrap();
        // Printed only after submit returned: an acknowledged task.
        println!("ACK {}", t.id.0);
    }
}

fn kill_9_during_submits_loses_no_acknowledged_task(b: Backend) {
    if let Some(db) = child_db() {
        return submitter(&db);
    }
    let (d, store) = open(b);
    drop(store);
    let db = d.arg.clone();
    let mut kid = child(&db).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(kid.stdout.take().unwrap()).lines();
    let mut acked = Vec::new();
    while acked.len() < 150 {
        let line = lines.next().unwrap().unwrap();
        if let Some((_, id)) = line.split_once("ACK ") {
            acked.push(id.parse::<i64>().unwrap());
        }
    }
    kid.kill().unwrap(); // SIGKILL
    kid.wait().unwrap();
    for line in lines.map_while(Result::ok) {
        if let Some((_, id)) = line.split_once("ACK ") {
            acked.push(id.parse::<i64>().unwrap());
        }
    }
    let store = d.open();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    for id in &acked {
        store.get(TaskId(*id)).unwrap_or_else(|e| panic!("acknowledged task {id} lost: {e}"));
    }
}

#[test]
fn sqlite_another_process_commit_is_noticed_by_each_watch_layer_alone() {
    if let Some(db) = child_db() {
        return submit_once(&db);
    }
    // The file watch alone, then the poll alone: each must see a commit made by another
    // process, so neither can hide a broken other.
    for (file_watch, poll) in [(true, false), (false, true)] {
        let (d, store) = open(Backend::Sqlite);
        let (tx, rx) = std::sync::mpsc::channel();
        let _w = ChangeWatcher::with_layers(store.path().unwrap(), file_watch, poll, move || {
            let _ = tx.send(());
        })
        .unwrap();
        let out = child(&d.arg).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("not noticed (file watch {file_watch}, poll {poll})"));
        assert_eq!(store.get(TaskId(1)).unwrap().prompt, "from another process");
    }
}

#[test]
fn sqlite_the_file_watch_calls_back_once_the_commit_can_be_read() {
    // The file watch alone, so that a call made before a commit can be read is not rescued by
    // the poll (whose next tick is a quarter of a second away): a waiter woken by it reads the
    // database at once, and must find what was committed, commit after commit.
    let (d, store) = open(Backend::Sqlite);
    let (tx, rx) = std::sync::mpsc::channel();
    let _w = ChangeWatcher::with_layers(store.path().unwrap(), true, false, move || {
        let _ = tx.send(());
    })
    .unwrap();
    let (go, turns) = std::sync::mpsc::channel::<()>();
    let writer = d.open();
    let rounds = 50;
    let writing = std::thread::spawn(move || {
        for i in 0..rounds {
            writer.submit(spec(&format!("commit {i}"))).unwrap();
            if turns.recv().is_err() {
                return;
            }
        }
    });
    for i in 1..=rounds {
        loop {
            rx.recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("commit {i} was never readable after a call"));
            if store.get(TaskId(i)).is_ok() {
                break;
            }
        }
        go.send(()).unwrap();
    }
    writing.join().unwrap();
}

#[test]
fn sqlite_the_file_watch_alone_where_it_cannot_watch_is_an_error_not_silence() {
    // Asked for the file watch without the poll, a watcher that cannot set the watch up (here:
    // the database's directory does not exist) must say so, not hand back a watcher that will
    // never call.
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone").join("queue.db");
    let err = ChangeWatcher::with_layers(&gone, true, false, || {}).err().expect("an error");
    assert!(err.to_string().contains("no file watch here; use the poll"), "{err}");
}

#[test]
fn sqlite_a_dropped_watch_calls_nobody() {
    // Each layer alone: heard while it watches, and once dropped a commit made after calls
    // nobody. A watch that went on would keep its thread and its connection for the life of the
    // process (the worker drops one each time it stops).
    for (file_watch, poll) in [(true, false), (false, true)] {
        let (d, store) = open(Backend::Sqlite);
        let (tx, rx) = std::sync::mpsc::channel();
        let watch =
            ChangeWatcher::with_layers(store.path().unwrap(), file_watch, poll, move || {
                let _ = tx.send(());
            })
            .unwrap();
        let writer = d.open();
        writer.submit(spec("while watched")).unwrap();
        // Waited for, not timed: the bound only keeps a watch that never calls from hanging
        // the suite (a loaded machine took over 5 s here).
        rx.recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("not heard while watched (file watch {file_watch})"));
        drop(watch);
        // A thread that looked at the flag just before the drop may still call once: a moment
        // for each to look again (the poll every 20 ms; the file watch, still following the
        // first commit, every millisecond).
        std::thread::sleep(Duration::from_millis(50));
        // What was called before the drop (opening the writer may commit too) is not late.
        while rx.try_recv().is_ok() {}
        writer.submit(spec("after the drop")).unwrap();
        let late = rx.recv_timeout(Duration::from_millis(500));
        assert!(late.is_err(), "called after being dropped (file watch {file_watch})");
    }
}

/// A child process of its test: see `support::child`.
fn submit_once(db: &str) {
    let store = Store::connect(&Location::parse(db).unwrap()).unwrap();
    store.submit(spec("from another process")).unwrap();
}

#[test]
fn postgres_another_process_commit_is_noticed_by_notify_and_by_the_poll_alone() {
    if let Some(db) = child_db() {
        return submit_once(&db);
    }
    // LISTEN/NOTIFY, then listen=off (the poll alone): each must see a commit made by another
    // process. With the listener the poll is a minute apart (the longest allowed), longer than
    // the wait, so only a notification can wake the watcher within it.
    for params in ["&poll_ms=60000", "&listen=off&poll_ms=100"] {
        let d = Db::with_params(Backend::Postgres, params);
        let store = d.open();
        let (tx, rx) = std::sync::mpsc::channel();
        let _w = ChangeWatcher::spawn(&store, move || {
            let _ = tx.send(std::time::Instant::now());
        })
        .unwrap();
        // The listener's first call, made once it is connected (and after every reconnect).
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let started = std::time::Instant::now();
        let out = child(&d.arg).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let seen = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(seen >= started);
        assert_eq!(store.get(TaskId(1)).unwrap().prompt, "from another process");
    }
}

#[test]
fn sqlite_a_database_from_the_first_schema_opens_and_keeps_its_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    // A database as the first release wrote it: schema 1 only, with a task waiting on a question.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(include_str!("../migrations/0001_init.sql")).unwrap();
    conn.execute_batch(
        "PRAGMA user_version = 1;
         INSERT INTO tasks (title, prompt, repo, base, status, question, session_id, created_at,
            updated_at) VALUES ('old', 'written by schema 1', '/r', 'abc', 'waiting', 'A or B?',
            'ses_1', 1.0, 1.0);
         INSERT INTO task_questions (task_id, question, asked_at) VALUES (1, 'A or B?', 1.0);",
    )
    .unwrap();
    drop(conn);

    let store = Store::open(&path).unwrap();
    let t = store.get(TaskId(1)).unwrap();
    assert_eq!(t.prompt, "written by schema 1");
    assert_eq!(t.question.as_deref(), Some("A or B?"));
    assert_eq!(t.ask, None, "a prompt-level question has no structured decision");
    assert!(t.ask_rules.is_empty() && !t.budget.is_set());
    // What the later schemas added works on it.
    let job = store.job_submit(&serde_json::json!({"prompt": "hi"}), &owner(1)).unwrap();
    assert_eq!(store.job(job.id).unwrap().status, JobStatus::Queued);
    store.register_worker("w1", 1, "host", 2, "opencode serve").unwrap();
    assert_eq!(store.list_workers().unwrap()[0].agent.as_deref(), Some("opencode serve"));
    let t = store.answer(TaskId(1), "A", "cli").unwrap();
    assert_eq!(t.status, TaskStatus::Queued);
    assert_eq!(t.questions.last().unwrap().answered_by.as_deref(), Some("cli"));
}

#[test]
fn sqlite_spend_written_before_it_had_columns_still_counts_after_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    // Schema 8: the spend was only in the result's JSON.
    let conn = rusqlite::Connection::open(&path).unwrap();
    for m in [
        include_str!("../migrations/0001_init.sql"),
        include_str!("../migrations/0002_claude_jobs.sql"),
        include_str!("../migrations/0003_worker_agent.sql"),
        include_str!("../migrations/0004_decisions.sql"),
        include_str!("../migrations/0005_plans.sql"),
        include_str!("../migrations/0006_remote.sql"),
        include_str!("../migrations/0007_orphans.sql"),
        include_str!("../migrations/0008_worker_agents.sql"),
    ] {
        conn.execute_batch(m).unwrap();
    }
    conn.execute_batch(
        r#"PRAGMA user_version = 8;
         INSERT INTO tasks (title, prompt, repo, base, status, result, created_at, updated_at)
         VALUES ('old', 'p', '/r', 'abc', 'done',
                 '{"summary":"ok","usage":{"input_tokens":30,"output_tokens":12,"cost_usd":0.25}}',
                 1.0, unixepoch('subsec')),
                ('unknown cost', 'p', '/r', 'abc', 'failed',
                 '{"usage":{"input_tokens":5,"output_tokens":3,"cost_usd":null}}',
                 1.0, unixepoch('subsec'));"#,
    )
    .unwrap();
    drop(conn);

    let store = Store::open(&path).unwrap();
    let spend = store.queue_status().unwrap().spend_today;
    assert_eq!((spend.cost_usd, spend.tokens), (0.25, 50));
    let old = store.get(TaskId(1)).unwrap().result.unwrap();
    assert_eq!((old.summary.as_str(), old.usage.cost_usd), ("ok", Some(0.25)));
    assert!(!store.get(TaskId(2)).unwrap().result.unwrap().cost_known());
}

fn owner(pid: i64) -> JobOwner {
    JobOwner { host: "host".into(), pid, started: Some("42".into()) }
}

fn jobs_run_queued_running_done_and_finished_jobs_never_change(b: Backend) {
    let (_d, store) = open(b);
    let req = serde_json::json!({"prompt": "review this plan"});
    let job = store.job_submit(&req, &owner(7)).unwrap();
    assert_eq!((job.status, job.request.clone()), (JobStatus::Queued, req));
    let running = store.job_start(job.id).unwrap().unwrap();
    assert_eq!(running.status, JobStatus::Running);
    assert!(running.started_at.is_some());
    let done = store
        .job_finish(job.id, JobOutcome::Done(serde_json::json!({"text": "looks good"})))
        .unwrap()
        .unwrap();
    assert_eq!(done.status, JobStatus::Done);
    assert_eq!(done.result.unwrap()["text"], "looks good");

    let err = store.job_cancel(job.id).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("job {} is done; cancel needs a job that is queued or running", job.id)
    );
    assert!(store.job_start(job.id).unwrap().is_none());
    let err = store.job_finish(job.id, JobOutcome::Failed("late".into())).unwrap_err();
    assert!(err.to_string().contains("finish needs a job that is running"), "{err}");
    assert_eq!(store.job(job.id).unwrap().status, JobStatus::Done);

    let err = store.job(JobId(999)).unwrap_err();
    assert!(err.is_user_error());
    assert!(err.to_string().contains("job 999 does not exist"), "{err}");
}

fn a_cancelled_job_keeps_its_state_when_its_runner_reports_late(b: Backend) {
    let (_d, store) = open(b);
    let queued = store.job_submit(&serde_json::json!({}), &owner(7)).unwrap();
    let running = store.job_submit(&serde_json::json!({}), &owner(7)).unwrap();
    store.job_start(running.id).unwrap();
    for id in [queued.id, running.id] {
        assert_eq!(store.job_cancel(id).unwrap().status, JobStatus::Cancelled);
    }
    // The runner of the queued job must not start it; the running one's answer is dropped.
    assert!(store.job_start(queued.id).unwrap().is_none());
    let late = store.job_finish(running.id, JobOutcome::Done(serde_json::json!({}))).unwrap();
    assert!(late.is_none());
    assert_eq!(store.job(running.id).unwrap().status, JobStatus::Cancelled);
    let counts = store.job_counts().unwrap();
    assert_eq!(counts["cancelled"], 2);
    assert_eq!(counts["running"], 0);
}

fn jobs_of_a_dead_owner_are_failed_as_interrupted_and_live_ones_are_left_alone(b: Backend) {
    let (_d, store) = open(b);
    let dead = store.job_submit(&serde_json::json!({}), &owner(100)).unwrap();
    store.job_start(dead.id).unwrap();
    let dead_queued = store.job_submit(&serde_json::json!({}), &owner(100)).unwrap();
    let live = store.job_submit(&serde_json::json!({}), &owner(200)).unwrap();
    store.job_start(live.id).unwrap();
    let elsewhere = store
        .job_submit(
            &serde_json::json!({}),
            &JobOwner { host: "other".into(), pid: 100, started: None },
        )
        .unwrap();

    let ids = store.interrupt_orphaned_jobs("host", |pid, started| {
        assert_eq!(started, Some("42"));
        pid == 200
    });
    assert_eq!(ids.unwrap(), vec![dead.id, dead_queued.id]);
    let job = store.job(dead.id).unwrap();
    assert_eq!(job.status, JobStatus::Failed);
    assert!(job.error.unwrap().starts_with("interrupted: the bridge process running it (pid 100)"));
    assert_eq!(store.job(live.id).unwrap().status, JobStatus::Running);
    assert_eq!(store.job(elsewhere.id).unwrap().status, JobStatus::Queued);
}

/// A child process of its test: see `support::child`.
fn opener(db: &str) {
    let store = Store::connect(&Location::parse(db).unwrap()).unwrap();
    store.submit(spec("opened")).unwrap();
}

/// Several hosts (here processes) starting at once against a new database (a new schema on
/// PostgreSQL, whose migrations run under an advisory lock) all open it.
fn several_processes_creating_the_database_at_once_all_open_it(b: Backend) {
    if let Some(db) = child_db() {
        return opener(&db);
    }
    for _ in 0..if b == Backend::Sqlite { 10 } else { 3 } {
        let d = Db::new(b);
        let children: Vec<_> =
            (0..5).map(|_| child(&d.arg).stdout(Stdio::null()).spawn().unwrap()).collect();
        for mut c in children {
            assert!(c.wait().unwrap().success(), "a process could not open the new database");
        }
        assert_eq!(d.open().list(&ListFilter::default()).unwrap().len(), 5);
    }
}

fn wait_with(store: &Store, id: TaskId, token: i64, ask: Ask) -> Task {
    let outcome = Outcome::Waiting {
        question: ask.text(),
        session_id: "ses_1".into(),
        result: None,
        ask: Some(Box::new(ask)),
    };
    store.finish(id, token, outcome).unwrap()
}

fn permission() -> Ask {
    let mut ask = Ask::permission(PermissionAsk {
        permission: "bash".into(),
        patterns: vec!["git push".into()],
        target: Some("git push".into()),
        always: vec!["git push *".into()],
    });
    ask.request_id = Some("per_1".into());
    ask
}

fn an_agent_blocked_in_a_live_workers_server_is_resumed_by_that_worker_only(b: Backend) {
    let (_d, store) = open(b);
    store.register_worker("w1", 1, "host", 1, "opencode serve").unwrap();
    store.register_worker("w2", 2, "host", 1, "opencode serve").unwrap();
    let id = submit(&store, "a");
    let c = claim(&store).unwrap();
    let t = wait_with(&store, id, c.token, permission());
    assert_eq!(t.ask.as_ref().unwrap().kind, AskKind::Permission);
    assert_eq!(t.ask.as_ref().unwrap().choices, ["once", "always", "reject"]);
    store.answer(id, "once", "cli").unwrap();
    assert!(store.claim_next("w2", "host", LEASE).unwrap().is_none(), "w1's server holds it");
    let c = claim(&store).unwrap();
    let resume = c.resume.unwrap();
    assert_eq!(resume.answer, "once");
    assert_eq!(resume.ask.unwrap().request_id.as_deref(), Some("per_1"));

    // Parked again; w1 stops: anyone may resume it (with a new prompt).
    wait_with(&store, id, c.token, permission());
    store.worker_stopped("w1").unwrap();
    store.answer(id, "always", "tui").unwrap();
    let c = store.claim_next("w2", "host", LEASE).unwrap().unwrap();
    assert_eq!(c.resume.unwrap().answer, "always");
    let t = store.get(id).unwrap();
    let by: Vec<_> = t.questions.iter().map(|q| q.answered_by.clone().unwrap()).collect();
    assert_eq!(by, ["cli", "tui"]);
}

fn answers_are_checked_against_the_decision_they_answer(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let c = claim(&store).unwrap();
    wait_with(&store, id, c.token, permission());
    let err = store.answer(id, "maybe", "cli").unwrap_err().to_string();
    assert!(err.contains("once") && err.contains("reject: <what to do instead>"), "{err}");
    assert_eq!(
        store.get(id).unwrap().status,
        TaskStatus::Waiting,
        "a refused answer changes nothing"
    );
    store.answer(id, "Reject: use staging", "cli").unwrap();
}

fn budget_stop(limit: &str, spent: f64, max: f64) -> Ask {
    Ask::budget(BudgetStop { limit: limit.into(), scope: "task".into(), spent, max, original: max })
}

fn a_budget_stop_continues_raised_or_stops_naming_the_spend(b: Backend) {
    let (_d, store) = open(b);
    let mut s = spec("spend");
    s.budget = Budget { max_cost_usd: Some(0.5), max_tokens: None };
    let id = store.submit(s).unwrap().0.id;
    let c = claim(&store).unwrap();
    wait_with(&store, id, c.token, budget_stop("cost", 0.52, 0.5));
    let err = store.answer(id, "continue 0.40", "cli").unwrap_err().to_string();
    assert!(err.contains("not above what is already spent"), "{err}");
    store.answer(id, "continue", "cli").unwrap();
    assert_eq!(store.get(id).unwrap().budget.max_cost_usd, Some(1.0), "raised by the original");
    let c = claim(&store).unwrap();
    wait_with(&store, id, c.token, budget_stop("cost", 1.01, 1.0));
    store.answer(id, "continue $2.50", "mcp:claude").unwrap();
    assert_eq!(store.get(id).unwrap().budget.max_cost_usd, Some(2.5));
    let c = claim(&store).unwrap();
    wait_with(&store, id, c.token, budget_stop("cost", 2.6, 2.5));
    let t = store.answer(id, "stop", "tui").unwrap();
    assert_eq!(t.status, TaskStatus::Failed);
    let e = t.error.unwrap();
    assert!(e.contains("$2.60 of $2.50") && e.contains("task budget") && e.contains("tui"), "{e}");
    // Counted as a budget stop where failures are counted by kind (the TUI's stats).
    let recent = store.finished_within(Duration::from_secs(3600)).unwrap();
    let kinds: Vec<_> = recent.tasks.iter().map(|t| (t.id, t.failure_kind)).collect();
    assert_eq!(kinds, vec![(id, Some(FailureKind::Budget))]);
}

fn a_batch_budget_counts_what_the_batchs_other_tasks_spent(b: Backend) {
    let (_d, store) = open(b);
    let shared = Budget { max_cost_usd: None, max_tokens: Some(300) };
    let tasks = store.submit_batch_budgeted(vec![spec("a"), spec("b")], shared).unwrap();
    let (a, b) = (tasks[0].0.id, tasks[1].0.id);
    let c = claim(&store).unwrap();
    assert_eq!(c.task.id, a);
    let usage =
        Usage { input_tokens: 200, output_tokens: 50, cost_usd: Some(0.1), ..Default::default() };
    let result = Box::new(TaskResult { usage, ..Default::default() });
    store.finish(a, c.token, Outcome::Done { result }).unwrap();
    let state = store.budget_of(b).unwrap();
    assert_eq!(state.batch.as_ref().unwrap().others_tokens, 250);
    assert_eq!(state.passed(0.0, 40), None);
    let stop = state.passed(0.0, 60).unwrap();
    assert_eq!((stop.scope.as_str(), stop.spent, stop.max), ("batch", 310.0, 300.0));
    // Continuing raises the batch's budget by its first amount, not the task's own.
    let c = claim(&store).unwrap();
    assert_eq!(c.task.id, b);
    wait_with(&store, b, c.token, Ask::budget(stop));
    store.answer(b, "continue", "cli").unwrap();
    let state = store.budget_of(b).unwrap();
    assert_eq!(state.batch.unwrap().budget.max_tokens, Some(600));
    assert_eq!(state.own.max_tokens, None);
    // Bad budgets and ask rules are refused before anything is stored.
    let mut bad = spec("x");
    bad.budget.max_cost_usd = Some(-1.0);
    assert!(store.submit(bad).unwrap_err().to_string().contains("max_cost_usd"));
    let mut bad = spec("x");
    bad.ask = vec!["shell:rm*".into()];
    let err = store.submit(bad).unwrap_err().to_string();
    assert!(err.contains("'shell:rm*' names no permission") && err.contains("bash"), "{err}");
}

fn an_answer_survives_a_resume_that_fails_and_its_attempt_still_counts(b: Backend) {
    let (_d, store) = open(b);
    let mut s = spec("a");
    s.max_attempts = 2;
    let id = store.submit(s).unwrap().0.id;
    let c = claim(&store).unwrap();
    let waiting = Outcome::Waiting {
        question: "Which?".into(),
        session_id: "ses_1".into(),
        result: None,
        ask: None,
    };
    store.finish(id, c.token, waiting).unwrap();
    store.answer(id, "this one", "cli").unwrap();
    let c = claim(&store).unwrap();
    assert_eq!(c.task.attempts, 1, "a resume does not count an attempt when it is claimed");
    let failed = Outcome::Failed {
        error: "rate limited".into(),
        kind: FailureKind::Provider,
        result: None,
        backoff_s: 0.0,
    };
    let t = store.finish(id, c.token, failed).unwrap();
    assert_eq!((t.status, t.attempts), (TaskStatus::Queued, 2), "the failed resume counted");
    let c = claim(&store).unwrap();
    assert_eq!(c.resume.unwrap().answer, "this one", "the answer is delivered again");
    let failed = Outcome::Failed {
        error: "rate limited".into(),
        kind: FailureKind::Provider,
        result: None,
        backoff_s: 0.0,
    };
    assert_eq!(store.finish(id, c.token, failed).unwrap().status, TaskStatus::Failed, "bounded");
}

/// Three submitters racing with one request id (each on its own connection, as three MCP
/// clients retrying would be) make one task; every one of them is given that task.
fn concurrent_duplicate_submits_make_one_task(b: Backend) {
    let (d, store) = open(b);
    let handles: Vec<Store> = (0..3).map(|_| d.open()).collect();
    for round in 0..10 {
        let key = format!("req-{round}");
        let barrier = std::sync::Barrier::new(handles.len());
        let results: Vec<(Task, bool)> = std::thread::scope(|s| {
            let joins: Vec<_> = handles
                .iter()
                .map(|h| {
                    let (barrier, key) = (&barrier, key.clone());
                    s.spawn(move || {
                        let mut sp = spec("the same change, sent three times");
                        sp.request_id = Some(key);
                        barrier.wait();
                        h.submit(sp).unwrap()
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let ids: HashSet<TaskId> = results.iter().map(|(t, _)| t.id).collect();
        assert_eq!(ids.len(), 1, "round {round}: {results:?}");
        assert_eq!(results.iter().filter(|(_, created)| *created).count(), 1, "round {round}");
    }
    assert_eq!(store.list(&ListFilter::default()).unwrap().len(), 10);
}

/// Once a lease has expired and the task was claimed again, nothing the old holder sends is
/// taken: not a heartbeat, facts about its run, a result, a returned note or a decision.
fn fencing_rejects_every_write_from_an_expired_lease(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let old = store.claim_next("w1", "host-a", Duration::from_millis(1)).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(store.reap_expired().unwrap().len(), 1);
    let new = store.claim_next("w2", "host-b", LEASE).unwrap().unwrap();
    assert_eq!(new.task.id, id);
    let stale = |r: Result<(), Error>| assert!(matches!(r, Err(Error::StaleLease { .. })), "{r:?}");
    stale(store.heartbeat(id, old.token, LEASE).map(|_| ()));
    stale(store.record_run(
        id,
        old.token,
        RunFacts { branch: Some("x".into()), ..Default::default() },
    ));
    stale(store.undeliver_notes(id, old.token, &["n".into()]));
    stale(store.record_decision(id, old.token, &permission(), "once", "rule"));
    stale(store.finish(id, old.token, done()).map(|_| ()));
    let t = store.get(id).unwrap();
    assert_eq!((t.status, t.worker.as_deref(), t.branch), (TaskStatus::Running, Some("w2"), None));
    store.heartbeat(id, new.token, LEASE).unwrap();
    assert_eq!(store.finish(id, new.token, done()).unwrap().status, TaskStatus::Done);
}

/// An answered question resumes the agent's session, which lives with the agent on the host
/// that ran it: while a worker lives on that host, workers elsewhere leave the task alone; a
/// follow-up goes to its parent's host the same way.
fn a_session_is_resumed_on_the_host_that_keeps_it_while_a_worker_lives_there(b: Backend) {
    let (_d, store) = open(b);
    store.register_worker("a1", 1, "host-a", 1, "opencode run").unwrap();
    store.register_worker("b1", 2, "host-b", 1, "opencode run").unwrap();
    let id = submit(&store, "a");
    let c = store.claim_next("a1", "host-a", LEASE).unwrap().unwrap();
    let outcome = Outcome::Waiting {
        question: "A or B?".into(),
        session_id: "ses_1".into(),
        result: None,
        ask: None,
    };
    store.finish(id, c.token, outcome).unwrap();
    store.answer(id, "A", "cli").unwrap();
    assert!(store.claim_next("b1", "host-b", LEASE).unwrap().is_none(), "host-a keeps ses_1");
    store.register_worker("a2", 3, "host-a", 1, "opencode run").unwrap();
    let c = store.claim_next("a2", "host-a", LEASE).unwrap().unwrap();
    assert_eq!(c.resume.unwrap().session_id, "ses_1");
    store.finish(id, c.token, done()).unwrap();

    let mut follow = spec("and now the tests");
    follow.parent = Some(id);
    follow.session_id = Some("ses_1".into());
    follow.session_host = Some("host-a".into());
    let f = store.submit(follow).unwrap().0.id;
    assert!(store.claim_next("b1", "host-b", LEASE).unwrap().is_none());
    // Nobody lives on host-a any more: the follow-up may run elsewhere rather than wait for a
    // host that may never return.
    store.worker_stopped("a1").unwrap();
    store.worker_stopped("a2").unwrap();
    assert_eq!(store.claim_next("b1", "host-b", LEASE).unwrap().unwrap().task.id, f);
}

fn a_task_for_another_agent_waits_for_a_worker_that_has_its_cli(b: Backend) {
    let (_d, store) = open(b);
    store.register_worker("plain", 1, "host-a", 1, "opencode serve").unwrap();
    store.worker_runs("plain", &["opencode"]).unwrap();
    store.register_worker("full", 2, "host-b", 1, "opencode serve").unwrap();
    store.worker_runs("full", &["opencode", "claude-code", "codex"]).unwrap();
    let mut s = spec("a hard refactor");
    s.agent = Some("claude-code".into());
    let claude = store.submit(s).unwrap().0.id;
    let opencode = submit(&store, "a quick fix");
    // The worker without Claude Code passes over it to what it can run.
    assert_eq!(store.claim_next("plain", "host-a", LEASE).unwrap().unwrap().task.id, opencode);
    assert!(store.claim_next("plain", "host-a", LEASE).unwrap().is_none());
    assert_eq!(store.claim_next("full", "host-b", LEASE).unwrap().unwrap().task.id, claude);
    let workers = store.list_workers().unwrap();
    let full = workers.iter().find(|w| w.id == "full").unwrap();
    assert_eq!(full.agents, ["opencode", "claude-code", "codex"]);
    // With no live worker that has the CLI, any worker takes the task, to fail it saying what
    // to install rather than leave it queued for good.
    let mut s = spec("a quick test");
    s.agent = Some("codex".into());
    let codex = store.submit(s).unwrap().0.id;
    store.worker_stopped("full").unwrap();
    assert_eq!(store.claim_next("plain", "host-a", LEASE).unwrap().unwrap().task.id, codex);
}

/// TLS to a remote database: `require` encrypts, `verify-full` also checks the server's
/// certificate against `sslrootcert` (and refuses a server signed by another CA), `disable`
/// does neither. The test server offers TLS with a throwaway CA (`.ci/pg`).
#[test]
fn postgres_tls_require_and_verify_full() {
    let dir = std::env::var("TASKBRIDGE_TEST_PG_DIR")
        .unwrap_or_else(|_| panic!("needs TASKBRIDGE_TEST_PG_DIR, the test server's directory"));
    let ca = std::path::Path::new(&dir).join("ca.pem");
    let mut admin = ::postgres::Client::connect(&support::pg_server(), ::postgres::NoTls).unwrap();
    let mut encrypted = |params: &str, app: &str| -> bool {
        let d = Db::with_params(Backend::Postgres, &format!("{params}&application_name={app}"));
        let store = d.open();
        store.submit(spec("over TLS or not")).unwrap();
        let row = admin
            .query_one(
                "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                  WHERE a.application_name = $1",
                &[&app],
            )
            .unwrap();
        row.get::<_, Option<bool>>(0).unwrap()
    };
    assert!(encrypted("&sslmode=require", "tb_tls_require"));
    assert!(encrypted(
        &format!("&sslmode=verify-full&sslrootcert={}", ca.display()),
        "tb_tls_full"
    ));
    assert!(!encrypted("&sslmode=disable", "tb_tls_off"));

    // Another CA: verify-full refuses the server and says why.
    let other = tempfile::tempdir().unwrap();
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-nodes", "-days", "1", "-subj", "/CN=someone else"])
        .arg("-keyout")
        .arg(other.path().join("k.pem"))
        .arg("-out")
        .arg(other.path().join("ca.pem"))
        .output()
        .unwrap();
    assert!(made.status.success());
    let d = Db::with_params(
        Backend::Postgres,
        &format!("&sslmode=verify-full&sslrootcert={}", other.path().join("ca.pem").display()),
    );
    let err = Store::connect(&d.location).err().unwrap().to_string();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

/// A lease reaped by a worker on another host leaves the agent's process to its own host: the
/// queue keeps it for the first worker there to ask, once.
fn orphans_wait_for_a_worker_on_their_own_host(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let c = store.claim_next("b1", "host-b", Duration::from_millis(1)).unwrap().unwrap();
    let facts =
        RunFacts { agent_pid: Some(4242), agent_started: Some("77".into()), ..Default::default() };
    store.record_run(id, c.token, facts).unwrap();
    // While it runs, its worker's agents are known by the worker's id (to kill before its
    // tasks are given back), and no other worker's are.
    let agent = Orphan { pid: 4242, started: Some("77".into()), task: Some(id) };
    assert_eq!(store.running_agents("b1").unwrap(), vec![agent.clone()]);
    assert!(store.running_agents("b2").unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(store.reap_expired().unwrap().len(), 1);
    assert!(store.running_agents("b1").unwrap().is_empty(), "no longer running");
    assert!(store.take_orphans("host-a").unwrap().is_empty());
    let orphans = store.take_orphans("host-b").unwrap();
    assert_eq!(orphans, vec![Orphan { pid: 4242, started: Some("77".into()), task: Some(id) }]);
    assert!(store.take_orphans("host-b").unwrap().is_empty(), "handed over once");
}

fn the_queue_counts_states_submissions_and_what_finished_with_its_timings(b: Backend) {
    let (_d, store) = open(b);
    let a = submit(&store, "a");
    let mut s = spec("b");
    s.depends_on = vec![DepRef::Task(a)];
    s.agent = Some("claude-code".into());
    let dep = store.submit(s).unwrap().0.id;
    let mut s = spec("c");
    s.agent = Some("opencode:plan".into());
    let c_id = store.submit(s).unwrap().0.id;
    let mut s = spec("d");
    s.agent = Some("codex".into());
    let d_id = store.submit(s).unwrap().0.id;
    let counts = store.counts().unwrap();
    let n = |st: TaskStatus| counts.by_status.iter().find(|(s, _)| *s == st).unwrap().1;
    assert_eq!((n(TaskStatus::Queued), n(TaskStatus::Running), n(TaskStatus::Done)), (4, 0, 0));
    assert_eq!(counts.by_status.len(), TaskStatus::ALL.len(), "every state is listed");
    let submitted = vec![("claude-code".into(), 1), ("codex".into(), 1), ("opencode".into(), 2)];
    assert_eq!(counts.submitted, submitted);

    let first = claim(&store).unwrap();
    assert_eq!(first.task.id, a);
    assert!(first.queue_wait_s >= 0.0 && first.queue_wait_s < 30.0, "{}", first.queue_wait_s);
    std::thread::sleep(Duration::from_millis(300));
    store.finish(a, first.token, done()).unwrap();
    // The dependent became ready when its dependency was done, not when it was submitted.
    std::thread::sleep(Duration::from_millis(200));
    let next = store.claim_next("w1", "host", LEASE).unwrap().unwrap();
    let waited_since_submit = next.task.started_at.unwrap() - next.task.created_at;
    assert_eq!(next.task.id, dep);
    assert!(next.queue_wait_s >= 0.15, "{}", next.queue_wait_s);
    assert!(
        next.queue_wait_s < waited_since_submit - 0.25,
        "{} vs {waited_since_submit}",
        next.queue_wait_s
    );
    let failed = Outcome::FailedPermanently {
        error: "no credentials".into(),
        kind: FailureKind::Auth,
        result: None,
    };
    store.finish(dep, next.token, failed).unwrap();
    store.cancel(c_id).unwrap();
    store.cancel(d_id).unwrap();

    let recent = store.finished_within(Duration::from_secs(3600)).unwrap();
    let ids: Vec<TaskId> = recent.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, vec![a, dep, c_id, d_id], "oldest first");
    assert_eq!(recent.tasks[3].agent, "codex");
    let (ta, tdep) = (&recent.tasks[0], &recent.tasks[1]);
    assert_eq!(
        (ta.agent.as_str(), ta.status, ta.failure_kind),
        ("opencode", TaskStatus::Done, None)
    );
    assert!(ta.run_s.unwrap() >= 0.25, "{:?}", ta.run_s);
    assert_eq!(tdep.agent, "claude-code");
    assert_eq!((tdep.status, tdep.failure_kind), (TaskStatus::Failed, Some(FailureKind::Auth)));
    assert!(recent.now >= tdep.finished_at);
    assert!(store.finished_within(Duration::ZERO).unwrap().tasks.is_empty());

    // What was submitted stays counted when finished tasks are cleared.
    store
        .clear_finished(0.0, &[TaskStatus::Done, TaskStatus::Failed, TaskStatus::Cancelled], &[])
        .unwrap();
    let counts = store.counts().unwrap();
    assert_eq!(counts.submitted, submitted);
    assert!(counts.by_status.iter().all(|(_, n)| *n == 0), "{counts:?}");
}

fn the_registry_tells_live_silent_and_stopped_workers_and_frees_a_dead_ones_tasks(b: Backend) {
    let (d, store) = open(b);
    store.register_worker("w1", 1, "host", 1, "opencode serve").unwrap();
    store.register_worker("w2", 2, "host", 1, "opencode serve").unwrap();
    let worker = |id: &str| store.list_workers().unwrap().into_iter().find(|w| w.id == id).unwrap();
    let alive = || store.queue_status().unwrap().workers_alive;
    assert!(!worker("w1").stale && !worker("w1").stopped);
    assert_eq!(alive(), 2);
    // Silent for a minute: twice the time after which a worker counts as gone.
    d.sql("UPDATE workers SET heartbeat_at = heartbeat_at - 60");
    let silent = worker("w1");
    assert!(silent.stale && !silent.stopped, "{silent:?}");
    assert_eq!(alive(), 0);
    store.worker_heartbeat("w1").unwrap();
    let heard = worker("w1");
    assert!(!heard.stale && heard.heartbeat_at > silent.heartbeat_at, "{heard:?}");
    assert_eq!(alive(), 1, "w2 is still silent");
    // A worker that stopped cleanly is stopped, not gone, however long ago it was last heard.
    store.worker_stopped("w2").unwrap();
    assert!(worker("w2").stopped && !worker("w2").stale, "{:?}", worker("w2"));
    assert_eq!(alive(), 1);

    // A dead worker's running task is given back at once (its attempt counts), and only its.
    let (mine, other) = (submit(&store, "w1's"), submit(&store, "w3's"));
    assert_eq!(store.claim_next("w1", "host", LEASE).unwrap().unwrap().task.id, mine);
    store.register_worker("w3", 3, "host", 1, "opencode serve").unwrap();
    assert_eq!(store.claim_next("w3", "host", LEASE).unwrap().unwrap().task.id, other);
    assert_eq!(store.release_worker_tasks("w1").unwrap(), vec![mine]);
    assert!(worker("w1").stopped);
    let reaped = store.reap_expired().unwrap();
    assert_eq!(reaped.iter().map(|r| (r.id, r.requeued)).collect::<Vec<_>>(), [(mine, true)]);
    let again = store.claim_next("w3", "host", LEASE).unwrap().unwrap().task;
    assert_eq!((again.id, again.attempts), (mine, 2));
    assert_eq!(store.get(other).unwrap().status, TaskStatus::Running);

    // A day on, a worker that died without a word (w3) and one that stopped (w2) leave the
    // list; the history keeps them.
    store.register_worker("w4", 4, "host", 1, "opencode serve").unwrap();
    d.sql("UPDATE workers SET heartbeat_at = heartbeat_at - 86401 WHERE id = 'w3'");
    d.sql("UPDATE workers SET stopped_at = stopped_at - 86401 WHERE id = 'w2'");
    let ids = |ws: Vec<WorkerInfo>| ws.into_iter().map(|w| w.id).collect::<Vec<_>>();
    assert_eq!(ids(store.list_workers().unwrap()), ["w1", "w4"]);
    assert_eq!(ids(store.list_all_workers().unwrap()), ["w1", "w2", "w3", "w4"]);
}

fn doctor_hears_what_the_queue_runs_on_and_that_it_is_sound(b: Backend) {
    let (d, store) = open(b);
    assert_eq!(store.quick_check().unwrap(), "ok");
    assert_eq!(store.integrity_check().unwrap(), "ok");
    let info = store.backend_info().unwrap();
    match b {
        Backend::Sqlite => assert_eq!(info, format!("SQLite {}", rusqlite::version())),
        Backend::Postgres => {
            let schema = d.arg.split("schema=").nth(1).unwrap();
            assert!(info.starts_with("PostgreSQL 1"), "{info}");
            assert!(
                info.ends_with(&format!(", schema {schema}, woken by LISTEN/NOTIFY")),
                "{info}"
            );
            let polled = Db::with_params(b, "&listen=off&poll_ms=250");
            let info = polled.open().backend_info().unwrap();
            assert!(info.ends_with("woken by a poll every 250 ms (listen=off)"), "{info}");
        }
    }
}

fn every_bound_takes_its_limit_and_refuses_one_past_it(b: Backend) {
    let (_d, store) = open(b);
    let with = |f: &dyn Fn(&mut TaskSpec)| {
        let mut s = spec("a");
        f(&mut s);
        store.submit(s).map(|(t, _)| t)
    };
    let takes = |what: &str, f: &dyn Fn(&mut TaskSpec)| {
        if let Err(e) = with(f) {
            panic!("{what} should be taken: {e}");
        }
    };
    let refuses = |what: &str, field: &str, f: &dyn Fn(&mut TaskSpec)| match with(f) {
        Ok(t) => panic!("{what} should be refused, got task {:?}", t.id),
        Err(e) => assert!(e.to_string().contains(field), "{what}: {e}"),
    };
    takes("a prompt of the limit", &|s| s.prompt = "x".repeat(MAX_PROMPT_BYTES));
    refuses("a prompt past it", "prompt", &|s| s.prompt = "x".repeat(MAX_PROMPT_BYTES + 1));
    for p in [-100, 100] {
        takes("priority at an end", &|s| s.priority = p);
    }
    for n in [1, 20] {
        takes("attempts at an end", &|s| s.max_attempts = n);
    }
    refuses("21 attempts", "max_attempts", &|s| s.max_attempts = 21);
    for t in [1, 7 * 86_400] {
        takes("a timeout at an end", &|s| s.timeout_s = t);
    }
    refuses("a week and a second", "timeout_s", &|s| s.timeout_s = 7 * 86_400 + 1);
    takes("a question timeout of 1 s", &|s| s.question_timeout_s = Some(1));
    refuses("one of 0 s", "question_timeout_s", &|s| s.question_timeout_s = Some(0));
    takes("provider/model", &|s| s.model = Some("p/m".into()));
    for model in ["/m", "p/", "/"] {
        refuses(model, "provider/model", &|s| s.model = Some(model.into()));
    }
    takes("a title of 200", &|s| s.title = Some("é".repeat(200)));
    refuses("one of 201", "title", &|s| s.title = Some("é".repeat(201)));
    for key in ["k", &"k".repeat(200)] {
        takes("a request id at an end", &|s| s.request_id = Some(key.to_owned()));
    }
    for key in ["", &"k".repeat(201)] {
        refuses("a request id past an end", "request_id", &|s| s.request_id = Some(key.to_owned()));
    }
    takes("a cent", &|s| s.budget.max_cost_usd = Some(0.01));
    for c in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        refuses("no amount", "max_cost_usd", &|s| s.budget.max_cost_usd = Some(c));
    }
    takes("one token", &|s| s.budget.max_tokens = Some(1));
    refuses("no tokens", "max_tokens", &|s| s.budget.max_tokens = Some(0));

    // A task's title is its prompt's first line, cut at 80 characters (not bytes) with a mark.
    let title = |prompt: String| with(&|s| s.prompt = prompt.clone()).unwrap().title;
    assert_eq!(title(format!("\n  {}  \nmore", "é".repeat(80))), "é".repeat(80));
    assert_eq!(title("é".repeat(81)), format!("{}…", "é".repeat(80)));
    let blank = with(&|s| s.title = Some("  ".into())).unwrap();
    assert_eq!(blank.title, "a", "a blank title is no title");

    // In a batch the refusal names the item; a lone task has no place to name.
    let lone = with(&|s| s.max_attempts = 0).unwrap_err().to_string();
    assert!(lone.starts_with("invalid max_attempts: 0 is out of range"), "{lone}");
    let mut bad = spec("b");
    bad.max_attempts = 0;
    let batch = store.submit_batch(vec![spec("a"), bad]).unwrap_err().to_string();
    assert!(batch.contains("max_attempts: task #1 of the batch: 0 is out of range"), "{batch}");
}

fn an_answer_and_a_note_take_the_limit_and_clearing_takes_only_an_age_and_finished_states(
    b: Backend,
) {
    let (_d, store) = open(b);
    let id = submit(&store, "a");
    let limit = "x".repeat(MAX_PROMPT_BYTES);
    let past = format!("{limit}x");
    store.add_note(id, &limit).unwrap();
    let err = store.add_note(id, &past).unwrap_err().to_string();
    assert!(err.contains("note: it is over 256 KiB"), "{err}");
    let c = claim(&store).unwrap();
    let waiting = Outcome::Waiting {
        question: "Red or blue?".into(),
        session_id: "ses_x".into(),
        result: None,
        ask: None,
    };
    store.finish(id, c.token, waiting).unwrap();
    let err = store.answer(id, &past, "cli").unwrap_err().to_string();
    assert!(err.contains("answer: it is over 256 KiB"), "{err}");
    assert_eq!(store.answer(id, &limit, "cli").unwrap().status, TaskStatus::Queued);

    for age in [-1.0, f64::NAN, f64::INFINITY] {
        let err = store.clear_finished(age, &[TaskStatus::Done], &[]).unwrap_err().to_string();
        assert!(err.contains("older_than_s"), "{age}: {err}");
    }
    let err = store.clear_finished(0.0, &[TaskStatus::Queued], &[]).unwrap_err().to_string();
    assert!(err.contains("'queued' tasks are not finished"), "{err}");
    assert_eq!(store.get(id).unwrap().status, TaskStatus::Queued, "nothing was cleared");
}

fn a_merge_is_recorded_on_done_tasks_only_and_all_or_nothing(b: Backend) {
    let (_d, store) = open(b);
    let (first, second) = (submit(&store, "a"), submit(&store, "b"));
    let c = claim(&store).unwrap();
    store.finish(first, c.token, done()).unwrap();
    let err = store.record_merge(&[first, second], "main", "abc123").unwrap_err().to_string();
    assert!(err.contains("merge_task") && err.contains("done"), "{err}");
    assert_eq!(store.get(first).unwrap().merged_into, None, "nothing was recorded");
    store.record_merge(&[first], "main", "abc123").unwrap();
    let merged = store.get(first).unwrap();
    assert_eq!(
        (merged.merged_into.as_deref(), merged.merge_commit.as_deref()),
        (Some("main"), Some("abc123"))
    );
}

fn a_queued_prompt_is_edited_until_it_runs_and_a_paused_queue_hands_nothing_out(b: Backend) {
    let (_d, store) = open(b);
    let id = submit(&store, "first prompt");
    let title = store.get(id).unwrap().title;
    let t = store.edit_task(id, "second prompt", None).unwrap();
    assert_eq!((t.prompt.as_str(), t.title.as_str()), ("second prompt", title.as_str()));
    let t = store.edit_task(id, "third prompt", Some("renamed")).unwrap();
    assert_eq!((t.prompt.as_str(), t.title.as_str()), ("third prompt", "renamed"));
    for (prompt, title) in [(" ", None), ("ok", Some(" "))] {
        let e = store.edit_task(id, prompt, title).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
    }
    assert_eq!(store.get(id).unwrap().prompt, "third prompt", "a refused edit writes nothing");

    // Paused: nothing is handed out, whatever is queued; twice is said, and so is resuming.
    assert!(store.pause_queue().unwrap(), "paused now");
    assert!(!store.pause_queue().unwrap(), "already paused");
    assert!(store.queue_status().unwrap().paused);
    assert!(claim(&store).is_none(), "a paused queue hands nothing out");
    assert!(store.resume_queue().unwrap(), "resumed now");
    assert!(!store.resume_queue().unwrap(), "was not paused");
    assert!(!store.queue_status().unwrap().paused);

    // Running, then queued again after a failed attempt: the prompt the agent saw stays.
    let c = claim(&store).unwrap();
    let e = store.edit_task(id, "too late", None).unwrap_err();
    assert!(matches!(e, Error::InvalidTransition { .. }), "{e}");
    let failed = Outcome::Failed {
        error: "API 500".into(),
        kind: FailureKind::Provider,
        result: None,
        backoff_s: 0.0,
    };
    assert_eq!(store.finish(id, c.token, failed).unwrap().status, TaskStatus::Queued);
    let e = store.edit_task(id, "too late", None).unwrap_err();
    assert!(e.to_string().contains("queued and not yet run"), "{e}");
    assert_eq!(store.get(id).unwrap().prompt, "third prompt");
}
