//! Turning an agent's failure into an error a person can act on: which model, which provider,
//! which endpoint, what to do, and whether another attempt could help. A pure function of what
//! the run reported, so every case is tested without a model.

use crate::events::AgentError;
use queue::FailureKind;

/// What the worker records for a failed run.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnosis {
    pub message: String,
    /// False for causes no retry can change (credentials, an unknown model, the configuration):
    /// the task fails at once instead of spending its attempts.
    pub retryable: bool,
    /// What kind of failure it was, for metrics and the stats view.
    pub kind: FailureKind,
}

/// Which model the run used, as far as TaskBridge knows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelUsed {
    /// What TaskBridge passed with `-m` (the task's model or the default one), if anything.
    pub requested: Option<String>,
    /// What OpenCode's log said it used.
    pub seen: Option<String>,
}

impl ModelUsed {
    fn describe(&self, url: Option<&str>) -> String {
        let model = self.requested.as_deref().or(self.seen.as_deref());
        let provider = model.and_then(|m| m.split('/').next());
        let endpoint = url.map_or_else(|| "its default endpoint".to_owned(), str::to_owned);
        match (model, &self.requested) {
            (Some(m), Some(_)) => {
                format!("model {m} (provider {}, endpoint {endpoint})", provider.unwrap_or("?"))
            }
            (Some(m), None) => format!(
                "OpenCode's own default model {m} (provider {}, endpoint {endpoint}; no model is \
                 configured in TaskBridge)",
                provider.unwrap_or("?")
            ),
            (None, _) => format!(
                "OpenCode's own default model (no model is configured in TaskBridge; endpoint \
                 {endpoint})"
            ),
        }
    }
}

const SET_UP: &str = "set up a provider you can reach (`opencode auth login`, or its API key \
such as ANTHROPIC_API_KEY in the worker's environment) and choose its model with `taskbridge \
set-default-model PROVIDER/MODEL` or `submit --model` (`taskbridge list-models` lists them)";

fn is_connection(e: &AgentError) -> bool {
    let m = e.message.to_ascii_lowercase();
    [
        "cannot connect",
        "unable to connect",
        "econnrefused",
        "fetch failed",
        "timed out",
        "timeout",
        "enotfound",
        "network",
    ]
    .iter()
    .any(|k| m.contains(k))
}

/// Explains an agent error event.
pub fn agent_error(e: &AgentError, model: &ModelUsed) -> Diagnosis {
    let who = model.describe(e.url.as_deref());
    let said = match e.status {
        Some(code) => format!("{} (HTTP {code}): {}", e.name, e.message),
        None => format!("{}: {}", e.name, e.message),
    };
    if e.name == "ProviderAuthError" || matches!(e.status, Some(401 | 403)) {
        return Diagnosis {
            message: format!(
                "the provider refused the credentials for {who}: {said}. Log in with `opencode \
                 auth login` or set the provider's API key (such as ANTHROPIC_API_KEY) in the \
                 worker's environment; or choose another provider's model with `taskbridge \
                 set-default-model PROVIDER/MODEL` or `submit --model` (`taskbridge \
                 list-models` lists them)"
            ),
            retryable: false,
            kind: FailureKind::Auth,
        };
    }
    if matches!(e.status, Some(404)) || e.message.to_ascii_lowercase().contains("model not found") {
        return Diagnosis {
            message: format!("the provider does not know {who}: {said}. {}", cap(SET_UP)),
            retryable: false,
            kind: FailureKind::Model,
        };
    }
    if e.status.is_none() && is_connection(e) {
        return Diagnosis {
            message: format!(
                "could not reach {who}: {said}. Check the network and the provider's endpoint; \
                 if this model is not the one you meant, {SET_UP}"
            ),
            retryable: true,
            kind: FailureKind::Connection,
        };
    }
    if matches!(e.status, Some(400 | 422)) {
        return Diagnosis {
            message: format!("{who} refused the request: {said}"),
            retryable: false,
            kind: FailureKind::Provider,
        };
    }
    Diagnosis {
        message: format!("{said} ({who})"),
        retryable: e.retryable.unwrap_or(true),
        kind: FailureKind::Provider,
    }
}

/// Explains a Claude Code or Codex process that exited non-zero without an error event.
pub fn cli_exit_failure(agent: &str, code: Option<i32>, stderr_tail: &str) -> Diagnosis {
    let how = code.map_or("a signal".to_owned(), |c| format!("status {c}"));
    let tail = if stderr_tail.is_empty() { String::new() } else { format!(": {stderr_tail}") };
    Diagnosis {
        message: format!("{agent} exited with {how}{tail}"),
        retryable: true,
        kind: FailureKind::Exit,
    }
}

/// Explains a run that exited non-zero without an error event: OpenCode's own start-up errors
/// (its configuration, an unknown agent) are not worth retrying.
pub fn exit_failure(code: Option<i32>, stderr_tail: &str) -> Diagnosis {
    let how = code.map_or("a signal".to_owned(), |c| format!("status {c}"));
    let tail = if stderr_tail.is_empty() { String::new() } else { format!(": {stderr_tail}") };
    let config = ["ConfigInvalidError", "ConfigJsonError", "Config file", "Invalid config"]
        .iter()
        .any(|k| stderr_tail.contains(k));
    if config {
        return Diagnosis {
            message: format!(
                "OpenCode's configuration is invalid (fix the file it names, or \
                 OPENCODE_CONFIG_CONTENT); opencode exited with {how}{tail}"
            ),
            retryable: false,
            kind: FailureKind::Launch,
        };
    }
    Diagnosis {
        message: format!("opencode exited with {how}{tail}"),
        retryable: true,
        kind: FailureKind::Exit,
    }
}

fn cap(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or_else(String::new, |f| f.to_uppercase().collect::<String>() + c.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(name: &str, message: &str, status: Option<i64>, url: Option<&str>) -> AgentError {
        AgentError {
            name: name.into(),
            message: message.into(),
            status,
            retryable: None,
            url: url.map(Into::into),
        }
    }

    #[test]
    fn no_model_configured_names_opencodes_default_and_its_endpoint_and_keeps_retrying() {
        let e = err(
            "APIError",
            "Cannot connect to API: Was there a typo in the url or port?",
            None,
            Some("https://opencode.ai/zen/v1/chat/completions"),
        );
        let used = ModelUsed { requested: None, seen: Some("opencode/big-pickle".into()) };
        let d = agent_error(&e, &used);
        assert!(d.retryable);
        for part in [
            "OpenCode's own default model opencode/big-pickle",
            "provider opencode",
            "https://opencode.ai/zen/v1/chat/completions",
            "no model is configured",
            "opencode auth login",
            "--model",
        ] {
            assert!(d.message.contains(part), "'{part}' missing from: {}", d.message);
        }
    }

    #[test]
    fn bad_credentials_fail_at_once_and_say_how_to_log_in() {
        let e = err("APIError", "invalid x-api-key", Some(401), None);
        let used = ModelUsed { requested: Some("anthropic/claude-sonnet-4-5".into()), seen: None };
        let d = agent_error(&e, &used);
        assert!(!d.retryable);
        assert!(d.message.contains("model anthropic/claude-sonnet-4-5 (provider anthropic"));
        assert!(d.message.contains("HTTP 401") && d.message.contains("opencode auth login"));
        assert_eq!(d.message.matches("auth login").count(), 1, "the advice once: {}", d.message);
        assert_eq!(d.message.matches("API key").count(), 1, "{}", d.message);
        let d = agent_error(&err("ProviderAuthError", "no key", None, None), &used);
        assert!(!d.retryable);
    }

    #[test]
    fn rate_limits_and_server_errors_are_retried_bad_requests_are_not() {
        let used = ModelUsed::default();
        assert!(agent_error(&err("APIError", "slow down", Some(429), None), &used).retryable);
        assert!(agent_error(&err("APIError", "overloaded", Some(529), None), &used).retryable);
        assert!(!agent_error(&err("APIError", "bad", Some(400), None), &used).retryable);
        assert!(!agent_error(&err("APIError", "no such model", Some(404), None), &used).retryable);
    }

    #[test]
    fn an_invalid_opencode_config_is_not_retried() {
        let d = exit_failure(Some(1), "Error: ConfigInvalidError: opencode.json: bad key");
        assert!(!d.retryable && d.message.contains("configuration is invalid"), "{d:?}");
        assert!(exit_failure(Some(1), "something transient").retryable);
    }

    #[test]
    fn each_failure_has_the_kind_dashboards_group_it_by() {
        let used = ModelUsed::default();
        let kind =
            |name: &str, msg: &str, status| agent_error(&err(name, msg, status, None), &used).kind;
        assert_eq!(kind("APIError", "invalid x-api-key", Some(401)), FailureKind::Auth);
        assert_eq!(kind("ProviderAuthError", "no key", None), FailureKind::Auth);
        assert_eq!(kind("APIError", "no such model", Some(404)), FailureKind::Model);
        assert_eq!(kind("APIError", "fetch failed", None), FailureKind::Connection);
        assert_eq!(kind("APIError", "bad", Some(400)), FailureKind::Provider);
        assert_eq!(kind("APIError", "overloaded", Some(529)), FailureKind::Provider);
        assert_eq!(exit_failure(Some(1), "ConfigInvalidError").kind, FailureKind::Launch);
        assert_eq!(exit_failure(Some(1), "transient").kind, FailureKind::Exit);
        assert_eq!(cli_exit_failure("codex", Some(2), "").kind, FailureKind::Exit);
    }
}
