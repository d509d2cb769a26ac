//! The GPU generations fusion builds for, as fusion-compiler writes them
//! (`fusion-compiler/kernels/targets.json`, kept equal to its `target`
//! module by a test there): their names, which are also their cargo
//! features, and their nvcc flags. Embedded, so xtask rebuilds when the
//! file changes and never keeps a list of its own.

use std::sync::OnceLock;

/// One generation's facts.
pub struct Generation {
    /// `sm80`: its name and cargo feature.
    pub name: String,
    /// nvcc's `-gencode` flag for its machine code alone.
    pub sass_gencode: String,
}

const TARGETS_JSON: &str = include_str!("../../fusion-compiler/kernels/targets.json");

/// Every generation, oldest first.
pub fn generations() -> &'static [Generation] {
    static GENERATIONS: OnceLock<Vec<Generation>> = OnceLock::new();
    GENERATIONS.get_or_init(|| {
        let file: serde_json::Value =
            serde_json::from_str(TARGETS_JSON).expect("fusion-compiler/kernels/targets.json is JSON");
        let text = |g: &serde_json::Value, field: &str| {
            g[field]
                .as_str()
                .unwrap_or_else(|| {
                    panic!("fusion-compiler/kernels/targets.json: a generation without `{field}`")
                })
                .to_owned()
        };
        file["generations"]
            .as_array()
            .expect("fusion-compiler/kernels/targets.json lists `generations`")
            .iter()
            .map(|g| Generation {
                name: text(g, "name"),
                sass_gencode: text(g, "sass_gencode"),
            })
            .collect()
    })
}

/// `sm75, sm80, sm90`: every generation's name, for messages.
pub fn names() -> String {
    generations()
        .iter()
        .map(|g| g.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `prefix/sm75,prefix/sm80,...`: every generation's feature of the crate
/// `prefix`, comma-separated (each without a `/` where `prefix` is empty).
pub fn features(prefix: &str) -> String {
    generations()
        .iter()
        .map(|g| match prefix {
            "" => g.name.clone(),
            crate_name => format!("{crate_name}/{}", g.name),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generations_are_read_from_the_compilers_file() {
        let names: Vec<&str> = generations().iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["sm75", "sm80", "sm90"]);
        assert_eq!(features("fusion"), "fusion/sm75,fusion/sm80,fusion/sm90");
        assert_eq!(features(""), "sm75,sm80,sm90");
        assert!(
            generations()
                .iter()
                .all(|g| g.sass_gencode.starts_with("-gencode=arch=compute_"))
        );
    }
}
