//! The stats view (`s`): the last day of the queue in ratatui's own charts.

use crate::stats::{Percentiles, Stats, human};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{BarChart, Block, Clear, Paragraph, Sparkline};

pub(super) fn draw_stats(stats: Option<&Stats>, f: &mut Frame, area: Rect) {
    f.render_widget(Clear, area);
    let block = Block::bordered().title(" Stats: the last 24 hours (s or Esc closes) ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let Some(s) = stats else {
        f.render_widget(Paragraph::new("Reading the queue…"), inner);
        return;
    };
    let [spark, bars, tables] =
        Layout::vertical([Constraint::Length(6), Constraint::Min(7), Constraint::Length(8)])
            .areas(inner);

    // The newest buckets that fit, so the right edge is always now.
    let width = usize::from(spark.width.saturating_sub(2)).max(1);
    let finished = &s.finished[s.finished.len().saturating_sub(width)..];
    f.render_widget(
        Sparkline::default()
            .block(
                Block::bordered()
                    .title(format!(" Tasks finished per 10 minutes: {} in 24 h ", s.total)),
            )
            .style(Style::new().fg(Color::Green))
            .data(finished.iter().copied()),
        spark,
    );

    let hours: Vec<(&str, u64)> = s.spend_cents.iter().map(|(h, c)| (h.as_str(), *c)).collect();
    let bar_width = (bars.width.saturating_sub(2) / hours.len().max(1) as u16).clamp(1, 6);
    f.render_widget(
        BarChart::default()
            .block(
                Block::bordered()
                    .title(format!(" Spend per hour (cents, UTC): ${:.2} in 24 h ", s.spend_usd)),
            )
            .bar_width(bar_width.saturating_sub(1).max(1))
            .bar_gap(1)
            .bar_style(Style::new().fg(Color::Yellow))
            .value_style(Style::new().fg(Color::Black).bg(Color::Yellow))
            .data(&hours),
        bars,
    );

    // The percentiles take what their three columns need; the lists share the rest.
    let [times, agents, failures] =
        Layout::horizontal([Constraint::Length(56), Constraint::Fill(1), Constraint::Fill(1)])
            .areas(tables);
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let row = |name: &str, p: &Percentiles| {
        if p.n == 0 {
            return Line::from(format!("{name:<11} none yet"));
        }
        Line::from(format!(
            "{name:<11} p50 {:>8}  p90 {:>8}  p99 {:>8}",
            human(p.p50),
            human(p.p90),
            human(p.p99)
        ))
    };
    let lines = vec![
        Line::styled("Percentiles", bold),
        row("queue wait", &s.queue_wait),
        row("run time", &s.run),
    ];
    f.render_widget(Paragraph::new(lines).block(Block::bordered()), times);

    let mut lines = vec![Line::styled("Per agent: done / failed / cancelled", bold)];
    lines.extend(s.agents.iter().map(|a| {
        Line::from(vec![
            Span::raw(format!("{:<12}", a.agent)),
            Span::styled(format!("{}", a.done), Style::new().fg(Color::Green)),
            Span::raw(" / "),
            Span::styled(format!("{}", a.failed), Style::new().fg(Color::Red)),
            Span::raw(format!(" / {}", a.cancelled)),
        ])
    }));
    if s.agents.is_empty() {
        lines.push(Line::from("no task finished"));
    }
    f.render_widget(Paragraph::new(lines).block(Block::bordered()), agents);

    let mut lines = vec![Line::styled("Failures by kind", bold)];
    lines.extend(s.failures.iter().map(|(kind, n)| Line::from(format!("{kind:<22}{n:>4}"))));
    if s.failures.is_empty() {
        lines.push(Line::from("none"));
    }
    f.render_widget(Paragraph::new(lines).block(Block::bordered()), failures);
}
