//! The GPU generations a kernel variant is built for: their names, which
//! devices run their code, and which ones a build compiles for (its cargo
//! features, `FUSION_ARCHS`, `CUDA_COMPUTE_CAP`). Always present, because the
//! run time picks a variant with it; how each generation is compiled and what
//! its mainloop takes is `target` (feature `compiler`).

use std::fmt;

/// A GPU generation a kernel variant is built for. Declared oldest first:
/// where several run on a device, the newest is preferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Turing: the WMMA mainloop, f16 only.
    Sm75,
    /// Ampere and Ada: the mma.sync mainloop; also runs on sm_86 and sm_89.
    Sm80,
    /// Hopper, built as sm_90a: the wgmma + TMA mainloop.
    Sm90,
}

/// The compute capabilities (`major.minor`) that run a generation's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunsOn {
    /// Arch-specific machine code (sm_90a) runs on that capability alone.
    Exactly(i32, i32),
    /// Machine code plus PTX, which the driver compiles for any newer device.
    AtLeast(i32, i32),
}

impl RunsOn {
    /// Whether a device of compute capability `major.minor` runs the code.
    pub fn includes(self, major: i32, minor: i32) -> bool {
        match self {
            RunsOn::Exactly(ma, mi) => (major, minor) == (ma, mi),
            RunsOn::AtLeast(ma, mi) => (major, minor) >= (ma, mi),
        }
    }
}

impl Arch {
    /// Every generation, oldest first.
    pub const ALL: [Arch; 3] = [Arch::Sm75, Arch::Sm80, Arch::Sm90];

    /// `sm80`: the cargo feature, the tuned table's stem, the suffix of its
    /// units' names.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm75 => "sm75",
            Arch::Sm80 => "sm80",
            Arch::Sm90 => "sm90",
        }
    }

    /// The arch named `sm75`, `sm80` or `sm90`.
    pub fn parse(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// `sm75, sm80 or sm90`, for messages that list what is accepted.
    pub fn names_listed() -> String {
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }

    /// Which compute capabilities run this generation's code, as its
    /// `gencode` (in `target`) builds it.
    pub fn compute_capabilities(self) -> RunsOn {
        match self {
            // PTX too, so later GPUs can JIT it.
            Arch::Sm75 => RunsOn::AtLeast(7, 5),
            Arch::Sm80 => RunsOn::AtLeast(8, 0),
            // sm_90a: no PTX that a later generation could run.
            Arch::Sm90 => RunsOn::Exactly(9, 0),
        }
    }

    /// Whether this variant's code runs on a device of compute capability
    /// `major.minor`.
    pub fn runs_on(self, major: i32, minor: i32) -> bool {
        self.compute_capabilities().includes(major, minor)
    }

    /// The best of `available` for a compute capability: the newest that
    /// runs there.
    pub fn best_for(major: i32, minor: i32, available: &[Arch]) -> Option<Arch> {
        available
            .iter()
            .copied()
            .filter(|a| a.runs_on(major, minor))
            .max()
    }

    /// The generations whose cargo feature (`CARGO_FEATURE_SM80`, ...) is on
    /// for the crate whose build script runs.
    pub fn from_cargo_features() -> Vec<Arch> {
        Arch::ALL
            .into_iter()
            .filter(|a| std::env::var_os(a.cargo_feature_env()).is_some())
            .collect()
    }

    /// The generations a build script compiles for: `FUSION_ARCHS` (names,
    /// comma-separated: `sm80,sm90`) when set, else `CUDA_COMPUTE_CAP` (the
    /// devices' compute capabilities, comma-separated, as `90` or `8.6`, the
    /// way candle's build tools read it: for each, the newest generation
    /// whose code runs there), else the cargo features (`from_cargo_features`).
    pub fn for_build() -> Result<Vec<Arch>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        match (var("FUSION_ARCHS"), var("CUDA_COMPUTE_CAP")) {
            (Some(names), _) => Arch::from_names(&names),
            (None, Some(caps)) => Arch::from_compute_caps(&caps),
            (None, None) => Ok(Arch::from_cargo_features()),
        }
    }

    /// The environment variables [`Arch::for_build`] reads beside the cargo
    /// features, for `cargo:rerun-if-env-changed`.
    pub const BUILD_ENV: [&'static str; 2] = ["FUSION_ARCHS", "CUDA_COMPUTE_CAP"];

    /// `sm80,sm90` as generations, in order, each once.
    pub fn from_names(list: &str) -> Result<Vec<Arch>, String> {
        let mut archs = list
            .split(',')
            .map(|name| {
                Arch::parse(name.trim()).ok_or_else(|| {
                    format!(
                        "FUSION_ARCHS: `{}` is not one of {}",
                        name.trim(),
                        Arch::names_listed()
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        archs.sort();
        archs.dedup();
        Ok(archs)
    }

    /// `90`, `8.6`, `80,90`: for each compute capability, the newest
    /// generation whose code runs there; in order, each once.
    pub fn from_compute_caps(list: &str) -> Result<Vec<Arch>, String> {
        let mut archs = list
            .split(',')
            .map(|cap| {
                let cap = cap.trim();
                let bad =
                    || format!("CUDA_COMPUTE_CAP: `{cap}` is not a compute capability such as 90 or 8.6");
                let (major, minor) = match cap.split_once('.') {
                    Some((major, minor)) => (
                        major.parse().map_err(|_| bad())?,
                        minor.parse().map_err(|_| bad())?,
                    ),
                    None if cap.len() >= 2 && cap.bytes().all(|b| b.is_ascii_digit()) => {
                        let (major, minor) = cap.split_at(cap.len() - 1);
                        (
                            major.parse().map_err(|_| bad())?,
                            minor.parse().map_err(|_| bad())?,
                        )
                    }
                    None => return Err(bad()),
                };
                Arch::best_for(major, minor, &Arch::ALL).ok_or_else(|| {
                    format!("CUDA_COMPUTE_CAP: no generation runs on compute capability {major}.{minor}")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        archs.sort();
        archs.dedup();
        Ok(archs)
    }

    /// `CARGO_FEATURE_SM80`: how cargo tells a build script the feature is on.
    pub fn cargo_feature_env(self) -> String {
        format!("CARGO_FEATURE_{}", self.name().to_ascii_uppercase())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
