//! A list of steps run in order with a header and a duration each, stopping
//! at the first failure with the command that re-runs the failed step alone.
//! `demo` and `test` are both such lists.

use crate::error::{Error, Result};
use crate::process::{self, display_command, format_duration};
use crate::toolchain::{self, Toolchain};
use crate::workspace::Workspace;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// What a step does.
pub enum Action {
    /// Find or install nvcc and libclang (`cargo xtask toolchain`).
    Bootstrap,
    /// Compile a test kernel for every target architecture.
    SmokeCompile,
    /// Run cargo with these arguments, the toolchain in its environment.
    Cargo(Vec<&'static str>),
    /// The same with these variables set over the toolchain's.
    CargoWithEnv(&'static [(&'static str, &'static str)], Vec<&'static str>),
    /// `fusion plan` on every `graphs/*.toml`, from a build without the
    /// shipped kernels and with these variables set; each must succeed.
    PlanEveryGraph(&'static [(&'static str, &'static str)]),
    /// Work done by xtask itself, given the toolchain.
    Function(fn(&Workspace, &Toolchain) -> Result<()>),
}

pub struct Step {
    pub title: &'static str,
    pub action: Action,
}

impl Step {
    pub fn new(title: &'static str, action: Action) -> Self {
        Step { title, action }
    }
}

/// Why a step failed, and how to run it again by itself (when it is one command).
struct StepFailure {
    reason: String,
    rerun: Option<String>,
}

/// State the steps share: the toolchain, found once.
struct Session<'a> {
    workspace: &'a Workspace,
    toolchain: Option<Toolchain>,
}

impl Session<'_> {
    /// The toolchain, bootstrapping it first if no earlier step did.
    fn toolchain(&mut self) -> std::result::Result<&Toolchain, StepFailure> {
        if self.toolchain.is_none() {
            let found = toolchain::bootstrap(self.workspace).map_err(|error| StepFailure {
                reason: error.to_string(),
                rerun: Some("cargo xtask toolchain".into()),
            })?;
            self.toolchain = Some(found);
        }
        Ok(self.toolchain.as_ref().expect("set just above"))
    }

    fn execute(&mut self, action: &Action) -> std::result::Result<(), StepFailure> {
        match action {
            Action::Bootstrap => self.toolchain().map(|_| ()),
            Action::SmokeCompile => {
                let workspace = self.workspace;
                let nvcc = self.toolchain()?.nvcc.clone();
                toolchain::smoke_compile(workspace, &nvcc).map_err(|error| StepFailure {
                    reason: error.to_string(),
                    rerun: Some(display_command(&toolchain::smoke_compile_command(
                        workspace, &nvcc,
                    ))),
                })
            }
            Action::Cargo(args) => self.run_cargo(&[], args),
            Action::CargoWithEnv(env, args) => self.run_cargo(env, args),
            Action::PlanEveryGraph(env) => self.plan_every_graph(env),
            Action::Function(function) => {
                let workspace = self.workspace;
                let toolchain = self.toolchain()?;
                function(workspace, toolchain).map_err(|error| StepFailure {
                    reason: error.to_string(),
                    rerun: None,
                })
            }
        }
    }

    /// cargo (the one running xtask), in the workspace, with the toolchain's variables.
    fn cargo(&mut self) -> std::result::Result<Command, StepFailure> {
        let root = self.workspace.root.clone();
        let toolchain = self.toolchain()?;
        let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        command.current_dir(root);
        toolchain.apply_to(&mut command);
        Ok(command)
    }

    fn run_cargo(&mut self, env: &[(&str, &str)], args: &[&str]) -> std::result::Result<(), StepFailure> {
        let mut command = self.cargo()?;
        command.envs(env.iter().copied()).args(args);
        run_to_success(
            &mut command,
            format!("{}cargo {}", assignments(env), args.join(" ")),
        )
    }

    fn plan_every_graph(&mut self, env: &[(&str, &str)]) -> std::result::Result<(), StepFailure> {
        let graphs_dir = self.workspace.graphs_dir();
        let graphs = toml_files(&graphs_dir);
        if graphs.is_empty() {
            return Err(StepFailure {
                reason: format!(
                    "no graph files (*.toml) in {}",
                    self.workspace.display(&graphs_dir)
                ),
                rerun: None,
            });
        }
        for graph in graphs {
            let graph = self.workspace.display(&graph);
            println!("--- fusion plan {graph}");
            let mut command = self.cargo()?;
            let args = [
                "run",
                "--quiet",
                "-p",
                "fusion-cli",
                "--no-default-features",
                "--",
                "plan",
                &graph,
            ];
            command.envs(env.iter().copied()).args(args);
            run_to_success(
                &mut command,
                format!("{}cargo {}", assignments(env), args.join(" ")),
            )?;
        }
        Ok(())
    }
}

/// `KEY=value ` for each variable, to put before a command that is shown.
fn assignments(env: &[(&str, &str)]) -> String {
    env.iter().map(|(key, value)| format!("{key}={value} ")).collect()
}

fn run_to_success(command: &mut Command, rerun: String) -> std::result::Result<(), StepFailure> {
    match process::run_inheriting(command) {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(StepFailure {
            reason: format!("`{rerun}` ended with {status}"),
            rerun: Some(rerun),
        }),
        Err(error) => Err(StepFailure {
            reason: error.to_string(),
            rerun: Some(rerun),
        }),
    }
}

/// The `*.toml` files directly in `dir`, sorted by name.
fn toml_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
}

enum Outcome {
    Passed(Duration),
    Failed(Duration),
    Skipped,
}

/// Runs `steps` in order; `name` is the xtask command ("test", "demo") for the
/// closing lines. Stops at the first failure, which it reports itself.
pub fn run(workspace: &Workspace, name: &str, steps: &[Step]) -> Result<()> {
    let mut session = Session {
        workspace,
        toolchain: None,
    };
    let started = Instant::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        println!("\n==> [{}/{}] {}", index + 1, steps.len(), step.title);
        let step_started = Instant::now();
        let result = session.execute(&step.action);
        let took = step_started.elapsed();
        match result {
            Ok(()) => {
                println!("==> ok ({})", format_duration(took));
                outcomes.push(Outcome::Passed(took));
            }
            Err(failure) => {
                outcomes.push(Outcome::Failed(took));
                outcomes.resize_with(steps.len(), || Outcome::Skipped);
                print_summary(steps, &outcomes, started.elapsed());
                eprintln!(
                    "error: `cargo xtask {name}` failed at step {}/{} ({}): {}",
                    index + 1,
                    steps.len(),
                    step.title,
                    failure.reason
                );
                if let Some(rerun) = failure.rerun {
                    eprintln!("re-run that step alone with: {rerun}");
                }
                return Err(Error::Reported);
            }
        }
    }
    print_summary(steps, &outcomes, started.elapsed());
    println!("`cargo xtask {name}`: all {} steps passed", steps.len());
    Ok(())
}

fn print_summary(steps: &[Step], outcomes: &[Outcome], total: Duration) {
    println!("\nsummary:");
    for (step, outcome) in steps.iter().zip(outcomes) {
        let (status, took) = match outcome {
            Outcome::Passed(took) => ("ok", format_duration(*took)),
            Outcome::Failed(took) => ("FAILED", format_duration(*took)),
            Outcome::Skipped => ("skipped", String::new()),
        };
        println!("  {status:<8} {took:>12}  {}", step.title);
    }
    println!("  {:<8} {:>12}", "total", format_duration(total));
}
