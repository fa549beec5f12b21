//! `opencode run`, OpenCode's one-shot mode: a process per turn whose JSON lines are the events
//! the warm server's stream is also turned into (`crate::events::opencode_events`).

use super::AgentProtocol;
use crate::events::{AgentEvent, RunLog};

/// `opencode run --format json`: events on stdout, the prompt on stdin read to EOF.
pub struct OpenCodeRun;

impl AgentProtocol for OpenCodeRun {
    fn events(&mut self, line: &str) -> Option<Vec<AgentEvent>> {
        crate::events::opencode_events(line)
    }
    fn stderr(&mut self, line: &str) -> Vec<AgentEvent> {
        let mut seen = RunLog::default();
        seen.ingest_stderr(line);
        seen.model_seen.map(AgentEvent::Model).into_iter().collect()
    }
}
