//! Project automation, run as `cargo xtask <command>` (the cargo-xtask convention).
//!
//! It sets up the CUDA toolchain a build needs (nvcc and libclang, installed into
//! `target/toolchain` when the machine has none), runs the demo a newcomer starts
//! with, and runs the whole test suite exactly as CI does. It depends on `std`
//! and `serde_json` (to read the build's unit manifest and the generations
//! fusion-compiler lists, `fusion-compiler/kernels/targets.json`) only, so
//! it builds in a few seconds on a fresh machine.

mod demo;
mod error;
mod lean_runtime;
mod package_cache;
mod packaged_crate;
mod process;
mod resources;
mod steps;
mod suite;
mod targets;
mod toolchain;
mod user_crate;
mod workspace;

use error::Error;
use std::process::ExitCode;
use workspace::Workspace;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  toolchain   find nvcc and libclang, or install them into target/toolchain
  demo        set up the toolchain, plan and build the SwiGLU FFN; run and benchmark it
              on a GPU, or show its kernels' registers, shared memory and spills
  test        the whole test suite, as CI runs it (no GPU needed)
  help        print this message";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match args.as_slice() {
        [] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        [command] => command.as_str(),
        [command, extra, ..] => {
            eprintln!("error: `{command}` takes no arguments, but got `{extra}`\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let workspace = Workspace::locate();
    let outcome = match command {
        "toolchain" => toolchain::bootstrap(&workspace).map(|_| ()),
        "demo" => demo::run(&workspace),
        "test" => suite::run(&workspace),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("error: unknown command `{other}`\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Reported) => ExitCode::FAILURE,
        Err(Error::Message(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
