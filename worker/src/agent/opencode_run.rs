//! `opencode run`, OpenCode's one-shot mode: a process per turn whose JSON lines are read into
//! agent events (`crate::events::opencode_events`), each finished part as the warm server's
//! stream reads one.

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
