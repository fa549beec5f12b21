//! Shared set-up for the end-to-end tests: a temporary home, a real git repository, the real
//! OpenCode CLI pointed at the loopback mock, and helpers to run the real binary.
#![allow(dead_code, clippy::unwrap_used)]

pub mod mock_anthropic;
pub mod mock_openai;

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const MODEL: &str = "anthropic/claude-sonnet-4-5";

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_taskbridge"))
}

/// The pinned OpenCode CLI that `.ci/run` installs, or `TASKBRIDGE_TEST_OPENCODE`.
pub fn opencode() -> PathBuf {
    if let Some(p) = std::env::var_os("TASKBRIDGE_TEST_OPENCODE") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".tools/node_modules/opencode-ai/bin/opencode.exe");
    assert!(
        p.exists(),
        "the OpenCode CLI is not installed at {}: run `npm install --prefix .tools opencode-ai@1.18.33` \
         (what .ci/run does) or set TASKBRIDGE_TEST_OPENCODE",
        p.display()
    );
    p
}

/// The tool results the model was sent in a request (its last user message), as text.
#[allow(dead_code)]
pub fn tool_results(req: &Value) -> String {
    let last = req["messages"].as_array().unwrap().last().unwrap();
    last["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .map(|b| b["content"].to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// The pinned OpenCode 2 CLI (npm `@opencode/cli`) that `.ci/run` installs beside OpenCode 1.
#[allow(dead_code)]
pub fn opencode2() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/oc2/node_modules/.bin/opencode");
    assert!(
        p.exists(),
        "OpenCode 2 is not installed at {}: run `npm install --prefix .tools/oc2 @opencode/cli@2.1.2` \
         (what .ci/run does)",
        p.display()
    );
    p
}

/// The pinned Claude Code CLI that `.ci/run` installs.
/// The Python with the official MCP SDK (`.venv`, which `.ci/run` makes).
#[allow(dead_code)]
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TASKBRIDGE_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        p.exists(),
        "the Python MCP SDK is not installed: run `python3 -m venv .venv && .venv/bin/pip install \
         mcp==1.30.0` (what .ci/run does) or set TASKBRIDGE_TEST_PYTHON"
    );
    p
}

/// A result's files_touched as (path, status), sorted.
pub fn files_touched(r: &Value) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = r["files_touched"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap().to_owned(), f["status"].as_str().unwrap().to_owned()))
        .collect();
    files.sort();
    files
}

/// The labels of the options an ask's first question offers.
pub fn option_labels(ask: &Value) -> Vec<String> {
    ask["questions"][0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["label"].as_str().unwrap().to_owned())
        .collect()
}

/// The pinned Codex CLI that `.ci/run` installs.
pub fn codex_cli() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/node_modules/.bin/codex");
    assert!(
        p.exists(),
        "Codex is not installed at {}: run `npm install --prefix .tools @openai/codex@0.171.0` \
         (what .ci/run does)",
        p.display()
    );
    p
}

pub fn claude_cli() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/node_modules/.bin/claude");
    assert!(
        p.exists(),
        "Claude Code is not installed at {}: run `npm install --prefix .tools \
         @anthropic-ai/claude-code@2.1.197` (what .ci/run does)",
        p.display()
    );
    p
}

pub fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git").args(args).current_dir(dir).envs(git_env()).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A git repository at `dir` (made if missing) on branch `main`, with one commit of one file: a
/// repository beside the world's own.
#[allow(dead_code)]
pub fn repo_with_one_commit(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("a.txt"), "a\n").unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "-qm", "init"]);
}

pub fn git_out(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).envs(git_env()).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn git_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("GIT_CONFIG_NOSYSTEM", "1"),
        ("GIT_AUTHOR_NAME", "Test"),
        ("GIT_AUTHOR_EMAIL", "test@example.invalid"),
        ("GIT_COMMITTER_NAME", "Test"),
        ("GIT_COMMITTER_EMAIL", "test@example.invalid"),
    ]
}

/// A temporary world: home, repository, and an isolated HOME for OpenCode.
pub struct Env {
    /// More environment for every command (an agent's endpoint and key, say).
    pub extra_env: Vec<(String, String)>,
    /// Variables every command runs without.
    pub unset_env: Vec<String>,
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    pub repo: PathBuf,
    pub oc_home: PathBuf,
    pub opencode_config: Option<String>,
    /// The OpenCode CLI every command names (TASKBRIDGE_OPENCODE): the pinned 1.x unless set.
    pub opencode_bin: Option<PathBuf>,
    /// `--db` for every command (TASKBRIDGE_DB): a PostgreSQL schema of its own, see
    /// [`Env::on_postgres`]; `None` for the home's SQLite file.
    pub db: Option<String>,
    /// This world made the schema and drops it.
    owns_db: bool,
    /// Whether the agents' wall lets them write in `dir` (where the stand-in agents of most
    /// tests record their calls): every world but the sandbox's own tests. The home is in a
    /// directory of its own either way, so it stays outside the wall.
    pub scratch_writable: bool,
    _home_dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let home_dir = tempfile::tempdir().unwrap();
        let home = home_dir.path().join("tbhome");
        let repo = dir.path().join("repo");
        let oc_home = dir.path().join("ochome");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::create_dir_all(&oc_home).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("README.md"), "# Demo\n\nHello from the demo.\n").unwrap();
        std::fs::write(repo.join("test.sh"), "#!/bin/sh\ngrep -q greeting hello.txt && echo ok\n")
            .unwrap();
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-qm", "initial"]);
        let repo = repo.canonicalize().unwrap();
        Env {
            extra_env: Vec::new(),
            unset_env: Vec::new(),
            dir,
            home,
            repo,
            oc_home,
            opencode_config: None,
            opencode_bin: None,
            db: None,
            owns_db: false,
            scratch_writable: true,
            _home_dir: home_dir,
        }
    }

    /// The same world with its queue in a fresh schema on the test PostgreSQL server, which
    /// is dropped with the world.
    pub fn on_postgres(mut self) -> Env {
        self.db = Some(pg_schema_url());
        self.owns_db = true;
        self
    }

    /// The same world on the queue `db` (which it does not drop).
    pub fn with_db(mut self, db: &str) -> Env {
        self.db = Some(db.to_owned());
        self
    }

    /// A second world (its own home, repository and agent home) on this one's queue: another
    /// host, as far as the queue can tell.
    pub fn sharing_queue(&self) -> Env {
        let mut other = Env::new();
        other.db = self.db.clone();
        other
    }

    /// Claude Code (the pinned CLI) pointed at `mock`, as a user points it at an endpoint: its
    /// base URL and a token in the environment.
    pub fn with_claude(mut self, mock: &mock_anthropic::MockAnthropic) -> Env {
        let cli = claude_cli().display().to_string();
        for (k, v) in [
            ("TASKBRIDGE_CLAUDE", cli),
            ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{}", mock.port)),
            ("ANTHROPIC_AUTH_TOKEN", "test-token".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
        ] {
            self.extra_env.push((k.into(), v));
        }
        // The README says a worker running as root needs no IS_SANDBOX for Claude Code; the
        // tests run without it whatever the environment has (some containers set it).
        self.unset_env.push("IS_SANDBOX".into());
        self
    }

    /// Codex (the pinned CLI) with `mock` as its provider, in a `CODEX_HOME/config.toml` of
    /// this world's, and a key in the environment.
    pub fn with_codex(mut self, mock: &mock_openai::MockOpenAi) -> Env {
        let codex_home = self.oc_home.join(".codex");
        std::fs::create_dir_all(&codex_home).unwrap();
        std::fs::write(codex_home.join("config.toml"), mock.codex_config()).unwrap();
        let cli = codex_cli().display().to_string();
        for (k, v) in [
            ("TASKBRIDGE_CODEX", cli),
            ("CODEX_HOME", codex_home.display().to_string()),
            ("OPENAI_API_KEY", "sk-test".into()),
        ] {
            self.extra_env.push((k.into(), v));
        }
        self
    }

    pub fn with_mock(mut self, mock: &mock_anthropic::MockAnthropic) -> Env {
        self.opencode_config = Some(mock.opencode_config());
        self
    }

    /// [`Env::with_mock`] with OpenCode 2 as the OpenCode on the worker's path.
    #[allow(dead_code)]
    pub fn with_opencode2(mut self, mock: &mock_anthropic::MockAnthropic) -> Env {
        self.opencode_bin = Some(opencode2());
        self.with_mock(mock)
    }

    /// `taskbridge` with this world's environment.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        self.apply_env(&mut c);
        c.current_dir(&self.repo);
        c
    }

    /// Starts `taskbridge worker`; it is killed when the guard drops.
    pub fn start_worker(&self, concurrency: usize) -> Child {
        self.start_worker_with(concurrency, &[])
    }

    /// `taskbridge worker` with more flags (`--opencode serve`, say).
    pub fn start_worker_with(&self, concurrency: usize, extra: &[&str]) -> Child {
        let child = self
            .cmd()
            .args(["worker", "--concurrency", &concurrency.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Child(child)
    }

    fn apply_env(&self, c: &mut Command) {
        let oc = &self.oc_home;
        c.env("TASKBRIDGE_HOME", &self.home)
            .env("TASKBRIDGE_MODEL", MODEL)
            .env("TASKBRIDGE_RETRY_BASE_MS", "50")
            .env("TASKBRIDGE_LOG", "debug")
            .env("HOME", oc)
            .env("XDG_CONFIG_HOME", oc.join(".config"))
            .env("XDG_DATA_HOME", oc.join(".local/share"))
            .env("XDG_CACHE_HOME", oc.join(".cache"))
            .env("XDG_STATE_HOME", oc.join(".local/state"))
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
            // OpenCode installs a plugin package in the background on first run; point npm at a
            // closed loopback port so nothing leaves the machine.
            .env("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")
            .env("npm_config_registry", "http://127.0.0.1:9/")
            .envs(git_env())
            .env_remove("TASKBRIDGE_TOKEN")
            .env_remove("ANTHROPIC_API_KEY");
        c.env_remove("TASKBRIDGE_CLAUDE").env_remove("TASKBRIDGE_CODEX");
        c.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
        for k in &self.unset_env {
            c.env_remove(k);
        }
        if self.scratch_writable {
            c.env("TASKBRIDGE_SANDBOX_WRITABLE", self.dir.path());
        }
        match &self.db {
            Some(db) => c.env("TASKBRIDGE_DB", db),
            None => c.env_remove("TASKBRIDGE_DB"),
        };
        if let Some(cfg) = &self.opencode_config {
            let bin = self.opencode_bin.clone().unwrap_or_else(opencode);
            c.env("TASKBRIDGE_OPENCODE", bin).env("OPENCODE_CONFIG_CONTENT", cfg);
        }
    }

    /// The environment `cmd()` sets, for a process started by another program (e.g. an MCP
    /// client that launches `taskbridge mcp`). PATH is passed through.
    pub fn env_vars(&self) -> Vec<(String, String)> {
        let mut c = Command::new("true");
        self.apply_env(&mut c);
        let mut vars: Vec<(String, String)> = c
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned())))
            .collect();
        vars.push(("PATH".into(), std::env::var("PATH").unwrap_or_default()));
        vars
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    /// Runs and expects success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "taskbridge {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `taskbridge worker --once` (with `extra` flags) with `agent` as OpenCode in run mode (a
    /// stand-in script, usually): runs the queue until nothing is runnable, and must succeed.
    pub fn run_queue_with(&self, agent: &Path, extra: &[&str]) {
        let out = self
            .cmd()
            .args(["worker", "--once"])
            .args(extra)
            .env("TASKBRIDGE_OPENCODE", agent)
            .env("TASKBRIDGE_OPENCODE_MODE", "run")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn submit(&self, args: &[&str]) -> i64 {
        let mut all = vec!["submit"];
        all.extend_from_slice(args);
        self.ok(&all).trim().parse().unwrap()
    }

    /// The token the home's HTTP servers ask for by default (made by the first one started).
    pub fn token(&self) -> String {
        let path = self.home.join("token");
        assert!(eventually(Duration::from_secs(10), || path.exists()), "no token in the home");
        std::fs::read_to_string(path).unwrap().trim().to_owned()
    }

    pub fn show(&self, id: i64) -> Value {
        serde_json::from_str(&self.ok(&["show", &id.to_string(), "--json"])).unwrap()
    }

    /// Polls `show` until `pred` holds; panics with the last state after `timeout`.
    pub fn wait_task(&self, id: i64, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let timeout = guard(timeout);
        let start = Instant::now();
        loop {
            let t = self.show(id);
            if pred(&t) {
                return t;
            }
            if start.elapsed() > timeout {
                let log = std::fs::read_to_string(self.home.join(format!("logs/{id}.log")))
                    .unwrap_or_default();
                panic!(
                    "task {id} did not reach the expected state in {timeout:?}: {t:#}\nlog:\n{log}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_status(&self, id: i64, status: &str, timeout: Duration) -> Value {
        self.wait_task(id, timeout, |t| t["status"] == status)
    }

    /// Task `id`'s worktree (before it runs, where it will be), for a task of this world's
    /// repository: `worktrees/<repository>/task-<id>` on the home's own queue,
    /// `worktrees/q-<queue key>/<repository>/task-<id>` on any other.
    pub fn worktree(&self, id: i64) -> PathBuf {
        let worktrees = self.home.join("worktrees");
        let own_db = self.home.join("taskbridge.db");
        let repo = queue::home::repo_dir_name(&self.repo);
        match &self.db {
            Some(db) if Path::new(db) != own_db => {
                let key = queue::Location::parse(db).unwrap().key();
                worktrees.join(format!("q-{key}/{repo}/task-{id}"))
            }
            _ => worktrees.join(format!("{repo}/task-{id}")),
        }
    }

    pub fn log(&self, id: i64) -> String {
        std::fs::read_to_string(self.home.join(format!("logs/{id}.log"))).unwrap_or_default()
    }
}

/// An rmcp client on the stdin/stdout of `cmd` (a `taskbridge` MCP server, started here); the
/// server is killed when the returned child is dropped.
pub async fn stdio_client(
    mut cmd: tokio::process::Command,
) -> (rmcp::service::RunningService<rmcp::service::RoleClient, ()>, tokio::process::Child) {
    use rmcp::ServiceExt;
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    (().serve(io).await.unwrap(), child)
}

/// What a test waits for is the event itself; the limit only turns a hang into a failure. A
/// loaded 2-core machine made 15 s limits fail tests that passed alone (issue #55), so no wait
/// gives up sooner than two minutes, whatever the test names (which says how long it should
/// take, for the reader).
pub fn guard(limit: Duration) -> Duration {
    limit.max(Duration::from_secs(120))
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let timeout = guard(timeout);
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// Whether any process of the group still runs. A killed process stays a zombie until its
/// parent reaps it, and an orphan's parent is PID 1, which in a container may reap late: a
/// zombie has stopped running and does not count.
pub fn group_alive(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()).any(|pid| {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
        let Some(close) = stat.rfind(')') else { return false };
        let mut fields = stat[close + 2..].split_whitespace();
        let state = fields.next();
        let group = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
        group == Some(pgid) && state != Some("Z")
    })
}

/// A child process that is killed (SIGKILL) when dropped, so a failing test leaves nothing behind.
pub struct Child(pub std::process::Child);

impl Child {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.0.wait().unwrap()
    }
}

impl Drop for Child {
    /// SIGTERM first, so a worker stops as it would for a person (its OpenCode server with
    /// it: a SIGKILL leaves the server for the next worker to clean up, and a test has none);
    /// SIGKILL if it is still there after 10 s.
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- public mode: stand-in tunnels and raw HTTP ------------------------------------------

pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Prints a quick tunnel's banner the way cloudflared 2024.x does (on stderr), then runs on.
pub fn fake_cloudflared(dir: &Path, then: &str) -> PathBuf {
    let pidfile = dir.join("tunnel.pid");
    script(
        dir,
        "cloudflared",
        &format!(
            "echo $$ > '{}'\n\
             echo '2024-06-01T10:00:00Z INF Thank you for trying Cloudflare Tunnel. Doing so, without a Cloudflare account, is a quick way to experiment and try it out.' >&2\n\
             echo '2024-06-01T10:00:00Z INF Requesting new quick Tunnel on trycloudflare.com...' >&2\n\
             echo '2024-06-01T10:00:03Z INF +--------------------------------------------------------------------------------------------+' >&2\n\
             echo '2024-06-01T10:00:03Z INF |  Your quick Tunnel has been created! Visit it at (it may take some time to be reachable):  |' >&2\n\
             echo '2024-06-01T10:00:03Z INF |  https://four-dashed-word-url.trycloudflare.com                                            |' >&2\n\
             echo '2024-06-01T10:00:03Z INF +--------------------------------------------------------------------------------------------+' >&2\n\
             {then}\n",
            pidfile.display()
        ),
    )
}

/// Tokens of the same length as `token` that are wrong: one differing only in its last byte, one
/// only in its first (a comparison that stops early, or checks only the length, lets them in).
#[allow(dead_code)]
pub fn near_misses(token: &str) -> [String; 2] {
    let flip = |c: char| if c == '0' { '1' } else { '0' };
    let n = token.len();
    let last = format!("{}{}", &token[..n - 1], flip(token.chars().last().unwrap()));
    let first = format!("{}{}", flip(token.chars().next().unwrap()), &token[1..]);
    [last, first]
}

/// An `initialize` request body.
pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

#[allow(dead_code)]
/// One `tools/call` on a fresh session of the server at `p`; the whole response.
pub fn mcp_call(p: u16, token: &str, body: &str) -> String {
    let host = format!("127.0.0.1:{p}");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let (status, resp) = post_with(p, &host, &auth, INITIALIZE);
    assert_eq!(status, 200, "{resp}");
    let id = resp
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("mcp-session-id:"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no session id: {resp}"));
    let session = format!("{auth}Mcp-Session-Id: {id}\r\nMcp-Protocol-Version: 2025-11-25\r\n");
    let done = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    post_with(p, &host, &session, done);
    post_with(p, &host, &session, body).1
}

/// A raw HTTP POST of `initialize`; returns the status code.
pub fn post(port: u16, host: &str, token: Option<&str>) -> u16 {
    post_body(port, host, token, INITIALIZE).0
}

/// A raw HTTP POST; returns the status code and the whole response.
pub fn post_body(port: u16, host: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    post_with(port, host, &auth, body)
}

/// A raw HTTP POST to `/mcp` with more `headers` (each ending in CRLF); the status code and the
/// whole response.
pub fn post_with(port: u16, host: &str, headers: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    (resp.split_whitespace().nth(1).unwrap().parse().unwrap(), resp)
}

/// The messages of the first request the mock got that contain `needle`.
#[allow(dead_code)]
pub fn request_with(mock: &mock_anthropic::MockAnthropic, needle: &str) -> String {
    mock.requests()
        .iter()
        .map(|r| r["messages"].to_string())
        .find(|m| m.contains(needle))
        .unwrap_or_else(|| panic!("no request mentions {needle:?}"))
}

/// The model's last turn: a `taskbridge-result` block with `summary` and no tests.
#[allow(dead_code)]
pub fn result_turn(summary: &str) -> mock_anthropic::Turn {
    mock_anthropic::Turn::text(format!(
        "Done.\n\n```taskbridge-result\n{}\n```",
        json!({"summary": summary, "tests_run": [], "open_questions": []})
    ))
}

/// The paths a finished task's result lists as touched.
#[allow(dead_code)]
pub fn touched_paths(t: &Value) -> Vec<String> {
    t["result"]["files_touched"]
        .as_array()
        .unwrap_or_else(|| panic!("no files in {t:#}"))
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect()
}

pub fn read_pid(path: &Path) -> i32 {
    assert!(eventually(Duration::from_secs(10), || path.exists()));
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

pub fn pid_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// `taskbridge serve` on a port the server picks itself (`--listen 127.0.0.1:0`), so tests
/// running in parallel never race for a number; returns the child (killed when dropped) and the
/// port it printed.
pub fn start_serve(env: &Env, extra: &[&str]) -> (Child, u16) {
    let (child, port, _stdout) =
        start_http(env.cmd().args(["serve", "--listen", "127.0.0.1:0"]).args(extra));
    (child, port)
}

/// Starts an HTTP server command that prints `… at http://127.0.0.1:PORT/mcp` on stderr, and
/// waits for that line. Both pipes are drained in the background so the server never blocks on
/// them; stdout's lines arrive on the returned channel.
pub fn start_http(cmd: &mut Command) -> (Child, u16, std::sync::mpsc::Receiver<String>) {
    let (child, port, stdout, _) = start_http_stderr(cmd);
    (child, port, stdout)
}

/// `start_http`, also returning what the server printed on stderr up to its address line (its
/// warnings).
#[allow(dead_code)]
pub fn start_http_stderr(
    cmd: &mut Command,
) -> (Child, u16, std::sync::mpsc::Receiver<String>, String) {
    use std::io::BufRead;
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut before = String::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("http://127.0.0.1:").nth(1)
                && let Some(port) = rest.split('/').next().and_then(|p| p.parse::<u16>().ok())
                && let Some(tx) = tx.take()
            {
                before.push_str(&line);
                let _ = tx.send((port, std::mem::take(&mut before)));
            } else if tx.is_some() {
                before.push_str(&line);
                before.push('\n');
            }
        }
    });
    let (out_tx, out_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = out_tx.send(line);
        }
    });
    let child = Child(child);
    let (port, before) =
        rx.recv_timeout(guard(Duration::from_secs(30))).expect("the server printed its URL");
    (child, port, out_rx, before)
}

/// A turn whose command writes its process group id to `marker` and sleeps.
#[allow(dead_code)]
pub fn sleeper(marker: &str) -> mock_anthropic::Turn {
    mock_anthropic::Turn::bash(&format!("ps -o pgid= $$ | tr -d ' ' > {marker}; sleep 300"))
}

/// The process group id a [`sleeper`] wrote, once it is there.
#[allow(dead_code)]
pub fn read_pgid(path: &Path) -> i32 {
    assert!(
        eventually(Duration::from_secs(90), || std::fs::read_to_string(path)
            .is_ok_and(|s| !s.trim().is_empty())),
        "the agent never started its command"
    );
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// The pid of the (one) worker's OpenCode server in serve mode, from the file the next worker
/// reads to clean up after a dead one.
#[allow(dead_code)]
pub fn server_pid(env: &Env) -> Option<i32> {
    // Beside it, the worker's list of spare worktrees (`<worker>.spares.json`).
    let f = std::fs::read_dir(env.home.join("servers"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| !p.to_string_lossy().ends_with(".spares.json"))?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(f).ok()?).ok()?;
    v["pid"].as_i64().map(|p| p as i32)
}

/// One MCP tool call with the official Python SDK against `taskbridge mcp` over stdio.
#[allow(dead_code)]
pub fn python_mcp_call(env: &Env, tool: &str, args: Value) -> Value {
    let script = r#"
import asyncio, json, os, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["mcp", "--no-worker"], env=dict(os.environ))
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool(sys.argv[2], json.loads(sys.argv[3]))
            print(res.content[0].text)
asyncio.run(main())
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(bin())
        .arg(tool)
        .arg(args.to_string())
        .envs(env.env_vars())
        .current_dir(&env.repo)
        .output()
        .unwrap();
    assert!(out.status.success(), "python: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{tool} answered what is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout))
    })
}

/// The PostgreSQL server of the tests (`.ci/run` starts one with `.ci/pg`).
pub fn pg_server() -> String {
    std::env::var("TASKBRIDGE_TEST_PG").unwrap_or_else(|_| {
        panic!(
            "the PostgreSQL tests need a server: set TASKBRIDGE_TEST_PG=postgres://… \
             (`.ci/pg start DIR` starts a throwaway one and prints its URL; .ci/run does this)"
        )
    })
}

/// A URL for a schema no other test uses.
pub fn pg_schema_url() -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let server = pg_server();
    let sep = if server.contains('?') { '&' } else { '?' };
    format!("{server}{sep}schema=e2e_{}_{n}_{nanos}", std::process::id())
}

impl Drop for Env {
    fn drop(&mut self) {
        let Some(schema) = self.db.as_deref().and_then(|d| d.split("schema=").nth(1)) else {
            return;
        };
        if !self.owns_db {
            return;
        }
        let schema = schema.split('&').next().unwrap_or(schema);
        if let Ok(mut c) = postgres::Client::connect(&pg_server(), postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
        }
    }
}
