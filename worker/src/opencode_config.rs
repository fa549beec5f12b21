//! The configuration TaskBridge gives the OpenCode it runs: the per-run config content (the
//! reverse bridge as an MCP server, the environment plugin, joined with the user's own) and the
//! permission rules for a task's flags.

use queue::Task;
use std::path::Path;

/// The name OpenCode knows the bridge by; its tools appear to the model as `taskbridge_claude_ask`
/// and so on.
pub const BRIDGE_MCP_NAME: &str = "taskbridge";

/// `OPENCODE_CONFIG_CONTENT` with the bridge added to its `mcp` block. The inherited content (the
/// user's own per-run config) is kept: OpenCode reads only one such variable.
pub fn with_bridge(inherited: Option<&str>, command: &[String]) -> String {
    let mut doc = config_doc(inherited);
    // OpenCode applies `timeout` to every call of the server's tools, and a question to Claude
    // can take minutes.
    let entry = serde_json::json!({
        "type": "local",
        "command": command,
        "enabled": true,
        "timeout": 300_000,
    });
    if !doc["mcp"].is_object() {
        doc["mcp"] = serde_json::json!({});
    }
    doc["mcp"][BRIDGE_MCP_NAME] = entry;
    doc.to_string()
}

/// `OPENCODE_CONFIG_CONTENT` for a task run as to the reverse bridge: the worker's own when it
/// offers one (`--claude-bridge`); else, when the user's OpenCode config registers TaskBridge's
/// bridge (`config opencode --write`, which install.sh offers), that entry switched off. Inside
/// the wall the registered bridge cannot reach the queue, and OpenCode only logged "server
/// unavailable" in every task; the worker says why once, at its start
/// (`registered_bridge_unoffered`).
pub fn with_task_bridge(inherited: Option<&str>, cfg: &crate::WorkerConfig) -> String {
    match &cfg.claude_bridge {
        Some(bridge) => with_bridge(inherited, bridge),
        None if user_registers_bridge(&cfg.env) => {
            let mut doc = config_doc(inherited);
            if !doc["mcp"].is_object() {
                doc["mcp"] = serde_json::json!({});
            }
            // Merged by OpenCode into the user's entry, which keeps its command and type.
            doc["mcp"][BRIDGE_MCP_NAME] = serde_json::json!({"enabled": false});
            doc.to_string()
        }
        None => inherited.map_or_else(|| "{}".to_owned(), str::to_owned),
    }
}

/// Whether the worker leaves out a bridge the user registered, to say so at its start.
pub fn registered_bridge_unoffered(cfg: &crate::WorkerConfig) -> bool {
    cfg.claude_bridge.is_none() && user_registers_bridge(&cfg.env)
}

/// Whether `$XDG_CONFIG_HOME/opencode/opencode.json` (or `.jsonc`) has TaskBridge's bridge as
/// its `taskbridge` MCP server.
fn user_registers_bridge(env: &queue::Environment) -> bool {
    let Some(dir) =
        env.path("XDG_CONFIG_HOME").or_else(|| env.home_dir().map(|h| h.join(".config")))
    else {
        return false;
    };
    ["opencode.json", "opencode.jsonc"].iter().any(|name| {
        let Ok(text) = std::fs::read_to_string(dir.join("opencode").join(name)) else {
            return false;
        };
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => v["mcp"][BRIDGE_MCP_NAME]["command"]
                .as_array()
                .is_some_and(|c| c.iter().any(|a| a == "claude-mcp")),
            // JSON with comments: the entry as `config opencode --write` writes it.
            Err(_) => {
                text.contains(&format!("\"{BRIDGE_MCP_NAME}\"")) && text.contains("\"claude-mcp\"")
            }
        }
    })
}

/// The inherited `OPENCODE_CONFIG_CONTENT` as a JSON object to add to (an empty one when there
/// is none, or it is not an object).
fn config_doc(inherited: Option<&str>) -> serde_json::Value {
    inherited
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}))
}

/// `OPENCODE_CONFIG_CONTENT` with OpenCode's defaults set for headless work where they do work
/// TaskBridge already does: per-step snapshots (a shadow git index of the worktree, written
/// before and after every step so the TUI can undo) are off, since TaskBridge takes files and
/// diff from git itself and undoes a readonly task's writes with git. What the user's own content
/// sets is kept.
pub fn headless(inherited: Option<&str>) -> String {
    let mut doc = config_doc(inherited);
    if doc.get("snapshot").is_none() {
        doc["snapshot"] = false.into();
    }
    doc.to_string()
}

/// `OPENCODE_CONFIG_CONTENT` with the plugin file at `plugin` added to its `plugin` list.
pub fn with_plugin(inherited: Option<&str>, plugin: &Path) -> String {
    let mut doc = config_doc(inherited);
    let spec = serde_json::Value::from(format!("file://{}", plugin.display()));
    match doc["plugin"].as_array_mut() {
        Some(list) if !list.contains(&spec) => list.push(spec),
        Some(_) => {}
        None => doc["plugin"] = serde_json::json!([spec]),
    }
    doc.to_string()
}

/// `OPENCODE_CONFIG_CONTENT` with every permission set to ask: over ACP each tool call comes to
/// TaskBridge as a permission request, and the task's rules decide it (one OpenCode process
/// serves tasks with different rules, and its configuration is the process's). The user's own
/// permission block gives way: TaskBridge's rules are the task's.
///
/// Its `title` agent is switched off unless the user configured it: a session made over ACP has
/// no title, and OpenCode would spend a model request on one for every task (TaskBridge names its
/// tasks itself; the warm server's sessions are made with a title).
pub fn asking_for_everything(inherited: &str) -> String {
    let mut doc = config_doc(Some(inherited));
    doc["permission"] = serde_json::json!({"*": "ask"});
    if !doc["agent"].is_object() {
        doc["agent"] = serde_json::json!({});
    }
    if doc["agent"].get("title").is_none() {
        doc["agent"]["title"] = serde_json::json!({"disable": true});
    }
    doc.to_string()
}

/// OpenCode's permission rules for the task's flags. Nothing may resolve to "ask": headless
/// `opencode run` auto-rejects an "ask" and ends the agent's turn (exit 0), so a rule that asks
/// would silently stop the task.
pub fn permission_json(task: &Task) -> String {
    let mut p = serde_json::Map::new();
    p.insert("external_directory".into(), "deny".into());
    // `ask` rules cannot ask here: what they would ask about is denied instead.
    for rule in &task.ask_rules {
        let Ok((perm, pattern)) = queue::parse_ask_rule(rule) else { continue };
        if pattern == "*" {
            p.insert(perm, "deny".into());
            continue;
        }
        let entry = p.entry(perm).or_insert_with(|| serde_json::json!({"*": "allow"}));
        if let Some(map) = entry.as_object_mut() {
            map.insert(pattern, "deny".into());
        }
    }
    if task.readonly {
        p.insert("edit".into(), "deny".into());
    }
    if task.no_shell {
        p.insert("bash".into(), "deny".into());
    }
    if task.no_network {
        p.insert("webfetch".into(), "deny".into());
        p.insert("websearch".into(), "deny".into());
    }
    serde_json::Value::Object(p).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn over_acp_opencode_asks_for_everything_and_titles_nothing_unless_the_user_says() {
        let v: Value = serde_json::from_str(&asking_for_everything("{}")).unwrap();
        assert_eq!(
            (v["permission"].clone(), v["agent"]["title"]["disable"].clone()),
            (json!({"*": "ask"}), json!(true))
        );
        let mine = r#"{"agent": {"title": {"model": "anthropic/claude-haiku"}, "plan": {}}}"#;
        let v: Value = serde_json::from_str(&asking_for_everything(mine)).unwrap();
        assert_eq!(v["agent"]["title"], json!({"model": "anthropic/claude-haiku"}));
        assert!(v["agent"]["plan"].is_object());
    }

    #[test]
    fn headless_work_takes_no_snapshots_unless_the_user_asks_for_them() {
        let v: Value = serde_json::from_str(&headless(None)).unwrap();
        assert_eq!(v["snapshot"], false);
        let mine = r#"{"snapshot": true, "model": "anthropic/claude"}"#;
        let v: Value = serde_json::from_str(&headless(Some(mine))).unwrap();
        assert_eq!(
            (v["snapshot"].clone(), v["model"].clone()),
            (json!(true), json!("anthropic/claude"))
        );
    }

    fn config_with(files: &[(&str, &str)]) -> (tempfile::TempDir, crate::WorkerConfig) {
        let dir = tempfile::tempdir().unwrap();
        let oc = dir.path().join("opencode");
        std::fs::create_dir_all(&oc).unwrap();
        for (name, text) in files {
            std::fs::write(oc.join(name), text).unwrap();
        }
        let env =
            queue::Environment::from_vars([("XDG_CONFIG_HOME", dir.path().to_str().unwrap())]);
        let cfg = crate::WorkerConfig { env, ..crate::WorkerConfig::default() };
        (dir, cfg)
    }

    #[test]
    fn a_bridge_the_user_registered_is_switched_off_in_tasks_unless_the_worker_offers_one() {
        let registered = r#"{"mcp": {"taskbridge": {"type": "local",
                               "command": ["/bin/taskbridge", "--home", "/h", "claude-mcp"]}}}"#;
        let (_d, mut cfg) = config_with(&[("opencode.json", registered)]);
        assert!(registered_bridge_unoffered(&cfg));
        let v: Value =
            serde_json::from_str(&with_task_bridge(Some(r#"{"snapshot": false}"#), &cfg)).unwrap();
        assert_eq!(v, json!({"snapshot": false, "mcp": {"taskbridge": {"enabled": false}}}));
        // An `mcp` that is not a table is replaced, not indexed into.
        let v: Value =
            serde_json::from_str(&with_task_bridge(Some(r#"{"mcp": 5}"#), &cfg)).unwrap();
        assert_eq!(v, json!({"mcp": {"taskbridge": {"enabled": false}}}));
        // The worker's own bridge instead, when it offers one.
        cfg.claude_bridge = Some(vec!["/bin/taskbridge".into(), "claude-mcp".into()]);
        assert!(!registered_bridge_unoffered(&cfg));
        let v: Value = serde_json::from_str(&with_task_bridge(None, &cfg)).unwrap();
        assert_eq!(v["mcp"]["taskbridge"]["enabled"], true);
        assert_eq!(v["mcp"]["taskbridge"]["command"][1], "claude-mcp");
    }

    #[test]
    fn other_servers_named_taskbridge_and_no_config_at_all_are_left_alone() {
        let other = r#"{"mcp": {"taskbridge": {"type": "remote", "url": "http://x/mcp"}}}"#;
        for files in [vec![("opencode.json", other)], vec![]] {
            let (_d, cfg) = config_with(&files);
            assert!(!registered_bridge_unoffered(&cfg), "{files:?}");
            assert_eq!(with_task_bridge(Some(r#"{"a":1}"#), &cfg), r#"{"a":1}"#);
        }
        let jsonc = "// mine\n{\"mcp\": {\"taskbridge\": {\"command\": [\"tb\", \"claude-mcp\"]}}}";
        let (_d, cfg) = config_with(&[("opencode.jsonc", jsonc)]);
        assert!(registered_bridge_unoffered(&cfg), "found in JSON with comments");
        // A server of that name that is not the bridge (its command does not serve it).
        let mine = r#"{"mcp": {"taskbridge": {"type": "local", "command": ["tb", "mcp"]}}}"#;
        let (_d, cfg) = config_with(&[("opencode.json", mine)]);
        assert!(!registered_bridge_unoffered(&cfg), "the main server under that name");
        let other = "// mine\n{\"mcp\": {\"taskbridge\": {\"url\": \"http://x\"}}}";
        let (_d, cfg) = config_with(&[("opencode.jsonc", other)]);
        assert!(!registered_bridge_unoffered(&cfg), "another server of that name, with comments");
    }

    #[test]
    fn the_bridge_joins_the_users_own_run_config_without_replacing_it() {
        let cmd = vec!["/bin/taskbridge".to_owned(), "claude-mcp".to_owned()];
        let inherited = r#"{"provider": {"anthropic": {"options": {"baseURL": "http://x/v1"}}},
                            "mcp": {"mine": {"type": "local", "command": ["m"]}}}"#;
        let v: Value = serde_json::from_str(&with_bridge(Some(inherited), &cmd)).unwrap();
        assert_eq!(v["provider"]["anthropic"]["options"]["baseURL"], "http://x/v1");
        assert_eq!(v["mcp"]["mine"]["command"], json!(["m"]));
        assert_eq!(v["mcp"]["taskbridge"]["command"], json!(cmd));
        assert_eq!(v["mcp"]["taskbridge"]["type"], "local");

        // Nothing usable inherited: the bridge alone.
        for inherited in [None, Some("not json"), Some("[1]")] {
            let v: Value = serde_json::from_str(&with_bridge(inherited, &cmd)).unwrap();
            assert_eq!(v["mcp"].as_object().unwrap().len(), 1, "{v}");
        }
    }

    #[test]
    fn the_environment_plugin_joins_the_users_plugins_once() {
        let plugin = Path::new("/h/opencode-plugin/taskbridge-env.js");
        let ours = json!("file:///h/opencode-plugin/taskbridge-env.js");
        let v: Value =
            serde_json::from_str(&with_plugin(Some(r#"{"plugin": ["mine"], "x": 1}"#), plugin))
                .unwrap();
        assert_eq!((v["plugin"].clone(), v["x"].clone()), (json!(["mine", ours]), json!(1)));
        let again: Value =
            serde_json::from_str(&with_plugin(Some(&v.to_string()), plugin)).unwrap();
        assert_eq!(again["plugin"], json!(["mine", ours]), "added once");
        let alone: Value = serde_json::from_str(&with_plugin(None, plugin)).unwrap();
        assert_eq!(alone, json!({"plugin": [ours]}));
    }

    #[test]
    fn a_tasks_ask_rules_and_flags_become_denies_in_opencodes_rules() {
        let rules =
            |task: &Task| -> Value { serde_json::from_str(&permission_json(task)).unwrap() };
        let mut task = crate::sample_task();
        assert_eq!(rules(&task), json!({"external_directory": "deny"}));
        task.ask_rules = vec!["bash:git push *".into(), "webfetch".into(), "nonsense".into()];
        assert_eq!(
            rules(&task),
            json!({
                "external_directory": "deny",
                "bash": {"*": "allow", "git push *": "deny"},
                "webfetch": "deny",
            })
        );
        (task.readonly, task.no_shell, task.no_network) = (true, true, true);
        let v = rules(&task);
        assert_eq!((&v["edit"], &v["bash"]), (&json!("deny"), &json!("deny")));
        assert_eq!((&v["webfetch"], &v["websearch"]), (&json!("deny"), &json!("deny")));
    }
}
