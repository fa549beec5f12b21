//! Submitting: one task or a batch, checked whole (bounds, references, cycles, a shared budget)
//! before anything is written.

use super::*;

fn default_title(prompt: &str) -> String {
    let line = prompt.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut title: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        title.push('…');
    }
    title
}

fn validate(spec: &TaskSpec) -> Result<()> {
    if spec.prompt.trim().is_empty() {
        return Err(Error::invalid("prompt", "it is empty; describe the change you want made"));
    }
    if spec.prompt.len() > MAX_PROMPT_BYTES {
        return Err(Error::invalid(
            "prompt",
            format!(
                "it is {} bytes and the limit is {MAX_PROMPT_BYTES} (256 KiB); put large context \
                 in a file in the repository and refer to it",
                spec.prompt.len()
            ),
        ));
    }
    if !PRIORITY_RANGE.contains(&spec.priority) {
        return Err(Error::invalid(
            "priority",
            format!("{} is out of range; use an integer from -100 to 100", spec.priority),
        ));
    }
    if !(1..=20).contains(&spec.max_attempts) {
        return Err(Error::invalid(
            "max_attempts",
            format!("{} is out of range; use 1 to 20", spec.max_attempts),
        ));
    }
    if !(1..=7 * 86_400).contains(&spec.timeout_s) {
        return Err(Error::invalid(
            "timeout_s",
            format!("{} is out of range; use 1 to 604800 seconds", spec.timeout_s),
        ));
    }
    if let Some(q) = spec.question_timeout_s
        && q < 1
    {
        return Err(Error::invalid("question_timeout_s", "must be at least 1 second"));
    }
    if !Path::new(&spec.repo).is_absolute() {
        return Err(Error::invalid(
            "repo",
            format!("'{}' is not an absolute path to a repository", spec.repo),
        ));
    }
    if spec.base.trim().is_empty() {
        return Err(Error::invalid("base", "no base commit was resolved"));
    }
    if let Some(model) = &spec.model {
        let ok = model.split_once('/').is_some_and(|(p, m)| !p.is_empty() && !m.is_empty());
        if !ok {
            return Err(Error::invalid(
                "model",
                format!(
                    "'{model}' is not of the form provider/model, e.g. anthropic/claude-sonnet-4-5"
                ),
            ));
        }
    }
    if let Some(title) = &spec.title
        && title.chars().count() > 200
    {
        return Err(Error::invalid("title", "it is longer than 200 characters"));
    }
    if let Some(key) = &spec.request_id
        && (key.is_empty() || key.len() > 200)
    {
        return Err(Error::invalid("request_id", "use 1 to 200 characters"));
    }
    for rule in &spec.ask {
        parse_ask_rule(rule).map_err(|e| Error::invalid("ask", e))?;
    }
    validate_budget(&spec.budget)
}

fn validate_budget(b: &Budget) -> Result<()> {
    if let Some(c) = b.max_cost_usd
        && !(c > 0.0 && c.is_finite())
    {
        return Err(Error::invalid(
            "max_cost_usd",
            format!("{c} is not a positive amount of US dollars, e.g. 0.50"),
        ));
    }
    if let Some(t) = b.max_tokens
        && t < 1
    {
        return Err(Error::invalid(
            "max_tokens",
            format!("{t} is not a positive number of tokens"),
        ));
    }
    Ok(())
}

/// Finds a cycle among batch items (existing tasks cannot depend on new ones, so a cycle can only
/// run through the batch). Returns the path, e.g. `#0 -> #2 -> #0`.
fn batch_cycle(specs: &[TaskSpec]) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Closed,
    }
    fn visit(i: usize, specs: &[TaskSpec], marks: &mut [Mark], path: &mut Vec<usize>) -> bool {
        marks[i] = Mark::Open;
        path.push(i);
        for dep in &specs[i].depends_on {
            if let DepRef::Batch(j) = *dep {
                let mark = marks[j];
                if mark == Mark::Open {
                    path.push(j);
                    return true;
                }
                if mark == Mark::New && visit(j, specs, marks, path) {
                    return true;
                }
            }
        }
        path.pop();
        marks[i] = Mark::Closed;
        false
    }
    let mut marks = vec![Mark::New; specs.len()];
    for i in 0..specs.len() {
        let mut path = Vec::new();
        if marks[i] == Mark::New && visit(i, specs, &mut marks, &mut path) {
            let last = *path.last()?;
            let start = path.iter().position(|&p| p == last)?;
            return Some(path[start..].iter().map(|i| format!("#{i}")).collect());
        }
    }
    None
}

impl Store {
    /// Submits one task. With a `request_id` that was seen before, returns the first task and
    /// `false` instead of creating another.
    pub fn submit(&self, spec: TaskSpec) -> Result<(Task, bool)> {
        let mut out = self.submit_batch(vec![spec])?;
        out.pop().ok_or_else(|| Error::invalid("tasks", "nothing was submitted"))
    }

    /// Submits several tasks at once, all or none. Items may depend on each other by index
    /// (`DepRef::Batch`); a cycle is refused.
    pub fn submit_batch(&self, specs: Vec<TaskSpec>) -> Result<Vec<(Task, bool)>> {
        self.submit_batch_budgeted(specs, Budget::default())
    }

    /// [`Store::submit_batch`] with one budget shared by the batch's new tasks (each may also
    /// have its own).
    pub fn submit_batch_budgeted(
        &self,
        specs: Vec<TaskSpec>,
        shared: Budget,
    ) -> Result<Vec<(Task, bool)>> {
        validate_batch(&specs, &shared)?;
        let ids = self.write(|tx, now| {
            let group = insert_budget(tx, &shared, now)?;
            let ids = specs
                .iter()
                .map(|spec| insert_task(tx, spec, group, now))
                .collect::<Result<Vec<_>>>()?;
            for (spec, &(id, created)) in specs.iter().zip(&ids) {
                if created {
                    insert_deps(tx, spec, id, &ids)?;
                }
            }
            Ok(ids)
        })?;
        self.read(|conn| {
            ids.iter().map(|&(id, created)| Ok((load_task(conn, id)?, created))).collect()
        })
    }
}

/// A batch checked whole before anything is written: its shared budget, its size, each task
/// (named by its place when there are several), its references into itself, and no cycle.
fn validate_batch(specs: &[TaskSpec], shared: &Budget) -> Result<()> {
    validate_budget(shared)?;
    if specs.is_empty() {
        return Err(Error::invalid("tasks", "the batch is empty; give 1 to 20 tasks"));
    }
    for (i, spec) in specs.iter().enumerate() {
        validate(spec).map_err(|e| match e {
            Error::Invalid { field, message } if specs.len() > 1 => {
                Error::Invalid { field, message: format!("task #{i} of the batch: {message}") }
            }
            other => other,
        })?;
        for dep in &spec.depends_on {
            if let DepRef::Batch(j) = *dep
                && j >= specs.len()
            {
                return Err(Error::invalid(
                    "depends_on",
                    format!("'#{j}' names no item of this batch (it has {})", specs.len()),
                ));
            }
        }
    }
    match batch_cycle(specs) {
        Some(cycle) => Err(Error::DependencyCycle(cycle)),
        None => Ok(()),
    }
}

/// The batch's shared budget as a row its tasks point at, when it sets one.
fn insert_budget(tx: &mut dyn Tx, shared: &Budget, now: f64) -> Result<Option<i64>> {
    if !shared.is_set() {
        return Ok(None);
    }
    let row = tx.query_one(
        "INSERT INTO budgets (max_cost_usd, max_tokens, created_at)
         VALUES (?1, ?2, ?3) RETURNING id",
        args![shared.max_cost_usd, shared.max_tokens, now],
    )?;
    Ok(Some(row.get(0)?))
}

/// Inserts one task, queued; a request id seen before gives the first task back instead
/// (`false`: not created now).
fn insert_task(
    tx: &mut dyn Tx,
    spec: &TaskSpec,
    group: Option<i64>,
    now: f64,
) -> Result<(TaskId, bool)> {
    let title = spec
        .title
        .clone()
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| default_title(&spec.prompt));
    // ON CONFLICT makes a concurrent duplicate wait for the first one's commit instead of
    // failing.
    let inserted = tx.query_opt(
        "INSERT INTO tasks (title, prompt, repo, base, priority, model, agent, readonly,
            no_network, no_shell, worktree_keep, max_attempts, timeout_s,
            question_timeout_s, request_id, status, created_at, updated_at,
            ask_rules, max_cost_usd, max_tokens, budget_group, base_ref, parent,
            session_id, remote, worker_host)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
            'queued', ?16, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25)
         ON CONFLICT (request_id) DO NOTHING RETURNING id",
        args![
            title,
            &spec.prompt,
            &spec.repo,
            &spec.base,
            spec.priority,
            &spec.model,
            &spec.agent,
            spec.readonly,
            spec.no_network,
            spec.no_shell,
            spec.worktree_keep,
            spec.max_attempts,
            spec.timeout_s,
            spec.question_timeout_s,
            &spec.request_id,
            now,
            (!spec.ask.is_empty()).then(|| serde_json::Value::from(spec.ask.clone()).to_string()),
            spec.budget.max_cost_usd,
            spec.budget.max_tokens,
            group,
            &spec.base_ref,
            spec.parent.map(|p| p.0),
            &spec.session_id,
            &spec.remote,
            &spec.session_host,
        ],
    )?;
    if let Some(row) = inserted {
        tx.exec(
            "INSERT INTO counters (name, label, value) VALUES ('submitted', ?1, 1)
             ON CONFLICT (name, label) DO UPDATE SET value = counters.value + 1",
            args![agent_label(spec.agent.as_deref())],
        )?;
        return Ok((TaskId(row.get(0)?), true));
    }
    let key = spec.request_id.clone();
    let id: i64 = tx.query_one("SELECT id FROM tasks WHERE request_id = ?1", args![key])?.get(0)?;
    Ok((TaskId(id), false))
}

/// The edges from a new task `id` to what it depends on (`ids`: the batch's tasks by place),
/// each dependency checked to exist and still be able to finish.
fn insert_deps(tx: &mut dyn Tx, spec: &TaskSpec, id: TaskId, ids: &[(TaskId, bool)]) -> Result<()> {
    for dep in &spec.depends_on {
        let dep_id = match *dep {
            DepRef::Task(t) => t,
            DepRef::Batch(j) => ids[j].0,
        };
        if dep_id == id {
            return Err(Error::DependencyCycle(vec![id.to_string(), id.to_string()]));
        }
        // Locked, so that the dependency cannot fail between this check and the new edge (its
        // failure would not reach a task it cannot see yet).
        let status: Option<String> = tx
            .query_opt("SELECT status FROM tasks WHERE id = ?1 FOR UPDATE", args![dep_id.0])?
            .map(|r| r.get(0))
            .transpose()?;
        match status.as_deref() {
            None => {
                return Err(Error::invalid(
                    "depends_on",
                    format!("task {} does not exist", dep_id.0),
                ));
            }
            Some("failed") | Some("cancelled") => {
                return Err(Error::invalid(
                    "depends_on",
                    format!(
                        "task {} is {}, so this task could never run; retry it first",
                        dep_id.0,
                        status.unwrap_or_default()
                    ),
                ));
            }
            Some(_) => {}
        }
        tx.exec(
            "INSERT INTO task_deps (task_id, depends_on) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            args![id.0, dep_id.0],
        )?;
    }
    Ok(())
}
