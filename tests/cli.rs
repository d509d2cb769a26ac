//! The `fusion` binary as a user runs it: failures are one readable message
//! on stderr and exit status 1, never a panic.

use std::process::Command;

fn fusion() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fusion"))
}

#[test]
fn a_missing_graph_file_exits_1_with_a_message() {
    let path = std::env::temp_dir().join(format!("fusion-cli-{}-absent.toml", std::process::id()));
    let output = fusion().arg("plan").arg(&path).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.starts_with("error: cannot read "), "{stderr}");
    assert!(stderr.contains("absent.toml"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn plan_without_a_graph_is_a_usage_error() {
    let output = fusion().arg("plan").output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("GRAPH.toml"), "{stderr}");
}
