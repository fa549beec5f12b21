//! The models OpenCode can use, from `opencode models`, cached in the database for an hour (the
//! command takes seconds).

use crate::error::{Error, Result};
use queue::Store;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const CACHE_KEY: &str = "models_cache";
const CACHE_TTL: Duration = Duration::from_secs(3600);

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Lists `provider/model` names, optionally for one provider.
pub async fn list_models(
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
            let out = tokio::time::timeout(
                Duration::from_secs(60),
                tokio::process::Command::new(opencode)
                    .arg("models")
                    .stdin(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .map_err(|_| Error::Config("`opencode models` did not answer within 60 s".into()))?
            .map_err(|e| {
                Error::Config(format!("could not run '{} models': {e}", opencode.display()))
            })?;
            if !out.status.success() {
                return Err(Error::Config(format!(
                    "`opencode models` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            let models: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| l.contains('/') && !l.contains(' '))
                .map(str::to_owned)
                .collect();
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

/// Sets the default model after checking it against OpenCode's list.
pub async fn set_default_model(store: &Store, opencode: &Path, model: &str) -> Result<()> {
    let models = list_models(store, opencode, None, false).await?;
    if !models.iter().any(|m| m == model) {
        let provider = model.split('/').next().unwrap_or("");
        let near: Vec<&String> =
            models.iter().filter(|m| m.starts_with(provider)).take(10).collect();
        return Err(Error::Config(format!(
            "unknown model '{model}'; `taskbridge models` lists the {} models OpenCode offers{}",
            models.len(),
            if near.is_empty() {
                String::new()
            } else {
                format!(", e.g. {}", near.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
            }
        )));
    }
    store.set_setting("default_model", model)?;
    Ok(())
}
