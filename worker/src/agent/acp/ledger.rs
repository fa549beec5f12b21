//! OpenCode's own record of what each model step spent, read from its database: over ACP the
//! prompt's answer carries the whole turn's tokens on OpenCode 2 but only the last step's on
//! 1.18.33, and neither says anything between steps, where a budget must be checked. Every step
//! OpenCode finishes is a row there (1.x: `message`, 2.x: `session_message`) with its tokens and
//! cost, so the turn's spend is summed exactly, step by step, on both.
//!
//! The database is the agent's (it may write it); its figures are only read and reported, never
//! acted on beyond a budget's pause, and anything unreadable is skipped.

use crate::events::Usage;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where an OpenCode keeps its database, for the environment it runs in (made by OpenCode on
/// its first start).
pub fn database(env: &queue::Environment) -> Option<PathBuf> {
    let data = crate::agent::AgentKind::OpenCode.private_paths(env).into_iter().next()?;
    Some(data.join("opencode.db"))
}

/// The spend of `session`'s steps finished since `since_ms` (Unix milliseconds), and how many.
/// The agent can write where the database is: only a regular file is read (a FIFO put there
/// would hang the open, a link would lead elsewhere).
pub fn spent(db: &Path, session: &str, since_ms: i64) -> Option<Usage> {
    if !std::fs::symlink_metadata(db).is_ok_and(|m| m.file_type().is_file()) {
        return None;
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
        | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = rusqlite::Connection::open_with_flags(db, flags).ok()?;
    let _ = conn.busy_timeout(std::time::Duration::from_millis(500));
    // 2.x keeps steps in `session_message`; 1.x in `message`, and has a `session_message` of
    // another meaning: the table that holds this session's steps is the one that counts.
    let queries = [
        "SELECT data FROM session_message WHERE session_id = ?1 AND type = 'assistant' \
         AND time_created >= ?2 ORDER BY seq",
        "SELECT data FROM message WHERE session_id = ?1 AND time_created >= ?2 \
         ORDER BY time_created, id",
    ];
    queries
        .iter()
        .filter_map(|q| {
            let mut stmt = conn.prepare(q).ok()?;
            let rows =
                stmt.query_map(rusqlite::params![session, since_ms], |r| r.get::<_, String>(0));
            let rows: Vec<String> = rows.ok()?.filter_map(Result::ok).collect();
            let mut usage = Usage { cost_usd: Some(0.0), ..Usage::default() };
            for data in rows {
                let Ok(m) = serde_json::from_str::<Value>(&data) else { continue };
                if let Some(step) = step_usage(&m) {
                    usage.add(&step);
                }
            }
            Some(usage)
        })
        .max_by_key(|u| u.steps)
}

/// A finished assistant step's spend (a user message, or a step still streaming, is none).
fn step_usage(m: &Value) -> Option<Usage> {
    if m.get("role").is_some_and(|r| r != "assistant") {
        return None;
    }
    m.pointer("/time/completed")?;
    let tokens = m.get("tokens")?;
    let n = |p: &str| tokens.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        input_tokens: n("/input"),
        output_tokens: n("/output"),
        reasoning_tokens: n("/reasoning"),
        cache_read_tokens: n("/cache/read"),
        cache_write_tokens: n("/cache/write"),
        cost_usd: Some(m.get("cost").and_then(Value::as_f64).unwrap_or(0.0)),
        steps: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_opencodes_steps_are_summed_from_their_own_tables() {
        let dir = tempfile::tempdir().unwrap();
        let step = |input: u64, cost: f64| {
            format!(
                r#"{{"role":"assistant","time":{{"created":1,"completed":2}},"cost":{cost},"tokens":{{"input":{input},"output":2,"reasoning":0,"cache":{{"read":3,"write":4}}}}}}"#
            )
        };
        let one = dir.path().join("one.db");
        let c = rusqlite::Connection::open(&one).unwrap();
        c.execute_batch("CREATE TABLE message (id TEXT, session_id TEXT, time_created INTEGER, data TEXT);
            CREATE TABLE session_message (id TEXT, session_id TEXT, type TEXT, seq INTEGER, time_created INTEGER, data TEXT);").unwrap();
        // 1.x's own `session_message` means something else, and holds no step.
        c.execute("INSERT INTO session_message VALUES ('z', 's', 'assistant', 1, 30, '{}')", [])
            .unwrap();
        for (id, t, data) in [
            ("a", 5, step(100, 0.5)),
            ("b", 20, r#"{"role":"user","time":{"created":20}}"#.to_owned()),
            ("c", 21, step(10, 0.25)),
            ("d", 22, step(1, 0.125)),
            ("e", 23, r#"{"role":"assistant","time":{"created":23},"tokens":{"input":9}}"#.into()),
        ] {
            c.execute(
                "INSERT INTO message VALUES (?1, 's', ?2, ?3)",
                rusqlite::params![id, t, data],
            )
            .unwrap();
        }
        let u = spent(&one, "s", 20).unwrap();
        assert_eq!((u.input_tokens, u.output_tokens, u.cache_read_tokens, u.steps), (11, 4, 6, 2));
        assert_eq!(u.cost_usd, Some(0.375));
        let none = spent(&one, "other", 0).unwrap();
        assert_eq!((none.steps, none.cost_usd), (0, Some(0.0)), "no step: nothing spent, known");

        let two = dir.path().join("two.db");
        let c = rusqlite::Connection::open(&two).unwrap();
        c.execute_batch("CREATE TABLE session_message (id TEXT, session_id TEXT, type TEXT, seq INTEGER, time_created INTEGER, data TEXT)").unwrap();
        let s2 = step(7, 1.0).replace(r#""role":"assistant","#, "");
        c.execute("INSERT INTO session_message VALUES ('x', 's', 'assistant', 1, 30, ?1)", [s2])
            .unwrap();
        c.execute("INSERT INTO session_message VALUES ('y', 's', 'user', 2, 31, '{}')", [])
            .unwrap();
        let u = spent(&two, "s", 0).unwrap();
        assert_eq!((u.input_tokens, u.steps, u.cost_usd), (7, 1, Some(1.0)));
        assert_eq!(spent(&dir.path().join("none.db"), "s", 0), None);
        // What the agent may have put in its place is not read: a link, a FIFO (whose open
        // would wait for a writer for ever).
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&two, &link).unwrap();
        assert_eq!(spent(&link, "s", 0), None);
        let fifo = dir.path().join("fifo.db");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(spent(&fifo, "s", 0), None);
    }
}
