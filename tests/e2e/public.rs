//! Public-URL mode with stand-in `cloudflared` and `ngrok` executables that print what the real
//! ones print, and the client set-up commands.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Starts `serve --public` on a port it picks itself; waits for the endpoint line (stdout) and
/// the local URL (stderr); returns the server, that line and the port.
fn start_public(env: &Env, kind: &str, var: &str, fake: &Path) -> (Child, String, u16) {
    let mut cmd = env.cmd();
    cmd.args(["serve", "--public", kind, "--no-worker", "--listen", "127.0.0.1:0"]).env(var, fake);
    let (child, port, stdout) = start_http(&mut cmd);
    let endpoint = stdout.recv_timeout(guard(Duration::from_secs(30))).unwrap();
    (child, endpoint, port)
}

#[test]
fn cloudflare_public_mode_checks_host_and_token_and_never_outlives_taskbridge() {
    let env = Env::new();
    let fake = fake_cloudflared(env.dir.path(), "exec sleep 300");
    let (mut server, endpoint, p) =
        start_public(&env, "cloudflare", "TASKBRIDGE_CLOUDFLARED", &fake);
    assert_eq!(endpoint, "public MCP endpoint: https://four-dashed-word-url.trycloudflare.com/mcp");
    let token_file = env.home.join("token");
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_owned();
    assert_eq!(token.len(), 64, "a 256-bit token, hex");
    assert_eq!(std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(eventually(Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", p))
        .is_ok()));

    let tunnel_host = "four-dashed-word-url.trycloudflare.com";
    assert_eq!(
        post(p, tunnel_host, Some(&token)),
        200,
        "the tunnel's Host with the token is accepted"
    );
    assert_eq!(post(p, tunnel_host, None), 401, "no token: 401");
    assert_eq!(post(p, tunnel_host, Some("wrong")), 401);
    assert_eq!(post(p, "evil.example", Some(&token)), 403, "another Host: 403");

    let tunnel = read_pid(&env.dir.path().join("tunnel.pid"));
    assert!(pid_alive(tunnel));
    let status = server.terminate();
    assert!(status.success(), "SIGTERM is a clean shutdown: {status:?}");
    assert!(
        eventually(Duration::from_secs(30), || !pid_alive(tunnel)),
        "the tunnel stopped with TaskBridge"
    );

    // Even a SIGKILL of TaskBridge takes the tunnel down.
    std::fs::remove_file(env.dir.path().join("tunnel.pid")).unwrap();
    let (mut server, _, _) = start_public(&env, "cloudflare", "TASKBRIDGE_CLOUDFLARED", &fake);
    let tunnel = read_pid(&env.dir.path().join("tunnel.pid"));
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(30), || !pid_alive(tunnel)),
        "the tunnel outlived a killed TaskBridge"
    );
}

#[test]
fn ngrok_json_log_is_read_and_its_host_allowed() {
    let env = Env::new();
    let fake = script(
        env.dir.path(),
        "ngrok",
        r#"echo '{"lvl":"info","msg":"no configuration paths supplied","t":"2024-06-01T10:00:00Z"}'
echo '{"addr":"http://localhost:8765","lvl":"info","msg":"started tunnel","name":"command_line","obj":"tunnels","t":"2024-06-01T10:00:01Z","url":"https://1a2b-3c4d.ngrok-free.app"}'
exec sleep 300
"#,
    );
    let (_server, endpoint, p) = start_public(&env, "ngrok", "TASKBRIDGE_NGROK", &fake);
    assert_eq!(endpoint, "public MCP endpoint: https://1a2b-3c4d.ngrok-free.app/mcp");
    let token = std::fs::read_to_string(env.home.join("token")).unwrap().trim().to_owned();
    assert!(eventually(Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", p))
        .is_ok()));
    assert_eq!(post(p, "1a2b-3c4d.ngrok-free.app", Some(&token)), 200);
    assert_eq!(post(p, "1a2b-3c4d.ngrok-free.app", None), 401);
    // Plain JSON answers (no event stream), and tasks only in the repositories it was given: by
    // default the directory it started in.
    let call = |repo: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"submit_task","arguments":{{"prompt":"x","repo":"{repo}"}}}}}}"#
        );
        post_body(p, "1a2b-3c4d.ngrok-free.app", Some(&token), &body)
    };
    let (status, resp) = call("/");
    assert_eq!(status, 200);
    assert!(resp.contains("content-type: application/json"), "{resp}");
    assert!(
        resp.contains("outside the roots this server may run tasks in")
            && resp.contains(&env.repo.display().to_string()),
        "{resp}"
    );
    let (_, resp) = call(&env.repo.display().to_string());
    assert!(resp.contains("\\\"task_id\\\":1"), "{resp}");
}

#[test]
fn tunnel_failures_are_reported_plainly() {
    let env = Env::new();
    let run = |var: &str, path: &Path, extra: &[(&str, &str)]| {
        let mut c = env.cmd();
        c.args(["serve", "--public", "cloudflare", "--no-worker", "--listen", "127.0.0.1:0"])
            .env(var, path);
        for (k, v) in extra {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("TASKBRIDGE_CLOUDFLARED", Path::new("/nonexistent/cloudflared"), &[]);
    assert!(err.contains("was not found") && err.contains("install cloudflared"), "{err}");
    let silent = script(env.dir.path(), "silent", "echo 'INF starting' >&2\nexec sleep 300\n");
    let err = run("TASKBRIDGE_CLOUDFLARED", &silent, &[("TASKBRIDGE_TUNNEL_TIMEOUT_S", "2")]);
    assert!(
        err.contains("printed no public URL within 2 s") && err.contains("INF starting"),
        "{err}"
    );
    let dies = fake_cloudflared(env.dir.path(), "sleep 1; echo 'ERR connection lost' >&2; exit 1");
    let err = run("TASKBRIDGE_CLOUDFLARED", &dies, &[]);
    assert!(err.contains("the tunnel stopped"), "{err}");
}

#[test]
fn config_writers_merge_without_losing_keys() {
    let env = Env::new();
    let xdg = env.dir.path().join("xdg");
    let desktop = xdg.join("Claude/claude_desktop_config.json");
    std::fs::create_dir_all(desktop.parent().unwrap()).unwrap();
    std::fs::write(
        &desktop,
        r#"{"preferences": {"theme": "dark"}, "mcpServers": {"other": {"command": "/bin/other"}}}"#,
    )
    .unwrap();
    let printed =
        env.cmd().args(["config", "claude-desktop"]).env("XDG_CONFIG_HOME", &xdg).output().unwrap();
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("\"args\": [\n        \"mcp\"\n      ]"), "{printed}");
    assert_eq!(std::fs::read_to_string(&desktop).unwrap().len(), 86, "printing writes nothing");

    let out = env
        .cmd()
        .args(["config", "claude-desktop", "--write"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&desktop).unwrap()).unwrap();
    assert_eq!(v["preferences"]["theme"], "dark");
    assert_eq!(v["mcpServers"]["other"]["command"], "/bin/other");
    let entry = &v["mcpServers"]["taskbridge"];
    assert!(Path::new(entry["command"].as_str().unwrap()).is_absolute());
    assert_eq!(entry["args"], serde_json::json!(["mcp"]));
    assert_eq!(entry["env"]["TASKBRIDGE_HOME"], env.home.display().to_string());
    assert!(
        PathBuf::from(format!("{}.bak", desktop.display())).exists(),
        "a backup was written first"
    );

    // Claude Code's user scope in ~/.claude.json (HOME is the test's).
    let claude = env.oc_home.join(".claude.json");
    std::fs::write(&claude, r#"{"numStartups": 3, "projects": {}}"#).unwrap();
    assert!(env.run(&["config", "claude-code", "--write"]).status.success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&claude).unwrap()).unwrap();
    assert_eq!(v["numStartups"], 3);
    assert_eq!(v["mcpServers"]["taskbridge"]["type"], "stdio");
    let lines = env.ok(&["config", "claude-code"]);
    assert!(
        lines.contains("claude mcp add taskbridge -s user -e TASKBRIDGE_HOME=")
            && lines.contains("claude mcp add taskbridge -s user --transport http"),
        "{lines}"
    );

    std::fs::write(&desktop, "not json").unwrap();
    let out = env
        .cmd()
        .args(["config", "claude-desktop", "--write"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not valid JSON"));
    assert_eq!(
        std::fs::read_to_string(&desktop).unwrap(),
        "not json",
        "a broken file is left alone"
    );
}

#[test]
fn service_install_writes_a_valid_systemd_unit() {
    let env = Env::new();
    let xdg = env.dir.path().join("xdg");
    // No user systemd here (CI): the unit is written, and install fails saying why it did not
    // start and what to do.
    let service = |action: &str| {
        env.cmd()
            .args(["service", action])
            .env("XDG_CONFIG_HOME", &xdg)
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    };
    let out = service("install");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it did not start, so install did not succeed");
    assert!(
        err.contains("systemd's user manager cannot be reached")
            && err.contains("Failed to connect to bus")
            && err.contains("loginctl enable-linger"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("start it with"), "said once");
    let unit = xdg.join("systemd/user/taskbridge.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains(&format!("--home \"{}\" serve", env.home.display())), "{text}");
    assert!(text.contains("Restart=on-failure") && text.contains("WantedBy=default.target"));
    let exec = text.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    assert!(exec.contains(&bin().canonicalize().unwrap().display().to_string()), "{exec}");
    // systemd's own parser is the judge (`.ci/run` installs it). `--user` needs a runtime
    // directory, which a session without a user manager (CI) lacks: a private one stands in.
    let runtime = env.dir.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let v = std::process::Command::new("systemd-analyze")
        .args(["verify", "--user"])
        .arg(&unit)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .expect(
            "systemd-analyze (Debian's systemd package) checks the unit: install it or run .ci/run",
        );
    let err = String::from_utf8_lossy(&v.stderr);
    assert!(v.status.success() && !err.contains("taskbridge.service"), "systemd-analyze: {err}");
    let status = service("status");
    assert!(String::from_utf8_lossy(&status.stdout).contains("installed:"));
    let out = service("uninstall");
    assert!(out.status.success());
    assert!(!unit.exists());
}

#[test]
fn install_sh_yes_installs_and_registers_in_a_fresh_home() {
    let env = Env::new();
    let root = env.dir.path().join("cargo-root");
    // install.sh in a fresh HOME, installing into `root`. Its binary goes to a target directory
    // of its own (installing must not replace the binary other tests run), while its build
    // directory is the suite's own: every dependency the suite already compiled is reused (only
    // the few whose features differ without the dev-dependencies are built), where a build of
    // its own took longer than any other test. `cargo test` holds no lock while tests run.
    let suite_target = std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .expect("the test binary lies in <target>/<profile>/deps")
        .to_path_buf();
    let install = |home: &Path| {
        std::fs::create_dir_all(home).unwrap();
        let mut c = std::process::Command::new("bash");
        c.arg("install.sh")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("HOME", home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env(
                "CARGO_HOME",
                std::env::var("CARGO_HOME")
                    .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap())),
            )
            .env("CARGO_INSTALL_ROOT", &root)
            .env("CARGO_TARGET_DIR", suite_target.join("install-sh"))
            .env("CARGO_BUILD_BUILD_DIR", &suite_target)
            .env("TASKBRIDGE_HOME", &env.home)
            .stdin(Stdio::null());
        c
    };
    let home = env.dir.path().join("home");
    // The real Claude Code on PATH: install.sh registers only with a Claude Code it finds.
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/node_modules/.bin");
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let out = install(&home)
        .args(["--yes", "--no-start", "--dev", "--tunnel", "cloudflare"])
        .env("TASKBRIDGE_OPENCODE", "/usr/bin/true")
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // cargo's compile log runs to hundreds of lines; what went wrong goes first, so that a
        // shortened log still shows it.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| {
                l.starts_with("error") || l.contains("No space left") || l.contains("signal")
            })
            .collect();
        panic!(
            "install.sh failed ({}):\n{}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            out.status,
            errors.join("\n")
        );
    }
    let installed = root.join("bin/taskbridge");
    assert!(installed.exists());
    assert!(
        stdout.contains(&format!("TaskBridge is installed at {}", installed.display())),
        "{stdout}"
    );
    assert!(stdout.contains("serve --public cloudflare"), "{stdout}");
    // The line to register by hand is the one that registers, a command Claude Code runs.
    let by_hand = stdout.lines().find(|l| l.contains("Claude Code, by hand:")).unwrap();
    assert!(by_hand.contains("claude mcp add taskbridge -s user"), "{by_hand}");
    let claude: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.join(".claude.json")).unwrap()).unwrap();
    assert!(
        claude["mcpServers"]["taskbridge"]["command"].as_str().unwrap().ends_with("bin/taskbridge")
    );
    // Claude Desktop has no Linux build: not registered here, and the script says why.
    assert!(!home.join(".config/Claude/claude_desktop_config.json").exists());
    assert!(stdout.contains("Claude Desktop runs on macOS and Windows only"), "{stdout}");
    let opencode: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(home.join(".config/opencode/opencode.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(opencode["mcp"]["taskbridge"]["command"][3], "claude-mcp");
    assert!(stdout.contains("Checking the set-up") && stdout.contains("ok    home"), "{stdout}");

    // Piped answers: each question is answered no, and the script says so and names --yes; run
    // from the checkout itself, it does not start the TUI there.
    let home2 = env.dir.path().join("home2");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let cargo_dir = Path::new(&cargo).parent().unwrap_or(Path::new("/usr/bin")).to_path_buf();
    let out = install(&home2)
        .arg("--dev")
        // cargo, and no OpenCode: the path a newcomer without it takes.
        .env("PATH", format!("{}:/usr/bin:/bin", cargo_dir.display()))
        .env_remove("TASKBRIDGE_OPENCODE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("every question is answered no") && stderr.contains("--yes"),
        "{stderr}"
    );
    assert!(stdout.contains("npm install -g opencode-ai@1.18.33"), "the pinned version: {stdout}");
    assert!(stdout.contains("cd to your project and run: taskbridge tui"), "{stdout}");
    assert!(!home2.join(".claude.json").exists(), "no means no");
    // No Claude Code on this PATH: not offered, and the script says how to register later.
    assert!(
        stdout.contains("Claude Code is not installed")
            && stdout.contains("config claude-code --write"),
        "{stdout}"
    );
}

#[test]
fn restart_worker_restarts_the_installed_service_through_its_manager() {
    let env = Env::new();
    let xdg = env.dir.path().join("xdg");
    let unit = xdg.join("systemd/user/taskbridge.service");
    std::fs::create_dir_all(unit.parent().unwrap()).unwrap();
    std::fs::write(&unit, "[Service]\nExecStart=/bin/true\n").unwrap();
    // A stand-in systemctl that records how it was called.
    let bin_dir = env.dir.path().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let calls = env.dir.path().join("systemctl.calls");
    script(&bin_dir, "systemctl", &format!("echo \"$@\" >> '{}'", calls.display()));

    // The service's worker died (kill -9): its row says running, its pid is gone.
    let mut w = env.start_worker(1);
    assert!(eventually(Duration::from_secs(10), || env
        .ok(&["status"])
        .contains("workers alive: 1")));
    w.0.kill().unwrap();
    w.0.wait().unwrap();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        async fn call(
            client: &rmcp::service::RunningService<rmcp::service::RoleClient, ()>,
        ) -> serde_json::Value {
            let req = rmcp::model::CallToolRequestParams::new("restart_worker")
                .with_arguments(serde_json::Map::new());
            client.call_tool(req).await.unwrap().structured_content.unwrap()
        }
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args(["mcp", "--no-worker"])
            .envs(env.env_vars())
            .env("PATH", format!("{}:/usr/bin:/bin", bin_dir.display()))
            .env("XDG_CONFIG_HOME", &xdg);
        let (client, _child) = stdio_client(cmd).await;

        let r = call(&client).await;
        assert_eq!(r["restarted"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(r["service"]["manager"], "systemd", "{r}");
        assert_eq!(r["service"]["restarted"], true, "{r}");
        let recorded = std::fs::read_to_string(&calls).unwrap();
        assert_eq!(recorded.trim(), "--user restart taskbridge.service");

        // Without a service, the answer says how to get a worker back.
        std::fs::remove_file(&unit).unwrap();
        let r = call(&client).await;
        assert!(r["service"].is_null(), "{r}");
        assert!(r["note"].as_str().unwrap().contains("taskbridge service install"), "{r}");
    });
}

/// On a shared queue the service runs on the same queue as the command that installed it, and
/// the URL (with its password) goes in a file only the user can read, not in the unit.
#[test]
fn service_install_on_a_postgres_queue_keeps_the_url_in_a_private_env_file() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new().on_postgres();
    let xdg = env.dir.path().join("xdg");
    let db = env.db.clone().unwrap();
    let out = env
        .cmd()
        .args(["service", "install"])
        .env("XDG_CONFIG_HOME", &xdg)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    // No user systemd here: written, not started (the test above checks what it says).
    assert!(String::from_utf8_lossy(&out.stderr).contains("unit is written"), "{out:?}");
    let unit = std::fs::read_to_string(xdg.join("systemd/user/taskbridge.service")).unwrap();
    let env_file = env.home.join("service.env");
    assert!(unit.contains(&format!("EnvironmentFile={}", env_file.display())), "{unit}");
    assert!(!unit.contains(&db), "the URL stays out of the unit: {unit}");
    let text = std::fs::read_to_string(&env_file).unwrap();
    assert_eq!(text, format!("TASKBRIDGE_DB=\"{db}\"\n"));
    let mode = std::fs::metadata(&env_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // What systemd would start: `serve` with that environment, on that queue.
    let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    let status = std::process::Command::new(bin())
        .args(["--home", env.home.to_str().unwrap(), "status"])
        .env_clear()
        .env("TASKBRIDGE_DB", &db)
        .output()
        .unwrap();
    assert!(exec.contains(" serve"));
    assert!(String::from_utf8_lossy(&status.stdout).contains("schema=e2e_"), "{status:?}");
    let out = env
        .cmd()
        .args(["service", "uninstall"])
        .env("XDG_CONFIG_HOME", &xdg)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!env_file.exists(), "uninstall removes the env file");
}

/// `serve --json-response` (what public mode serves, for proxies that buffer event streams)
/// answers each POST with one plain JSON body and keeps no session, so a call needs no
/// `initialize` first; the default answers with an event stream within a session.
#[test]
fn serve_json_response_answers_plain_json_and_the_default_an_event_stream() {
    let env = Env::new();
    let ping =
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ping","arguments":{}}}"#;
    let head_and_body = |resp: &str| {
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        (head.to_ascii_lowercase(), body.to_owned())
    };

    let (_default, port) = start_serve(&env, &["--no-worker"]);
    let (head, body) = head_and_body(&mcp_call(port, &env.token(), ping));
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(body.contains("data:") && body.contains(r#""id":2"#), "{body}");

    let (_json, port) = start_serve(&env, &["--no-worker", "--json-response"]);
    let (status, resp) = post_body(port, &format!("127.0.0.1:{port}"), Some(&env.token()), ping);
    let (head, body) = head_and_body(&resp);
    assert_eq!(status, 200, "{resp}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let answer: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(answer["id"], 2);
    assert!(answer["result"]["structuredContent"]["version"].is_string(), "{answer}");
}
