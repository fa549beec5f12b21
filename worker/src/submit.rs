//! The `submit` operation shared by the CLI, the MCP server and the TUI: resolve the repository
//! and ref with git, then enqueue.

use crate::agent::{AgentKind, AgentSpec};
use crate::config::WorkerConfig;
use crate::error::Result;
use crate::git;
use crate::models::{ModelCheck, check_model};
use queue::{Store, Task, TaskSpec};
use std::path::{Path, PathBuf};

/// A submit request as front ends receive it: the task, with a repository path and a ref that
/// are not checked yet. `resolve` fills `spec.repo` and `spec.base` from them.
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub repo: PathBuf,
    /// Branch, tag or commit to start from; `HEAD` when `None`.
    pub base_ref: Option<String>,
    pub spec: TaskSpec,
}

impl SubmitRequest {
    pub fn new(prompt: impl Into<String>, repo: impl Into<PathBuf>) -> Self {
        SubmitRequest { repo: repo.into(), base_ref: None, spec: TaskSpec::new(prompt, "", "") }
    }

    /// Checks the repository and ref and produces the queue's spec.
    pub fn resolve(self, cwd: &Path) -> Result<TaskSpec> {
        if let Some(remote) = &self.spec.remote {
            crate::remote::check_remote(remote)?;
        }
        // A model reaches an agent's command line as the value of `-m`/`--model`: one that
        // starts with '-' would be read as another option.
        for (field, value) in [("model", &self.spec.model), ("agent", &self.spec.agent)] {
            if let Some(v) = value.as_deref().filter(|v| v.starts_with('-')) {
                return Err(crate::Error::Config(format!(
                    "invalid {field} {v:?}: it starts with '-', which the agent would read as \
                     an option; give its name (a model as provider/model, e.g. \
                     anthropic/claude-sonnet-4-5)"
                )));
            }
        }
        let repo = if self.repo.is_absolute() { self.repo } else { cwd.join(&self.repo) };
        let resolved = git::resolve_repo(&repo, self.base_ref.as_deref())?;
        let mut spec = self.spec;
        // The repository's own `ask` rules join the task's.
        let repo_cfg = crate::config::RepoConfig::at(&resolved.toplevel, &resolved.base)
            .map_err(crate::Error::Config)?;
        for rule in repo_cfg.permissions.ask {
            if !spec.ask.contains(&rule) {
                spec.ask.push(rule);
            }
        }
        // The remote a worker elsewhere fetches from: the one given, else `origin`.
        let remote = spec.remote.clone().or_else(|| crate::remote::origin_url(&resolved.toplevel));
        Ok(TaskSpec {
            repo: resolved.toplevel.display().to_string(),
            base: resolved.base,
            base_ref: resolved.branch,
            remote,
            ..spec
        })
    }
}

/// What a submit stored, and what the submitter should hear about it.
#[derive(Debug)]
pub struct Submitted {
    /// Each task, and false for one that already existed under the same `request_id`.
    pub tasks: Vec<(Task, bool)>,
    /// Things that do not stop the submit but would surprise the user later: no worker is
    /// alive to run it, a model that could not be checked here.
    pub warnings: Vec<String>,
}

/// Submits several requests, all or none. Each `model` is checked against the models the
/// OpenCode of `cfg` offers (an unknown one refuses the whole batch).
pub fn submit_batch(
    store: &Store,
    cwd: &Path,
    cfg: &WorkerConfig,
    reqs: Vec<SubmitRequest>,
    shared: queue::Budget,
) -> Result<Submitted> {
    let mut warnings = Vec::new();
    let mut reqs = reqs;
    for r in &mut reqs {
        r.spec.agent = check_agent(&r.spec, cfg)?.stored();
    }
    let mut checked = std::collections::BTreeSet::new();
    // OpenCode's models are checked against its list; the other agents take their own names.
    let opencode_models =
        reqs.iter().filter(|r| kind_of(&r.spec, &cfg.agents) == AgentKind::OpenCode);
    for model in opencode_models.filter_map(|r| r.spec.model.as_deref()) {
        if checked.insert(model.to_owned())
            && let ModelCheck::Unverified(why) = check_model(store, &cfg.opencode, model)?
        {
            warnings.push(format!("model '{model}' was not checked ({why}); its worker will be"));
        }
    }
    let specs = reqs.into_iter().map(|r| r.resolve(cwd)).collect::<Result<Vec<_>>>()?;
    for spec in &specs {
        check_codex_rules(spec)?;
        warnings.extend(check_sandbox(spec, cfg.sandbox.mode, crate::sandbox::Kernel::probe())?);
    }
    if store.location().is_shared() {
        // Workers on other hosts must be able to fetch each base: checked (and pushed when
        // needed) before anything is stored, so a refusal stores nothing.
        let mut seen = std::collections::BTreeSet::new();
        for spec in &specs {
            match &spec.remote {
                Some(remote)
                    if seen.insert((spec.repo.clone(), remote.clone(), spec.base.clone())) =>
                {
                    if let Some(pushed) =
                        crate::remote::ensure_fetchable(Path::new(&spec.repo), remote, &spec.base)?
                    {
                        warnings.push(format!(
                            "the base {} was on no ref of {remote}; pushed it to {pushed} so that \
                             workers on other hosts can fetch it",
                            &spec.base[..spec.base.len().min(12)]
                        ));
                    }
                }
                Some(_) => {}
                None => warnings.push(format!(
                    "{} has no remote (no origin and no --remote), so only a worker on this \
                     host ({}) can run the task",
                    spec.repo,
                    crate::config::hostname(&cfg.env)
                )),
            }
        }
    }
    let mut looked = std::collections::BTreeSet::new();
    for spec in &specs {
        if !looked.insert(spec.repo.clone()) {
            continue;
        }
        let dirty = crate::git::uncommitted(Path::new(&spec.repo)).unwrap_or_default();
        if let Some(w) = uncommitted_warning(&spec.repo, &dirty) {
            warnings.push(w);
        }
    }
    let wanted: std::collections::BTreeSet<String> = specs
        .iter()
        .map(|s| AgentSpec::from_stored(s.agent.as_deref(), &cfg.agents))
        .filter(|a| a.kind != AgentKind::OpenCode)
        .map(|a| a.name().to_owned())
        .collect();
    let tasks = store.submit_batch_budgeted(specs, shared)?;
    let workers = store.list_workers()?;
    let live: Vec<_> = workers.iter().filter(|w| !w.stopped && !w.stale).collect();
    for agent in wanted {
        if !live.is_empty() && !live.iter().any(|w| w.agents.contains(&agent)) {
            let (has, fix) = match cfg.agent(&agent) {
                Some(_) => {
                    (format!("[agents.{agent}] in its config"), "configure it on a worker's host")
                }
                None => (format!("the {agent} CLI"), "install it on a worker's host"),
            };
            warnings.push(format!(
                "no running worker has {has}, so the task will fail saying what to install or \
                 configure: {fix} and restart that worker first (`taskbridge list-workers` \
                 shows what each runs)"
            ));
        }
    }
    let alive = live.len();
    if alive == 0 && tasks.iter().any(|(t, _)| !t.status.is_terminal()) {
        warnings.push(
            "no worker is running, so the task waits in the queue: start one with `taskbridge \
             worker` (or `taskbridge tui`, or `taskbridge service install` to keep one running)"
                .into(),
        );
    }
    Ok(Submitted { tasks, warnings })
}

/// The agent a task names, refused when it is unknown or its CLI is missing here (with the
/// command that installs it). OpenCode's own CLI is checked by its model check and its worker.
fn check_agent(spec: &TaskSpec, cfg: &WorkerConfig) -> Result<AgentSpec> {
    let agent = AgentSpec::resolve(spec.agent.as_deref().unwrap_or(""), &cfg.agents)
        .map_err(crate::Error::Config)?;
    if let Some(configured) = agent.configured.as_deref().and_then(|n| cfg.agent(n))
        && let Some(missing) = configured.missing(&cfg.env)
    {
        return Err(crate::Error::Config(missing));
    }
    if !matches!(agent.kind, AgentKind::OpenCode | AgentKind::Acp)
        && let Some(missing) = agent.kind.missing(cfg.program(agent.kind), &cfg.env)
    {
        return Err(crate::Error::Config(missing));
    }
    Ok(agent)
}

/// The agent of a spec [`check_agent`] has normalised.
fn kind_of(spec: &TaskSpec, agents: &[crate::ConfiguredAgent]) -> AgentKind {
    AgentSpec::resolve(spec.agent.as_deref().unwrap_or(""), agents)
        .map_or(AgentKind::OpenCode, |a| a.kind)
}

/// What `codex exec` cannot honour is refused before it is queued, rather than quietly not
/// held: it always has a shell, and it cannot stop to ask for an approval.
fn check_codex_rules(spec: &TaskSpec) -> Result<()> {
    if kind_of(spec, &[]) != AgentKind::Codex {
        return Ok(());
    }
    if spec.no_shell {
        return Err(crate::Error::Config(
            "codex cannot run without its shell (codex exec has no way to turn it off): drop \
             no_shell, or use agent opencode or claude-code, which remove their shell tools"
                .into(),
        ));
    }
    if !spec.ask.is_empty() {
        return Err(crate::Error::Config(format!(
            "codex cannot ask for approval (codex exec has no approvals), so the ask rules {} \
             (the task's and the repository's .taskbridge.toml) could not hold: use agent \
             opencode or claude-code, which wait for an answer",
            spec.ask.join(", ")
        )));
    }
    Ok(())
}

/// Submits one request; see [`submit_batch`].
/// How many uncommitted paths a warning names before it counts the rest.
const DIRTY_NAMED: usize = 3;

/// The warning for a submit from a repository whose working tree has `dirty` paths: a task
/// starts from a commit, so the agent will not see them.
fn uncommitted_warning(repo: &str, dirty: &[String]) -> Option<String> {
    if dirty.is_empty() {
        return None;
    }
    let named = dirty.iter().take(DIRTY_NAMED).cloned().collect::<Vec<_>>().join(", ");
    let rest = match dirty.len().saturating_sub(DIRTY_NAMED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "{repo} has {} uncommitted change{} the agent will not see, since a task starts from a \
         commit: {named}{rest}; commit them first if the task needs them",
        dirty.len(),
        if dirty.len() == 1 { "" } else { "s" }
    ))
}

pub fn submit(
    store: &Store,
    cwd: &Path,
    cfg: &WorkerConfig,
    req: SubmitRequest,
) -> Result<(Task, bool, Vec<String>)> {
    let mut out = submit_batch(store, cwd, cfg, vec![req], queue::Budget::default())?;
    let (task, created) =
        out.tasks.pop().ok_or_else(|| crate::Error::Config("nothing was submitted".into()))?;
    Ok((task, created, out.warnings))
}

/// A rule only the kernel can hold, asked of a host whose kernel cannot: refused in `enforce`
/// mode (nothing is stored), said as a warning in `warn` mode.
fn check_sandbox(
    spec: &TaskSpec,
    mode: crate::sandbox::Mode,
    kernel: crate::sandbox::Kernel,
) -> Result<Vec<String>> {
    use crate::sandbox::Mode;
    if mode == Mode::Off {
        return Ok(vec![]);
    }
    let mut warnings = Vec::new();
    for (flag, why) in kernel.unheld(spec.readonly, spec.no_network) {
        if mode == Mode::Enforce {
            return Err(crate::Error::Config(format!(
                "refused {flag}: {why}; submit it where the kernel can, or set [sandbox] mode = \
                 \"warn\" to run it with the agent's own rules only"
            )));
        }
        warnings.push(format!("{flag} is held by the agent's own rules only: {why}"));
    }
    Ok(warnings)
}

/// `followup_task`: a new task that refines a done or failed task in its own agent session, on
/// a new branch that starts from its commit (a failed task's worktree is committed to its branch
/// first, so the follow-up starts from what it left and nothing is lost).
pub fn followup(store: &Store, parent: queue::TaskId, prompt: &str) -> Result<Task> {
    use queue::TaskStatus;
    let p = store.get(parent)?;
    if !matches!(p.status, TaskStatus::Done | TaskStatus::Failed) {
        return Err(crate::Error::Repo(format!(
            "task {} is {}; a follow-up needs a done or failed task (wait for it, answer it, or \
             add a note instead)",
            parent.0, p.display_status
        )));
    }
    let Some(session) = p.session_id.clone() else {
        return Err(crate::Error::Repo(format!(
            "task {} never started an agent session, so there is nothing to follow up; retry it",
            parent.0
        )));
    };
    let res = p.result.clone().unwrap_or_default();
    let left_in_worktree = match (&p.status, &p.worktree, &p.branch) {
        (TaskStatus::Failed, Some(wt), Some(branch)) if Path::new(wt).exists() => {
            let msg = format!("taskbridge: task {} (its work when it failed)", parent.0);
            // A worktree whose git metadata the agent changed is not read: the follow-up
            // starts from what the branch holds.
            match git::Checkout::open(Path::new(&p.repo), Path::new(wt)) {
                Ok(checkout) => match checkout.commit_all(branch, &msg)? {
                    Some(sha) => Some(sha),
                    None => checkout.branch_tip(branch).ok().map(|c| c.id().to_string()),
                },
                Err(crate::Error::Tampered(_)) => None,
                Err(e) => return Err(e),
            }
        }
        _ => None,
    };
    let base = left_in_worktree
        .or(res.commit.clone())
        .or(p.started_from.clone())
        .unwrap_or_else(|| p.base.clone());
    let mut spec = TaskSpec::new(prompt, p.repo.clone(), base);
    let first = prompt.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let short: String = first.chars().take(60).collect();
    spec.title = Some(format!("Follow-up to #{}: {short}", parent.0));
    spec.parent = Some(parent);
    spec.session_id = Some(session);
    spec.session_host = p.worker_host.clone();
    spec.model = p.model.clone();
    spec.agent = p.agent.clone();
    spec.readonly = p.readonly;
    spec.no_network = p.no_network;
    spec.no_shell = p.no_shell;
    spec.ask = p.ask_rules.clone();
    spec.base_ref = p.base_ref.clone();
    spec.remote = p.remote.clone();
    spec.max_attempts = p.max_attempts;
    spec.timeout_s = p.timeout_s;
    spec.question_timeout_s = p.question_timeout_s;
    // Its base is the parent's work: on a shared queue a worker elsewhere must reach it too.
    if store.location().is_shared()
        && let Some(remote) = &spec.remote
        && Path::new(&spec.repo).exists()
    {
        crate::remote::ensure_fetchable(Path::new(&spec.repo), remote, &spec.base)?;
    }
    Ok(store.submit(spec)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Kernel, Mode};

    #[test]
    fn a_rule_the_kernel_cannot_hold_is_refused_when_enforced_and_warned_otherwise() {
        let mut spec = TaskSpec::new("p", "/r", "b");
        spec.no_network = true;
        let old = Kernel { landlock_abi: 3, network_namespaces: false };
        let e = check_sandbox(&spec, Mode::Enforce, old).unwrap_err().to_string();
        assert!(
            e.contains("refused no_network") && e.contains("ABI 3") && e.contains("warn"),
            "{e}"
        );
        let w = check_sandbox(&spec, Mode::Warn, old).unwrap();
        assert!(w.len() == 1 && w[0].starts_with("no_network is held by the agent"), "{w:?}");
        assert!(check_sandbox(&spec, Mode::Off, old).unwrap().is_empty());
        assert!(
            check_sandbox(
                &spec,
                Mode::Enforce,
                Kernel { landlock_abi: 4, network_namespaces: false }
            )
            .unwrap()
            .is_empty()
        );
        spec.no_network = false;
        spec.readonly = true;
        let none = Kernel { landlock_abi: 0, network_namespaces: false };
        assert!(
            check_sandbox(&spec, Mode::Enforce, none)
                .unwrap_err()
                .to_string()
                .contains("refused readonly")
        );
        spec.readonly = false;
        assert!(check_sandbox(&spec, Mode::Enforce, none).unwrap().is_empty(), "no rule asked");
    }
}
