//! Standard output for the CLI. A reader that closes the pipe early (`taskbridge list | head`)
//! has seen what it wanted: the command ends quietly, as Unix tools do, instead of panicking the
//! way `println!` does.

use std::io::Write;

/// Writes `args` to stdout. A closed pipe exits the process with status 0; any other write error
/// (a full disk behind a redirect) is reported on stderr with status 1.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
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
