//! Units for explicit (composition, dtype, layout, arch, tile config)
//! choices: what the kernel self-test and a tile sweep compile, through the
//! same templates a build renders, with a given config in place of the
//! tuned one.
//!
//! A candidate list is JSON:
//!
//! ```json
//! { "note": "...",
//!   "candidates": [
//!     { "graph": "gemm_bias_gelu", "dtypes": ["f16", "bf16"], "layouts": ["nk", "kn"],
//!       "archs": ["sm80", "sm90"] },
//!     { "graph": "gemm_bias_gelu", "dtypes": ["f16"], "archs": ["sm90"],
//!       "config": { "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 4 } } } ] }
//! ```
//!
//! `graph` names a graph of the graphs folder; each of its GEMM kernels (or
//! only the one at index `kernel`) becomes one unit per dtype, layout (the
//! graph's own when `layouts` is left out) and arch. `config` is an entry as
//! in the tuned tables (`kernels/tuned/*.json`); without one, the arch's
//! shipped table chooses, as in a build. A config is checked as a tuned
//! entry is: its fields here, with an error naming the candidate; its tile
//! rules and shared memory by nvcc, through the unit's `static_assert`s,
//! whose messages name the list and the candidate.
//!
//! Each candidate's units get a library name of their own, `cand<index>`,
//! so one composition with several configs gives distinct symbols.
//! [`render_kernel`] renders one kernel with a given config as a library of
//! its own, for `fusion tune`. Not here: compiling the units, or what calls
//! them.

use super::{CodegenError, GraphSpec, KernelKey, RenderedUnit, render_with_tables};
use crate::fuse::{Composition, GemmComposition, Plan};
use crate::ir::{DType, WeightLayout};
use crate::select::{Arch, KernelConfig, KernelKind, TileConfig, TunedTable};
use indexmap::IndexMap;
use serde::Deserialize;

/// One entry of a candidate list, as written.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// A graph's name: `graphs/<graph>.toml`.
    pub graph: String,
    /// Only the GEMM kernel at this index of the graph's plan.
    #[serde(default)]
    pub kernel: Option<usize>,
    /// `f16`, `bf16`.
    pub dtypes: Vec<String>,
    /// `kn`, `nk`; left out: the graph's own.
    #[serde(default)]
    pub layouts: Vec<String>,
    /// `sm75`, `sm80`, `sm90`.
    pub archs: Vec<String>,
    /// A tuned-table entry; left out: the shipped table's choice. Read for
    /// each of `archs` as that generation's ([`Candidate::config_for`]).
    #[serde(default)]
    pub config: Option<serde_json::Value>,
}

impl Candidate {
    /// Its `config` read as an entry of `arch`'s tuned table.
    pub fn config_for(&self, arch: Arch) -> Result<Option<KernelConfig>, String> {
        self.config
            .as_ref()
            .map(|value| TileConfig::read_for(arch, || KernelConfig::deserialize(value)))
            .transpose()
            .map_err(|e| format!("its config is not an entry of the {arch} table: {e}"))
    }
}

/// A parsed candidate list.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateList {
    #[serde(default)]
    #[allow(dead_code, reason = "documentation for people reading the file")]
    note: Option<String>,
    /// The candidates, each rendered as its own units.
    pub candidates: Vec<Candidate>,
}

impl CandidateList {
    /// Parses a list; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<CandidateList, String> {
        serde_json::from_str(text).map_err(|e| format!("{file}: {e}"))
    }
}

/// One rendered unit of a candidate, and what its caller needs to feed it
/// and check it.
#[derive(Clone, Debug)]
pub struct CandidateUnit {
    /// Its candidate's index in the list.
    pub candidate: usize,
    /// The arch it is rendered for.
    pub arch: Arch,
    /// Its element type.
    pub dtype: DType,
    /// The GEMM it computes.
    pub composition: GemmComposition,
    /// Its tile configs.
    pub config: KernelConfig,
    /// The rendered unit.
    pub unit: RenderedUnit,
}

/// Renders every unit of `list` (read from `file`, which errors name);
/// `load_plan` gives the plan of a graph by name.
pub fn render_candidates(
    file: &str,
    list: &CandidateList,
    mut load_plan: impl FnMut(&str) -> Result<Plan, String>,
) -> Result<Vec<CandidateUnit>, String> {
    let mut units = Vec::new();
    let mut plans: IndexMap<String, Plan> = IndexMap::new();
    for (index, candidate) in list.candidates.iter().enumerate() {
        let fail = |message: String| format!("{file}, candidate {index} (`{}`): {message}", candidate.graph);
        if !plans.contains_key(&candidate.graph) {
            let plan = load_plan(&candidate.graph).map_err(fail)?;
            plans.insert(candidate.graph.clone(), plan);
        }
        let plan = &plans[&candidate.graph];
        let gemms: Vec<(usize, &GemmComposition)> = plan
            .kernels
            .iter()
            .enumerate()
            .filter_map(|(i, k)| match &k.composition {
                Composition::Gemm(gemm) if candidate.kernel.is_none_or(|want| want == i) => Some((i, gemm)),
                _ => None,
            })
            .collect();
        if gemms.is_empty() {
            return Err(fail(match candidate.kernel {
                Some(i) => format!("kernel {i} of its plan is not a GEMM"),
                None => "its plan has no GEMM kernel".into(),
            }));
        }
        let dtypes = parse_all(&candidate.dtypes, "dtype", |s| s.parse::<DType>().ok()).map_err(fail)?;
        let archs = parse_all(&candidate.archs, "arch", Arch::parse).map_err(fail)?;
        let layouts = parse_all(&candidate.layouts, "layout", |s| match s {
            "kn" => Some(WeightLayout::KN),
            "nk" => Some(WeightLayout::NK),
            _ => None,
        })
        .map_err(fail)?;
        for &(kernel_index, gemm) in &gemms {
            let own_layout = [gemm.b_layout];
            let layouts = if layouts.is_empty() {
                &own_layout[..]
            } else {
                &layouts[..]
            };
            for &arch in &archs {
                let config = candidate.config_for(arch).map_err(fail)?;
                for &dtype in &dtypes {
                    if !arch.supports(dtype) {
                        return Err(fail(format!("{arch} has no {dtype} kernels")));
                    }
                    for &layout in layouts {
                        let composition = GemmComposition {
                            b_layout: layout,
                            ..gemm.clone()
                        };
                        let unit = render_kernel(
                            &format!("cand{index}"),
                            &format!("{file}, candidate {index}"),
                            KernelChoice {
                                plan,
                                kernel_index,
                                composition: &composition,
                                dtype,
                                arch,
                            },
                            config,
                        )
                        .map_err(|e| fail(e.to_string()))?
                        .unit;
                        let KernelKey::Gemm { config, .. } = unit.key else {
                            unreachable!("a GEMM composition renders a GEMM unit")
                        };
                        units.push(CandidateUnit {
                            candidate: index,
                            arch,
                            dtype,
                            composition,
                            config,
                            unit,
                        });
                    }
                }
            }
        }
    }
    Ok(units)
}

/// Each of `names` parsed, or an error naming the first that is not a `what`.
fn parse_all<T>(names: &[String], what: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    names
        .iter()
        .map(|name| parse(name).ok_or_else(|| format!("`{name}` is not a {what}")))
        .collect()
}

/// One GEMM kernel of a plan, with the composition, dtype and arch to
/// render it for.
#[derive(Clone, Copy, Debug)]
pub struct KernelChoice<'a> {
    /// The plan the kernel is in.
    pub plan: &'a Plan,
    /// The kernel's index in `plan`.
    pub kernel_index: usize,
    /// The kernel's composition.
    pub composition: &'a GemmComposition,
    /// The element type to render it in.
    pub dtype: DType,
    /// The arch to render it for.
    pub arch: Arch,
}

/// A one-kernel library: the kernel's unit and the unit with
/// `<lib>_error_string`, `(file stem, source)`.
#[derive(Clone, Debug)]
pub struct KernelUnits {
    /// The kernel's unit.
    pub unit: RenderedUnit,
    /// The unit with `<lib>_error_string`, `(file stem, source)`.
    pub error_unit: (String, String),
}

/// The unit of one GEMM kernel, rendered as a build renders it, from a
/// one-kernel plan, as the library `lib_name` (its symbols' prefix). Given
/// a `config`, a table holding only that config (named `table` in the
/// unit's messages) replaces the arch's shipped one; without, the shipped
/// table chooses.
pub fn render_kernel(
    lib_name: &str,
    table: &str,
    choice: KernelChoice<'_>,
    config: Option<KernelConfig>,
) -> Result<KernelUnits, CodegenError> {
    let KernelChoice {
        plan,
        kernel_index,
        composition,
        dtype,
        arch,
    } = choice;
    let mut kernel = plan.kernels[kernel_index].clone();
    kernel.composition = Composition::Gemm(composition.clone());
    let spec = GraphSpec {
        plan: Plan {
            graph: plan.graph.clone(),
            kernels: vec![kernel],
            splits: Vec::new(),
        },
        dtypes: vec![dtype],
        origin: table.to_owned(),
        fingerprint: None,
        declaration: String::new(),
    };
    let tables: Vec<TunedTable> = config
        .iter()
        .map(|&config| TunedTable {
            file: table.to_owned(),
            arch,
            configs: IndexMap::from([(
                format!("{}.{dtype}", KernelKind::of(composition, dtype).name),
                config,
            )]),
            unfused: Vec::new(),
        })
        .collect();
    let library = render_with_tables(lib_name, &[arch], &[spec], &tables)?;
    Ok(KernelUnits {
        unit: library
            .units
            .into_iter()
            .next()
            .expect("a one-kernel plan renders one unit"),
        error_unit: library.error_unit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A shipped graph's plan.
    fn plan_of(name: &str) -> Result<Plan, String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../graphs/{name}.toml"));
        if !path.exists() {
            return Err(format!("no graph `{name}`"));
        }
        crate::load_toml_graph(&path).map(crate::fuse::plan)
    }

    fn render(text: &str) -> Result<Vec<CandidateUnit>, String> {
        let list = CandidateList::parse("list.json", text)?;
        render_candidates("list.json", &list, plan_of)
    }

    #[test]
    fn a_candidate_expands_to_a_unit_per_dtype_layout_and_arch() {
        let units = render(
            r#"{ "candidates": [ { "graph": "gemm_bias_gelu", "dtypes": ["f16", "bf16"],
                 "layouts": ["kn", "nk"], "archs": ["sm80", "sm90"] } ] }"#,
        )
        .unwrap();
        assert_eq!(units.len(), 8);
        let symbols: Vec<&str> = units.iter().map(|u| u.unit.symbol.as_str()).collect();
        assert!(
            symbols.contains(&"cand0_gemm_bias_gelu_kn_bf16_sm90"),
            "{symbols:?}"
        );
        assert!(
            symbols.contains(&"cand0_gemm_bias_gelu_nk_f16_sm80"),
            "{symbols:?}"
        );
        // Without a config, the shipped table chooses, as in a build.
        let shipped = TunedTable::shipped(Arch::Sm90).unwrap();
        let sm90 = units
            .iter()
            .find(|u| u.arch == Arch::Sm90 && u.dtype == DType::F16)
            .unwrap();
        let kind = KernelKind::of(&sm90.composition, DType::F16);
        assert_eq!(
            sm90.config,
            crate::select::select_with(&shipped, Arch::Sm90, &kind).unwrap()
        );
    }

    #[test]
    fn a_given_config_replaces_the_tuned_one_and_two_configs_get_two_symbols() {
        let units = render(
            r#"{ "candidates": [
                 { "graph": "gemm_bias_gelu", "dtypes": ["f16"], "archs": ["sm90"],
                   "config": { "large": { "bm": 64, "bn": 128, "bk": 64, "stages": 7 } } },
                 { "graph": "gemm_bias_gelu", "dtypes": ["f16"], "archs": ["sm90"],
                   "config": { "large": { "bm": 128, "bn": 128, "bk": 64, "stages": 3, "schedule": "pingpong" } } } ] }"#,
        )
        .unwrap();
        assert_eq!(units.len(), 2);
        assert_eq!(units[0].config.large.stages, 7);
        assert!(
            units[0]
                .unit
                .source
                .contains("fusion::sm90::TileConfig<64, 128, 7,")
        );
        assert!(units[1].unit.source.contains("Schedule::PingPong"));
        assert_ne!(units[0].unit.symbol, units[1].unit.symbol);
        // The graph's own layout when none is given.
        assert_eq!(units[0].composition.b_layout, WeightLayout::NK);
    }

    #[test]
    fn a_config_with_fields_its_mainloop_does_not_take_is_refused_naming_the_candidate() {
        let err = render(
            r#"{ "candidates": [ { "graph": "gemm_bias_gelu", "dtypes": ["f16"], "archs": ["sm90"],
                 "config": { "large": { "bm": 128, "bn": 128, "bk": 64, "warp_m": 64, "stages": 4 } } } ] }"#,
        )
        .unwrap_err();
        assert!(err.contains("list.json, candidate 0"), "{err}");
        assert!(err.contains("not an entry of the sm90 table"), "{err}");
        assert!(err.contains("unknown field `warp_m`"), "{err}");
    }

    #[test]
    fn unknown_names_are_refused() {
        let one = |field: &str| {
            render(&format!(
                r#"{{ "candidates": [ {{ "graph": "gemm_bias_gelu", "dtypes": ["f16"], "archs": ["sm90"], {field} }} ] }}"#
            ))
            .unwrap_err()
        };
        assert!(one(r#""layouts": ["mk"]"#).contains("`mk` is not a layout"));
        assert!(one(r#""kernel": 3"#).contains("kernel 3 of its plan is not a GEMM"));
        let bf16_on_sm75 = render(
            r#"{ "candidates": [ { "graph": "gemm_bias_gelu", "dtypes": ["bf16"], "archs": ["sm75"] } ] }"#,
        )
        .unwrap_err();
        assert!(
            bf16_on_sm75.contains("sm75 has no bf16 kernels"),
            "{bf16_on_sm75}"
        );
        let missing =
            render(r#"{ "candidates": [ { "graph": "nope", "dtypes": ["f16"], "archs": ["sm90"] } ] }"#)
                .unwrap_err();
        assert!(
            missing.contains("candidate 0 (`nope`): no graph `nope`"),
            "{missing}"
        );
    }
}
