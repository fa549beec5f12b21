//! A unified diff as lines tagged for display, with the changed part of a replaced line marked.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    FileHeader,
    Hunk,
    Added,
    Removed,
    Context,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DiffLine {
    pub kind: LineKind,
    pub text: String,
    /// Byte range of `text` that changed against its paired line (a removed line followed by
    /// an added one), for word-level highlighting.
    pub emph: Option<(usize, usize)>,
}

pub fn parse_diff(text: &str) -> Vec<DiffLine> {
    let mut out: Vec<DiffLine> = text
        .lines()
        .map(|l| {
            let kind = if l.starts_with("diff --git")
                || l.starts_with("+++ ")
                || l.starts_with("--- ")
                || l.starts_with("index ")
                || l.starts_with("new file mode")
                || l.starts_with("deleted file mode")
                || l.starts_with("similarity index")
                || l.starts_with("rename ")
                || l.starts_with("Binary files")
            {
                LineKind::FileHeader
            } else if l.starts_with("@@") {
                LineKind::Hunk
            } else if l.starts_with('+') {
                LineKind::Added
            } else if l.starts_with('-') {
                LineKind::Removed
            } else {
                LineKind::Context
            };
            DiffLine { kind, text: l.to_owned(), emph: None }
        })
        .collect();
    pair_changes(&mut out);
    out
}

/// Pairs each run of removed lines with the run of added lines after it, line by line, and marks
/// what differs between the two: the part between their common prefix and common suffix.
fn pair_changes(lines: &mut [DiffLine]) {
    let mut i = 0;
    while i < lines.len() {
        if lines[i].kind != LineKind::Removed {
            i += 1;
            continue;
        }
        let r0 = i;
        while i < lines.len() && lines[i].kind == LineKind::Removed {
            i += 1;
        }
        let a0 = i;
        while i < lines.len() && lines[i].kind == LineKind::Added {
            i += 1;
        }
        let pairs = (a0 - r0).min(i - a0);
        for k in 0..pairs {
            let (old, new) = (&lines[r0 + k].text[1..], &lines[a0 + k].text[1..]);
            if let Some((ro, ao)) = changed_span(old, new) {
                lines[r0 + k].emph = Some((ro.0 + 1, ro.1 + 1));
                lines[a0 + k].emph = Some((ao.0 + 1, ao.1 + 1));
            }
        }
    }
}

type Span = (usize, usize);

fn changed_span(old: &str, new: &str) -> Option<(Span, Span)> {
    let prefix = old
        .char_indices()
        .zip(new.chars())
        .take_while(|((_, a), b)| a == b)
        .map(|((i, a), _)| i + a.len_utf8())
        .last()
        .unwrap_or(0);
    let old_rest = &old[prefix..];
    let new_rest = &new[prefix..];
    let suffix: usize = old_rest
        .chars()
        .rev()
        .zip(new_rest.chars().rev())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a.len_utf8())
        .sum();
    let (oe, ne) = (old.len() - suffix, new.len() - suffix);
    if prefix >= oe && prefix >= ne {
        return None;
    }
    // Nothing in common: the whole line changed, which the line colour already says.
    if prefix == 0 && suffix == 0 {
        return None;
    }
    Some(((prefix, oe.max(prefix)), (prefix, ne.max(prefix))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_word_changes() {
        let d = "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n keep\n-let x = 1;\n+let x = 2;\n";
        let l = parse_diff(d);
        let kinds: Vec<LineKind> = l.iter().map(|l| l.kind).collect();
        use LineKind::*;
        assert_eq!(kinds, vec![FileHeader, FileHeader, FileHeader, Hunk, Context, Removed, Added]);
        assert_eq!(&l[5].text[l[5].emph.unwrap().0..l[5].emph.unwrap().1], "1");
        assert_eq!(&l[6].text[l[6].emph.unwrap().0..l[6].emph.unwrap().1], "2");
    }
}
