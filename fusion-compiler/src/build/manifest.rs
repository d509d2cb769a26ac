//! `OUT_DIR/kernels/units.json`: what each generated unit is (its file, the
//! generations it is built for with their nvcc flags, what it serves, its
//! tiles), so tools that inspect the units, such as xtask's resource report,
//! read this rather than the generated text.
//!
//! ```json
//! { "units": [
//!   { "name": "fusion_kernels_gemm_bias_nk_f16_sm90",
//!     "file": "fusion_kernels_gemm_bias_nk_f16_sm90.cu",
//!     "targets": [ { "name": "sm90",
//!                    "gencode": "-gencode=arch=compute_90a,code=sm_90a",
//!                    "sass_gencode": "-gencode=arch=compute_90a,code=sm_90a" } ],
//!     "used_by": [ "gemm_bias#0" ],
//!     "tiles": [ "large: 128x256x64 (4 stages, cooperative, persistent)" ] } ] }
//! ```
//!
//! `targets` lists the generations oldest first.

use super::{BuildError, Unit};
use std::path::Path;

/// The manifest's file name, next to the units in `OUT_DIR/kernels`.
pub const MANIFEST_FILE: &str = "units.json";

/// One unit's entry.
#[derive(Debug, serde::Serialize)]
struct UnitManifest<'a> {
    pub name: &'a str,
    /// Relative to the manifest's directory.
    pub file: String,
    pub targets: Vec<TargetManifest>,
    pub used_by: &'a [String],
    pub tiles: &'a [String],
}

/// A generation a unit is built for.
#[derive(Debug, serde::Serialize)]
struct TargetManifest {
    pub name: &'static str,
    /// The library build's flag.
    pub gencode: &'static str,
    /// Machine code alone, for a ptxas report.
    pub sass_gencode: &'static str,
}

#[derive(serde::Serialize)]
struct Manifest<'a> {
    units: Vec<UnitManifest<'a>>,
}

/// The manifest's text for `units`, each written as `<name>.cu`.
pub(super) fn render(units: &[Unit]) -> String {
    let manifest = Manifest {
        units: units
            .iter()
            .map(|unit| UnitManifest {
                name: &unit.name,
                file: format!("{}.cu", unit.name),
                targets: unit
                    .archs
                    .iter()
                    .map(|arch| {
                        let target = arch.target();
                        TargetManifest {
                            name: target.arch.name(),
                            gencode: target.gencode,
                            sass_gencode: target.sass_gencode,
                        }
                    })
                    .collect(),
                used_by: &unit.used_by,
                tiles: &unit.tiles,
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&manifest).expect("the manifest is plain data");
    text.push('\n');
    text
}

/// Writes `kernels_dir/units.json` when its contents change.
pub(super) fn write(kernels_dir: &Path, units: &[Unit]) -> Result<(), BuildError> {
    super::cache::write_if_changed(&kernels_dir.join(MANIFEST_FILE), render(units).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Arch;

    #[test]
    fn units_are_listed_with_their_targets_flags_and_users() {
        let unit = Unit {
            name: "lib_gemm_bias_nk_f16_sm80_sm90".into(),
            source: String::new(),
            archs: vec![Arch::Sm80, Arch::Sm90],
            used_by: vec!["gemm_bias#0".into(), "mlp#2".into()],
            tiles: vec!["large: 128x256x64".into()],
        };
        let parsed: serde_json::Value = serde_json::from_str(&render(&[unit])).unwrap();
        let entry = &parsed["units"][0];
        assert_eq!(entry["file"], "lib_gemm_bias_nk_f16_sm80_sm90.cu");
        assert_eq!(entry["used_by"], serde_json::json!(["gemm_bias#0", "mlp#2"]));
        assert_eq!(entry["tiles"], serde_json::json!(["large: 128x256x64"]));
        assert_eq!(entry["targets"][0]["name"], "sm80");
        assert_eq!(
            entry["targets"][0]["gencode"],
            "-gencode=arch=compute_80,code=[sm_80,compute_80]"
        );
        assert_eq!(
            entry["targets"][0]["sass_gencode"],
            "-gencode=arch=compute_80,code=sm_80"
        );
        assert_eq!(
            entry["targets"][1]["sass_gencode"],
            "-gencode=arch=compute_90a,code=sm_90a"
        );
    }
}
