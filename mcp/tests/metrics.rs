//! `/metrics` on the MCP listener and on a listener of its own: behind the token, in
//! Prometheus's text format, with the queue's counts. Real loopback sockets, a real SQLite file.
#![allow(clippy::unwrap_used)]

mod common;

use taskbridge_mcp::{HttpConfig, MetricsOf, bind, serve_http, serve_metrics};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn config(w: &common::World) -> HttpConfig {
    HttpConfig {
        listen: "127.0.0.1:0".into(),
        token: Some(TOKEN.into()),
        metrics: Some(MetricsOf(w.store.clone())),
        ..Default::default()
    }
}

async fn get(port: u16, token: Option<&str>) -> (u16, String, String) {
    worker::install_tls();
    let mut req = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let ct =
        r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

async fn check(port: u16) {
    let (status, _, body) = get(port, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, _, body) = get(port, Some("0123456789abcdef0123456789abcdeX")).await;
    assert_eq!(status, 401, "{body}");
    let (status, ct, body) = get(port, Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(body.contains("taskbridge_tasks{state=\"queued\"} 1"), "{body}");
    assert!(body.contains("taskbridge_tasks_submitted_total{agent=\"opencode\"} 1"), "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
}

/// A world with one queued task, and `cfg` served on a loopback port: the MCP listener, or (with
/// `alone`) the metrics listener.
async fn serving(cfg: impl FnOnce(&common::World) -> HttpConfig, alone: bool) -> Serving {
    let w = common::world().await;
    w.call("submit_task", serde_json::json!({"prompt": "count me"})).await;
    let cfg = cfg(&w);
    let listener = bind(&cfg).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let server = match alone {
        true => tokio::spawn(serve_metrics(listener, cfg, stop.clone())),
        false => tokio::spawn(serve_http(w.server.clone(), listener, cfg, stop.clone())),
    };
    Serving { _w: w, port, stop, server }
}

struct Serving {
    _w: common::World,
    port: u16,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<taskbridge_mcp::Result<()>>,
}

impl Serving {
    async fn stop(self) {
        self.stop.cancel();
        self.server.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn the_mcp_listener_serves_metrics_behind_its_token() {
    let s = serving(config, false).await;
    check(s.port).await;
    s.stop().await;
}

#[tokio::test]
async fn a_metrics_listener_serves_them_alone() {
    let s = serving(config, true).await;
    let port = s.port;
    check(port).await;
    // It is only that: no MCP there.
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/mcp"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    s.stop().await;
}

#[tokio::test]
async fn without_a_queue_to_report_there_is_no_metrics_route() {
    let s = serving(|w| HttpConfig { metrics: None, ..config(w) }, false).await;
    assert_eq!(get(s.port, Some(TOKEN)).await.0, 404);
    s.stop().await;
}
