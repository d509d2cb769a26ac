//! Running external programs (pip, apt-get, nvcc, cargo) and reporting their
//! failures in one line: the command and the last thing it said.

use crate::error::{Error, Result};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

/// A command line as a user would type it, to print and to copy.
pub fn display_command(command: &Command) -> String {
    let program = shell_word(command.get_program());
    command
        .get_args()
        .map(shell_word)
        .fold(program, |line, arg| line + " " + &arg)
}

fn shell_word(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.into_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The last non-blank line of a program's output, trimmed; empty when it said nothing.
pub fn last_line(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    text.lines()
        .rev()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("")
        .to_string()
}

/// Starts `command`, mapping "program not found" to a sentence.
fn spawn_error(command: &Command, error: std::io::Error) -> Error {
    Error::new(format!("could not start `{}`: {error}", display_command(command)))
}

/// ``cmd` failed (exit status 1): <last line of stderr>``.
pub fn failure(command: &Command, status: ExitStatus, last_stderr_line: &str) -> Error {
    let mut message = format!("`{}` failed ({status})", display_command(command));
    if !last_stderr_line.is_empty() {
        message.push_str(": ");
        message.push_str(last_stderr_line);
    }
    Error::new(message)
}

/// Runs `command` with its stdout on the terminal (pip's download progress)
/// and its stderr echoed line by line, keeping the last line for the error.
pub fn run_echoing_stderr(command: &mut Command) -> Result<()> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| spawn_error(command, e))?;
    let mut last_stderr_line = String::new();
    if let Some(stderr) = child.stderr.take() {
        let mut terminal = std::io::stderr().lock();
        for line in BufReader::new(stderr).lines().map_while(std::io::Result::ok) {
            let _ = writeln!(terminal, "{line}");
            if !line.trim().is_empty() {
                last_stderr_line = line.trim().to_string();
            }
        }
    }
    let status = child.wait().map_err(|e| spawn_error(command, e))?;
    if status.success() {
        Ok(())
    } else {
        Err(failure(command, status, &last_stderr_line))
    }
}

/// Runs `command` without showing its output; on failure the error carries
/// the last line it wrote to stderr (or stdout, when stderr is empty).
pub fn run_quiet(command: &mut Command) -> Result<std::process::Output> {
    command.stdin(Stdio::null());
    let output = command.output().map_err(|e| spawn_error(command, e))?;
    if output.status.success() {
        return Ok(output);
    }
    let mut said = last_line(&output.stderr);
    if said.is_empty() {
        said = last_line(&output.stdout);
    }
    Err(failure(command, output.status, &said))
}

/// Runs `command` with the terminal as its stdio; returns its exit status.
pub fn run_inheriting(command: &mut Command) -> Result<ExitStatus> {
    command.status().map_err(|e| spawn_error(command, e))
}

/// The first executable file called `name` in a directory of `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Whether this process runs as root (effective uid 0), read from
/// `/proc/self/status` so that xtask needs no libc binding.
pub fn running_as_root() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    // "Uid:\t<real>\t<effective>\t<saved>\t<filesystem>"
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().nth(1))
        .is_some_and(|effective| effective == "0")
}

/// "0.4 s", "12.3 s", "2 min 05 s".
pub fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else {
        let whole = duration.as_secs();
        format!("{} min {:02} s", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_command_quotes_only_words_that_need_it() {
        let mut command = Command::new("python3");
        command.args([
            "-m",
            "pip",
            "install",
            "nvidia-cuda-cccl==13.0.*",
            "it's here",
            "a/b",
        ]);
        assert_eq!(
            display_command(&command),
            r"python3 -m pip install 'nvidia-cuda-cccl==13.0.*' 'it'\''s here' a/b"
        );
    }

    #[test]
    fn last_line_skips_trailing_blank_lines() {
        assert_eq!(
            last_line(b"first\nERROR: No matching distribution\n\n  \n"),
            "ERROR: No matching distribution"
        );
        assert_eq!(last_line(b""), "");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(format_duration(Duration::from_millis(400)), "0.4 s");
        assert_eq!(format_duration(Duration::from_millis(12_340)), "12.3 s");
        assert_eq!(format_duration(Duration::from_secs(125)), "2 min 05 s");
    }
}
