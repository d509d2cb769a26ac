//! The `fusion` command line; [`fusion_cli::cli`] holds what it does.

fn main() -> std::process::ExitCode {
    fusion_cli::cli::main()
}
