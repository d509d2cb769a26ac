//! The `fusion` command line; [`fusion::cli`] holds what it does.

fn main() -> std::process::ExitCode {
    fusion::cli::main()
}
