//! Which compiled kernel variant runs on a device.
//!
//! The built-in library carries one variant per generation it was built for
//! (`sm75`, `sm80`, `sm90`: the enabled cargo features, or `FUSION_ARCHS` or
//! `CUDA_COMPUTE_CAP`, which replace them; the build script passes the
//! generations in `FUSION_COMPILED_ARCHS`); a crate
//! that compiles its own graphs carries the variants its build script built,
//! which may be others. Each wrapper asks for the best variant among its own
//! ([`arch_among`]). The device's compute capability is read once per
//! device and then without a lock (every call asks); `FUSION_FORCE_ARCH`
//! (read once per process) overrides the choice (tests use it to run the
//! sm75 and sm80 variants, as PTX, on newer GPUs).

use crate::error::{Error, Result};
use cudarc::driver::CudaStream;
use std::sync::{Mutex, OnceLock};

/// A kernel variant: the GPU generation its mainloop was written for (the
/// compiler's own type; what runs where is `Arch::runs_on`).
pub use fusion_compiler::arch::Arch;

/// The names of the generations the built-in library was compiled for,
/// comma-separated, as the build script chose them (`Arch::for_build`).
const COMPILED_ARCHS: &str = env!("FUSION_COMPILED_ARCHS");

/// Variants compiled into the built-in library.
pub fn compiled() -> Vec<Arch> {
    Arch::ALL.into_iter().filter(|&a| is_compiled(a)).collect()
}

/// Whether the built-in library has a variant for `arch`.
pub fn is_compiled(arch: Arch) -> bool {
    COMPILED_ARCHS.split(',').any(|name| name == arch.name())
}

fn compiled_list(compiled: &[Arch]) -> String {
    let names: Vec<&str> = compiled.iter().map(|a| a.name()).collect();
    if names.is_empty() {
        "no variants".into()
    } else {
        names.join(", ")
    }
}

/// Compute capability per device ordinal, read on first use: every call
/// asks, so the first 64 devices are read without a lock.
static CAPABILITY: [OnceLock<(i32, i32)>; 64] = [const { OnceLock::new() }; 64];

/// Devices past the first 64, under a lock.
static MORE_CAPABILITIES: Mutex<Vec<Option<(i32, i32)>>> = Mutex::new(Vec::new());

/// The stream's device's compute capability (major, minor).
fn capability(stream: &CudaStream) -> Result<(i32, i32)> {
    let ctx = stream.context();
    let ordinal = ctx.ordinal();
    if let Some(known) = CAPABILITY.get(ordinal) {
        if let Some(&capability) = known.get() {
            return Ok(capability);
        }
        let capability = ctx.compute_capability()?;
        return Ok(*known.get_or_init(|| capability));
    }
    let more = ordinal - CAPABILITY.len();
    if let Some(Some(known)) = MORE_CAPABILITIES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(more)
    {
        return Ok(*known);
    }
    let capability = ctx.compute_capability()?;
    let mut known = MORE_CAPABILITIES.lock().unwrap_or_else(|e| e.into_inner());
    if known.len() <= more {
        known.resize(more + 1, None);
    }
    known[more] = Some(capability);
    Ok(capability)
}

/// The variant of the built-in library to launch on the stream's device.
pub fn arch_for(stream: &CudaStream) -> Result<Arch> {
    arch_among(stream, &compiled())
}

/// The variant to launch on the stream's device among `compiled`, the ones
/// a wrapper's own library contains (a user crate's build may have built
/// other generations than this crate's features name).
pub fn arch_among(stream: &CudaStream, compiled: &[Arch]) -> Result<Arch> {
    let (major, minor) = capability(stream)?;
    choose(major, minor, forced_arch(), compiled)
}

/// `FUSION_FORCE_ARCH`, read once per process: every wrapper call chooses
/// its variant, and that path does not read the environment.
fn forced_arch() -> Option<&'static str> {
    static FORCED: OnceLock<Option<String>> = OnceLock::new();
    crate::launch::env_once(&FORCED, "FUSION_FORCE_ARCH")
}

/// The variant among `compiled` for a compute capability, honouring a
/// forced choice.
pub fn choose(major: i32, minor: i32, forced: Option<&str>, compiled: &[Arch]) -> Result<Arch> {
    if let Some(value) = forced.filter(|v| !v.is_empty()) {
        let reason = match Arch::parse(value) {
            None => format!("expected {}", Arch::names_listed()),
            Some(a) if !compiled.contains(&a) => format!("this build has {}", compiled_list(compiled)),
            Some(a) if !a.runs_on(major, minor) => {
                format!(
                    "{} code does not run on compute capability {major}.{minor}",
                    a.name()
                )
            }
            Some(a) => return Ok(a),
        };
        return Err(Error::ForcedArch {
            value: value.to_string(),
            reason,
        });
    }
    Arch::best_for(major, minor, compiled).ok_or(Error::UnsupportedDevice {
        major,
        minor,
        compiled: compiled_list(compiled),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_variant_per_capability() {
        let all = Arch::ALL;
        assert_eq!(Arch::best_for(9, 0, &all), Some(Arch::Sm90));
        // sm_90a machine code does not run on later majors; sm80 PTX does.
        assert_eq!(Arch::best_for(10, 0, &all), Some(Arch::Sm80));
        assert_eq!(Arch::best_for(8, 9, &all), Some(Arch::Sm80));
        assert_eq!(Arch::best_for(8, 6, &[Arch::Sm75]), Some(Arch::Sm75));
        assert_eq!(Arch::best_for(7, 0, &all), None);
        assert_eq!(Arch::best_for(8, 0, &[Arch::Sm90]), None);
    }

    #[test]
    fn a_library_with_other_variants_than_this_crate_chooses_among_its_own() {
        // A user crate built sm80 only, on an H100: its sm80 PTX runs there,
        // whatever this crate's features are.
        assert_eq!(choose(9, 0, None, &[Arch::Sm80]).unwrap(), Arch::Sm80);
        assert_eq!(choose(9, 0, None, &[Arch::Sm80, Arch::Sm90]).unwrap(), Arch::Sm90);
        // Forcing one it does not have names what it has.
        let e = choose(9, 0, Some("sm90"), &[Arch::Sm80]).unwrap_err().to_string();
        assert!(e.contains("this build has sm80"), "{e}");
        // None that runs here: the error lists the library's own.
        let e = choose(8, 0, None, &[Arch::Sm90]).unwrap_err().to_string();
        assert!(e.contains("sm90"), "{e}");
    }

    #[test]
    fn compiled_variants_are_the_enabled_features() {
        // A spot check of what the build script passed: with `kernels`
        // the default build has sm80 and sm90, `--features sm75` adds sm75;
        // without it nothing is compiled.
        let kernels = cfg!(feature = "kernels");
        assert_eq!(is_compiled(Arch::Sm75), kernels && cfg!(feature = "sm75"));
        assert_eq!(is_compiled(Arch::Sm80), kernels && cfg!(feature = "sm80"));
        assert_eq!(is_compiled(Arch::Sm90), kernels && cfg!(feature = "sm90"));
    }

    #[test]
    fn forced_arch_is_checked() {
        assert!(matches!(
            choose(9, 0, Some("sm60"), &compiled()),
            Err(Error::ForcedArch { .. })
        ));
        if is_compiled(Arch::Sm90) {
            let e = choose(8, 0, Some("sm90"), &compiled()).unwrap_err().to_string();
            assert!(e.contains("does not run on compute capability 8.0"), "{e}");
        }
        // A variant this build left out.
        if let Some(missing) = Arch::ALL.into_iter().find(|&a| !is_compiled(a)) {
            let e = choose(9, 0, Some(missing.name()), &compiled()).unwrap_err();
            assert!(matches!(e, Error::ForcedArch { .. }), "{e}");
            assert!(e.to_string().contains("this build has"), "{e}");
        }
        // An empty value means "not forced".
        if !compiled().is_empty() {
            assert!(choose(9, 0, Some(""), &compiled()).is_ok());
        }
    }

    #[test]
    fn a_device_older_than_every_variant_is_refused_with_the_fix() {
        // Volta (7.0) is older than the oldest variant (sm75).
        let e = choose(7, 0, None, &compiled()).unwrap_err();
        assert!(
            matches!(
                e,
                Error::UnsupportedDevice {
                    major: 7,
                    minor: 0,
                    ..
                }
            ),
            "{e}"
        );
        let message = e.to_string();
        assert!(message.contains("compute capability 7.0"), "{message}");
        assert!(message.contains("rebuild with the cargo feature"), "{message}");
        // Forcing a variant does not make it run there.
        let forced = choose(7, 0, Some("sm75"), &compiled()).unwrap_err();
        assert!(matches!(forced, Error::ForcedArch { .. }), "{forced}");
    }
}
