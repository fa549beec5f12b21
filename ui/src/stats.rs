//! The stats view's figures, from the tasks that finished in the last day as the queue lists
//! them (`Store::finished_within`): a pure function, so every figure is tested on plain rows.

use queue::{FailureKind, Recent, TaskStatus};
use std::collections::BTreeMap;

/// The window the view covers.
pub const WINDOW_S: f64 = 24.0 * 3600.0;
/// The width of one sparkline bucket.
pub const BUCKET_S: f64 = 600.0;
const BUCKETS: usize = (WINDOW_S / BUCKET_S) as usize;
const HOURS: usize = 24;

/// Percentiles of a set of durations, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub n: usize,
}

/// One agent's tasks that finished, by how.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentCounts {
    pub agent: String,
    pub done: u64,
    pub failed: u64,
    pub cancelled: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Tasks finished in each 10 minutes of the last day, oldest first.
    pub finished: Vec<u64>,
    /// Spend in each of the last 24 clock hours (this one last), in cents (a bar chart counts
    /// whole numbers), with the hour's label ("14" for 14:00–15:00 UTC, the database's clock).
    pub spend_cents: Vec<(String, u64)>,
    pub spend_usd: f64,
    pub queue_wait: Percentiles,
    pub run: Percentiles,
    pub agents: Vec<AgentCounts>,
    /// Failed tasks by their last attempt's kind, most first.
    pub failures: Vec<(String, u64)>,
    pub total: usize,
}

impl Stats {
    pub fn of(recent: &Recent) -> Stats {
        let now = recent.now;
        let mut finished = vec![0u64; BUCKETS];
        let mut spend = [0f64; HOURS];
        let (mut waits, mut runs) = (Vec::new(), Vec::new());
        let mut agents: BTreeMap<String, AgentCounts> = BTreeMap::new();
        let mut failures: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0;
        let this_hour = (now / 3600.0).floor() as i64;
        for t in &recent.tasks {
            let age = now - t.finished_at;
            if !(0.0..WINDOW_S).contains(&age) {
                continue;
            }
            total += 1;
            finished[BUCKETS - 1 - (age / BUCKET_S) as usize] += 1;
            // By the clock's hours, so that each bar's label is the hour it covers.
            let hours_ago = this_hour - (t.finished_at / 3600.0).floor() as i64;
            if let Ok(h) = usize::try_from(hours_ago)
                && h < HOURS
            {
                spend[HOURS - 1 - h] += t.cost_usd.unwrap_or(0.0);
            }
            waits.extend(t.queue_wait_s);
            runs.extend(t.run_s);
            let a = agents
                .entry(t.agent.clone())
                .or_insert_with(|| AgentCounts { agent: t.agent.clone(), ..Default::default() });
            match t.status {
                TaskStatus::Done => a.done += 1,
                TaskStatus::Failed => {
                    a.failed += 1;
                    let kind = t.failure_kind.map_or("dependency or unknown", FailureKind::as_str);
                    *failures.entry(kind.to_owned()).or_default() += 1;
                }
                TaskStatus::Cancelled => a.cancelled += 1,
                _ => {}
            }
        }
        let spend_cents = spend
            .iter()
            .enumerate()
            .map(|(i, usd)| {
                let hour = (this_hour - (HOURS - 1 - i) as i64).rem_euclid(24);
                (format!("{hour:02}"), (usd * 100.0).round() as u64)
            })
            .collect();
        let mut failures: Vec<(String, u64)> = failures.into_iter().collect();
        failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Stats {
            finished,
            spend_cents,
            spend_usd: spend.iter().sum(),
            queue_wait: percentiles(waits),
            run: percentiles(runs),
            agents: agents.into_values().collect(),
            failures,
            total,
        }
    }
}

/// Nearest-rank percentiles.
fn percentiles(mut v: Vec<f64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[(((p / 100.0) * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Percentiles { p50: at(50.0), p90: at(90.0), p99: at(99.0), n: v.len() }
}

/// A duration as a person reads it: `850 ms`, `42 s`, `3.5 min`, `2.1 h`.
pub fn human(s: f64) -> String {
    match s {
        s if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        s if s < 90.0 => format!("{s:.0} s"),
        s if s < 5400.0 => format!("{:.1} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use queue::{FinishedTask, TaskId};

    fn task(id: i64, ago: f64, status: TaskStatus) -> FinishedTask {
        FinishedTask {
            id: TaskId(id),
            agent: "opencode".into(),
            status,
            finished_at: 100_000.0 - ago,
            run_s: Some(id as f64),
            queue_wait_s: Some(id as f64 / 10.0),
            cost_usd: Some(0.25),
            failure_kind: None,
        }
    }

    #[test]
    fn tasks_fall_in_their_ten_minutes_and_their_hour() {
        let mut failed = task(3, 3_700.0, TaskStatus::Failed);
        failed.failure_kind = Some(FailureKind::Timeout);
        failed.agent = "codex".into();
        let mut unknown = task(4, 3_800.0, TaskStatus::Failed);
        unknown.cost_usd = None;
        let recent = Recent {
            now: 100_000.0,
            tasks: vec![
                task(1, 30.0, TaskStatus::Done),
                task(2, 590.0, TaskStatus::Done),
                failed,
                unknown,
                task(5, 650.0, TaskStatus::Cancelled),
                task(6, WINDOW_S + 1.0, TaskStatus::Done),
            ],
        };
        let s = Stats::of(&recent);
        assert_eq!(s.total, 5, "the one older than a day is left out");
        assert_eq!(s.finished.len(), 144);
        assert_eq!(s.finished[143], 2, "the last ten minutes");
        assert_eq!(s.finished[142], 1);
        assert_eq!(s.finished[137], 2, "an hour and a bit ago");
        assert_eq!(s.finished.iter().sum::<u64>(), 5);
        assert_eq!(s.spend_cents.len(), 24);
        // 100,000 s is 03:46 UTC on the first day: the last bar is hour 03, the one before 02.
        assert_eq!(s.spend_cents[23], ("03".into(), 75));
        assert_eq!(s.spend_cents[22], ("02".into(), 25));
        assert!((s.spend_usd - 1.0).abs() < 1e-9, "{}", s.spend_usd);
        assert_eq!(
            s.agents,
            vec![
                AgentCounts { agent: "codex".into(), failed: 1, ..Default::default() },
                AgentCounts { agent: "opencode".into(), done: 2, failed: 1, cancelled: 1 },
            ]
        );
        assert_eq!(s.failures, vec![("dependency or unknown".into(), 1), ("timeout".into(), 1)]);
        assert_eq!(s.run, Percentiles { p50: 3.0, p90: 5.0, p99: 5.0, n: 5 });
        assert_eq!(s.queue_wait.n, 5);
    }

    #[test]
    fn percentiles_are_nearest_rank_and_nothing_reads_as_zero() {
        let p = percentiles((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p90, p.p99, p.n), (50.0, 90.0, 99.0, 100));
        assert_eq!(percentiles(vec![]), Percentiles::default());
        assert_eq!(percentiles(vec![7.0]).p99, 7.0);
    }

    #[test]
    fn durations_read_in_the_unit_that_fits() {
        assert_eq!(human(0.25), "250 ms");
        assert_eq!(human(42.0), "42 s");
        assert_eq!(human(210.0), "3.5 min");
        assert_eq!(human(7560.0), "2.1 h");
    }
}
