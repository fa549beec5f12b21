//! `taskbridge config`: the entries MCP clients need, printed, or merged into their files.

use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn exe() -> anyhow::Result<PathBuf> {
    let p = std::env::current_exe().context("finding this executable")?;
    Ok(p.canonicalize().unwrap_or(p))
}

fn home_dir(env: &queue::Environment) -> anyhow::Result<PathBuf> {
    env.home_dir().context("HOME is not set")
}

/// Claude Desktop's config file on this OS.
pub fn claude_desktop_path(env: &queue::Environment) -> anyhow::Result<PathBuf> {
    if cfg!(target_os = "macos") {
        return Ok(
            home_dir(env)?.join("Library/Application Support/Claude/claude_desktop_config.json")
        );
    }
    if cfg!(windows) {
        let appdata = env.path("APPDATA").context("APPDATA is not set")?;
        return Ok(appdata.join("Claude/claude_desktop_config.json"));
    }
    // Linux is not officially supported by Claude Desktop; community builds read this path.
    let config = config_home(env)?;
    Ok(config.join("Claude/claude_desktop_config.json"))
}

/// The stdio entry: absolute paths, and the home this binary uses.
fn stdio_entry(home: &Path, with_type: bool) -> anyhow::Result<Value> {
    let mut v = json!({
        "command": exe()?.display().to_string(),
        "args": ["mcp"],
        "env": {"TASKBRIDGE_HOME": home.display().to_string()},
    });
    if with_type {
        v["type"] = json!("stdio");
    }
    Ok(v)
}

/// OpenCode's global config file.
pub fn opencode_config_path(env: &queue::Environment) -> anyhow::Result<PathBuf> {
    Ok(config_home(env)?.join("opencode/opencode.json"))
}

/// `$XDG_CONFIG_HOME`, else `~/.config`.
fn config_home(env: &queue::Environment) -> anyhow::Result<PathBuf> {
    env.path("XDG_CONFIG_HOME").map_or_else(|| home_dir(env).map(|h| h.join(".config")), Ok)
}

/// OpenCode's `mcp` entry for the reverse bridge. The key and base URL come from OpenCode's own
/// environment at run time (`{env:…}`), so no secret is written to the file.
fn opencode_entry(home: &Path) -> anyhow::Result<Value> {
    Ok(json!({
        "type": "local",
        "command": [exe()?.display().to_string(), "--home", home.display().to_string(), "claude-mcp"],
        "environment": {
            "ANTHROPIC_API_KEY": "{env:ANTHROPIC_API_KEY}",
            "ANTHROPIC_BASE_URL": "{env:ANTHROPIC_BASE_URL}",
        },
        "enabled": true,
        // OpenCode applies this to every tool call, and a question to Claude can take minutes.
        "timeout": 300000,
    }))
}

/// Merges `entry` at `<section>.<name>` into the JSON file at `path`, keeping every other key.
/// An existing file is backed up first (`<file>.bak`); the write is atomic (temp file + rename).
pub fn merge_into(
    path: &Path,
    section: &str,
    name: &str,
    entry: Value,
) -> anyhow::Result<Option<PathBuf>> {
    let mut doc = match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => json!({}),
        Ok(text) => serde_json::from_str::<Value>(&text).with_context(|| {
            format!("{} is not valid JSON; fix or move it, then run again", path.display())
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let Some(obj) = doc.as_object_mut() else {
        bail!("{} does not hold a JSON object; fix or move it, then run again", path.display());
    };
    let servers = obj.entry(section).or_insert_with(|| json!({}));
    let Some(servers) = servers.as_object_mut() else {
        bail!("\"{section}\" in {} is not an object", path.display());
    };
    servers.insert(name.to_owned(), entry);
    let backup = if path.exists() {
        let b = PathBuf::from(format!("{}.bak", path.display()));
        std::fs::copy(path, &b).with_context(|| format!("backing up {}", path.display()))?;
        Some(b)
    } else {
        None
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = PathBuf::from(format!("{}.taskbridge-tmp", path.display()));
    std::fs::write(&tmp, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(backup)
}

/// Quotes a word for a POSIX shell, so a pasted line survives spaces and quotes in paths.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word.chars().all(|c| c.is_ascii_alphanumeric() || "/._-:=@%+,".contains(c))
    {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// The lines `config claude-code` prints. Claude Code's `-e` and `--header` take several values,
/// so the server name must come before them or it is read as one more value. The HTTP line reads
/// the token from its file when it is pasted, so the token itself is never printed.
pub fn claude_code_lines(home: &Path, exe: &Path, http_url: &str) -> Vec<String> {
    let token = crate::token::Source::Home(crate::token::home_token_path(home));
    vec![
        "# stdio, for every project (the worker runs inside; recommended):".to_owned(),
        format!(
            "claude mcp add taskbridge -s user -e TASKBRIDGE_HOME={} -- {} mcp",
            shell_quote(&home.display().to_string()),
            shell_quote(&exe.display().to_string())
        ),
        "# or Streamable HTTP, with `taskbridge serve` (or the TUI) running; -s user registers it \
         for every project, -s local (Claude Code's default) for the current directory only:"
            .to_owned(),
        format!(
            "claude mcp add taskbridge -s user --transport http {} --header \"Authorization: \
             Bearer {}\"",
            shell_quote(http_url),
            token.shell_expr()
        ),
        format!(
            "# the HTTP server asks for the token in {} (a server started with --token-file or \
             TASKBRIDGE_TOKEN asks for that one instead)",
            crate::token::home_token_path(home).display()
        ),
    ]
}

pub fn run(
    client: &str,
    write: bool,
    home: &Path,
    http_url: &str,
    env: &queue::Environment,
) -> anyhow::Result<()> {
    match client {
        "claude-desktop" => {
            let path = claude_desktop_path(env)?;
            let entry = stdio_entry(home, false)?;
            if write {
                let backup = merge_into(&path, "mcpServers", "taskbridge", entry)?;
                outln!("added \"taskbridge\" to {}", path.display());
                if let Some(b) = backup {
                    outln!("the previous file is kept as {}", b.display());
                }
                outln!("restart Claude Desktop to load it");
            } else {
                outln!("# {} (merge into \"mcpServers\"; --write does it)", path.display());
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&json!({"mcpServers": {"taskbridge": entry}}))?
                );
            }
        }
        "claude-code" => {
            let exe = exe()?;
            if write {
                let path = home_dir(env)?.join(".claude.json");
                let backup =
                    merge_into(&path, "mcpServers", "taskbridge", stdio_entry(home, true)?)?;
                outln!("added \"taskbridge\" (user scope) to {}", path.display());
                if let Some(b) = backup {
                    outln!("the previous file is kept as {}", b.display());
                }
            } else {
                let registered = home_dir(env)?.join(".claude.json");
                let already = std::fs::read_to_string(&registered)
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .is_some_and(|d| d.pointer("/mcpServers/taskbridge").is_some());
                if already {
                    // `claude mcp add` refuses a name that exists ("already exists").
                    outln!(
                        "# TaskBridge is already registered with Claude Code (user scope, in {}); \
                         to register it again, remove it first:",
                        registered.display()
                    );
                    outln!("claude mcp remove taskbridge -s user");
                }
                // The token the printed HTTP line reads, made now if no server has made it yet.
                crate::token::home_token(home)?;
                for line in claude_code_lines(home, &exe, http_url) {
                    outln!("{line}");
                }
            }
        }
        "opencode" => {
            let path = opencode_config_path(env)?;
            let entry = opencode_entry(home)?;
            let name = worker::BRIDGE_MCP_NAME;
            if write {
                let backup = merge_into(&path, "mcp", name, entry)?;
                outln!("added the Claude bridge as mcp.{name} to {}", path.display());
                if let Some(b) = backup {
                    outln!("the previous file is kept as {}", b.display());
                }
            } else {
                outln!("# {} (merge into \"mcp\"; --write does it)", path.display());
                outln!("{}", serde_json::to_string_pretty(&json!({"mcp": {name: entry}}))?);
            }
            outln!(
                "# the bridge uses ANTHROPIC_API_KEY when OpenCode has it, else the `claude` CLI's \
                 login; `taskbridge worker --claude-bridge` offers it to TaskBridge's own runs"
            );
        }
        other => bail!("unknown client '{other}'; use claude-desktop, claude-code or opencode"),
    }
    Ok(())
}
