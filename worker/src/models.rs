//! The models OpenCode can use, from `opencode models`, cached in the database for an hour (the
//! command takes seconds).

use crate::error::{Error, Result};
use queue::Store;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const CACHE_KEY: &str = "models_cache";
const CACHE_TTL: Duration = Duration::from_secs(3600);
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Runs `opencode models` and returns its `provider/model` lines. OpenCode 2 is told
/// `--standalone`: by default it asks a background service, which it starts and leaves running
/// (seen with 2.1.2: an `opencode serve --service` outside any wall, long after).
fn fetch(opencode: &Path) -> Result<Vec<String>> {
    let mut cmd = std::process::Command::new(opencode);
    cmd.arg("models");
    if opencode_major(opencode).is_some_and(|m| m >= 2) {
        cmd.arg("--standalone");
    }
    let out = crate::process::output_within(&mut cmd, LIST_TIMEOUT)
        .map_err(|e| Error::Config(format!("could not run '{} models': {e}", opencode.display())))?
        .ok_or_else(|| {
            Error::Config(format!(
                "`opencode models` did not answer within {} s",
                LIST_TIMEOUT.as_secs()
            ))
        })?;
    let (status, stdout, stderr) = (out.status, out.stdout, out.stderr);
    if !status.success() {
        return Err(Error::Config(format!(
            "`opencode models` failed: {}",
            String::from_utf8_lossy(&stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&stdout)
        .lines()
        .map(str::trim)
        .filter(|l| l.contains('/') && !l.contains(' '))
        .map(str::to_owned)
        .collect())
}

/// The models a configured ACP agent offers, with a note when it names none.
pub fn configured_agent_models(
    agent: &crate::ConfiguredAgent,
    env: &queue::Environment,
) -> Result<(Vec<String>, Option<String>)> {
    if let Some(missing) = agent.missing(env) {
        return Err(Error::Config(missing));
    }
    let models = crate::agent::acp::models(&agent.launch()).map_err(|e| {
        Error::Config(format!("could not ask the {} agent for its models: {e}", agent.name))
    })?;
    let note = models.is_empty().then(|| {
        format!("the {} agent offers no model choice over ACP: it uses its own", agent.name)
    });
    Ok((models, note))
}

/// The major version `opencode --version` prints (`1.18.33`, `opencode v2.1.2`).
fn opencode_major(opencode: &Path) -> Option<u32> {
    let mut cmd = std::process::Command::new(opencode);
    cmd.arg("--version").stdin(std::process::Stdio::null());
    let out =
        crate::process::output_within(&mut cmd, std::time::Duration::from_secs(10)).ok()??;
    let text = String::from_utf8_lossy(&out.stdout);
    crate::agent::major(text.split_whitespace().last()?)
}

/// Lists `provider/model` names, optionally for one provider. Blocking: async callers run it on
/// their blocking pool.
pub fn list_models(
    store: &Store,
    opencode: &Path,
    provider: Option<&str>,
    refresh: bool,
) -> Result<Vec<String>> {
    let cached =
        store.setting(CACHE_KEY)?.and_then(|v| serde_json::from_str::<(f64, Vec<String>)>(&v).ok());
    let all = match cached {
        Some((at, models)) if !refresh && now_s() - at < CACHE_TTL.as_secs_f64() => models,
        _ => {
            let models = fetch(opencode)?;
            let cache = serde_json::json!([now_s(), models]).to_string();
            store.set_setting(CACHE_KEY, &cache)?;
            models
        }
    };
    Ok(match provider {
        Some(p) => all.into_iter().filter(|m| m.split('/').next() == Some(p)).collect(),
        None => all,
    })
}

/// When the cached list of OpenCode's models was fetched (seconds since the epoch), if there is
/// one.
pub fn fetched_at(store: &Store) -> Result<Option<f64>> {
    Ok(store
        .setting(CACHE_KEY)?
        .and_then(|v| serde_json::from_str::<(f64, Vec<String>)>(&v).ok())
        .map(|(at, _)| at))
}

/// What a check of a model name against OpenCode's list found.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelCheck {
    Known,
    /// The list could not be read here (OpenCode missing on this host, say); the name is kept
    /// and the worker that runs the task reports what its OpenCode thinks of it.
    Unverified(String),
}

/// Checks `model` against the models OpenCode offers; an unknown name is a user error that
/// lists the near names.
pub fn check_model(store: &Store, opencode: &Path, model: &str) -> Result<ModelCheck> {
    if !model.contains('/') {
        return Err(Error::Config(format!(
            "invalid model '{model}': use provider/model, e.g. anthropic/claude-sonnet-4-5 \
             (`taskbridge list-models` lists them)"
        )));
    }
    let mut models = match list_models(store, opencode, None, false) {
        Ok(m) => m,
        Err(e) => return Ok(ModelCheck::Unverified(e.to_string())),
    };
    if !models.iter().any(|m| m == model) {
        // The cached list may be from before the provider was set up: a name is called unknown
        // only by a list fetched now.
        models = match list_models(store, opencode, None, true) {
            Ok(m) => m,
            Err(e) => return Ok(ModelCheck::Unverified(e.to_string())),
        };
    }
    if models.iter().any(|m| m == model) {
        return Ok(ModelCheck::Known);
    }
    let provider = model.split('/').next().unwrap_or("");
    // The closest names first: those sharing the longest start with what was asked.
    let shared = |m: &str| m.chars().zip(model.chars()).take_while(|(a, b)| a == b).count();
    let mut near: Vec<&str> = models
        .iter()
        .filter(|m| m.split('/').next() == Some(provider))
        .map(String::as_str)
        .collect();
    near.sort_by_key(|m| std::cmp::Reverse(shared(m)));
    near.truncate(6);
    Err(Error::Config(format!(
        "unknown model '{model}'; `taskbridge list-models` lists the {} models OpenCode offers{}",
        models.len(),
        if near.is_empty() {
            format!(
                " (none from provider '{provider}': set up its key or run `opencode auth login`)"
            )
        } else {
            format!(", e.g. {}", near.join(", "))
        }
    )))
}

/// Sets the default model after checking it against OpenCode's list (which must be readable).
pub fn set_default_model(store: &Store, opencode: &Path, model: &str) -> Result<()> {
    if let ModelCheck::Unverified(why) = check_model(store, opencode, model)? {
        return Err(Error::Config(format!("cannot check the model: {why}")));
    }
    store.set_setting("default_model", model)?;
    Ok(())
}

/// The models an agent other than OpenCode takes, and what to know about the list. Codex lists
/// its catalog (`codex debug models`, which works offline); Claude Code has no command that
/// lists models, so its aliases are given, which follow Anthropic's newest of each family.
pub fn agent_models(
    kind: crate::agent::AgentKind,
    program: &Path,
    env: &queue::Environment,
) -> Result<(Vec<String>, Option<String>)> {
    use crate::agent::AgentKind;
    if let Some(missing) = kind.missing(program, env) {
        return Err(Error::Config(missing));
    }
    match kind {
        AgentKind::OpenCode => Err(Error::Config("OpenCode's models come from list_models".into())),
        AgentKind::Acp => Err(Error::Config("an ACP agent's models come from its session".into())),
        AgentKind::ClaudeCode => Ok((
            ["sonnet", "opus", "haiku"].map(str::to_owned).to_vec(),
            Some(
                "Claude Code takes these aliases or a full model name (claude-sonnet-4-5, say); \
                 it has no command that lists models"
                    .into(),
            ),
        )),
        AgentKind::Codex => {
            let out = crate::process::output_within(
                std::process::Command::new(program).args(["debug", "models"]),
                LIST_TIMEOUT,
            )
            .map_err(|e| {
                Error::Config(format!("could not run '{} debug models': {e}", program.display()))
            })?
            .ok_or_else(|| Error::Config("`codex debug models` did not answer in time".into()))?;
            if !out.status.success() {
                return Err(Error::Config(format!(
                    "`codex debug models` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
                Error::Config(format!("`codex debug models` printed no catalog: {e}"))
            })?;
            let models = doc["models"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["slug"].as_str().or_else(|| m["id"].as_str()))
                .map(str::to_owned)
                .collect();
            Ok((
                models,
                Some("Codex's bundled catalog; a provider of your own may offer others".into()),
            ))
        }
    }
}
