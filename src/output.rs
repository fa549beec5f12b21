//! Standard output for the CLI. A reader that closes the pipe early (`taskbridge list | head`)
//! has seen what it wanted: the command ends quietly, as Unix tools do, instead of panicking the
//! way `println!` does.

use std::borrow::Cow;
use std::io::Write;

/// `s` with every control character but newline and tab written out as `\xNN` (`\u{NN}` for
/// C1 controls): titles, prompts, notes, questions, errors and logs come from agents and remote
/// callers, and a raw escape sequence in one would drive the reader's terminal (retitle it,
/// clear it, forge lines).
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Writes `args` to stdout, control characters escaped (see [`escape_controls`]). A closed pipe
/// exits the process with status 0; any other write error (a full disk behind a redirect) is
/// reported on stderr with status 1.
pub fn write(args: std::fmt::Arguments<'_>) {
    let text = args.to_string();
    write_raw(&escape_controls(&text));
}

/// Writes text this program has already made safe (a diff it coloured itself).
pub fn write_raw(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "error: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// `println!` that ends quietly on a closed pipe.
macro_rules! outln {
    () => { $crate::output::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` that ends quietly on a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::escape_controls;

    #[test]
    fn escapes_are_written_out_and_text_is_kept() {
        assert_eq!(escape_controls("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            escape_controls("t\x1b]0;owned\x07\x1b[2J\r\u{9b}x"),
            "t\\x1b]0;owned\\x07\\x1b[2J\\x0d\\u{9b}x"
        );
        assert_eq!(escape_controls("caf\u{e9} \u{1F600}"), "caf\u{e9} \u{1F600}");
    }
}
