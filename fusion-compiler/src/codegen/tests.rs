use super::*;
use crate::fuse::NamedPattern;
use std::path::Path;

fn spec(file: &str, dtypes: &[DType]) -> GraphSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs").join(file);
    let graph = crate::load_toml_graph(&path).unwrap_or_else(|e| panic!("{e}"));
    GraphSpec {
        plan: crate::fuse::plan(graph),
        dtypes: dtypes.to_vec(),
        origin: format!("graphs/{file}"),
        fingerprint: None,
        declaration: String::new(),
    }
}

const F16: &[DType] = &[DType::F16];

#[test]
fn ffn_renders_two_kernels_the_gated_pair_in_one() {
    let lib = render("fusion_kernels", &[Arch::Sm80], &[spec("swiglu_ffn.toml", F16)]).unwrap();
    assert_eq!(lib.units.len(), 2);
    let symbols: Vec<&str> = lib.units.iter().map(|u| u.symbol.as_str()).collect();
    assert_eq!(
        symbols,
        [
            "fusion_kernels_gemm_silu_glu_nk_f16_sm80",
            "fusion_kernels_gemm_bias_residual_nk_f16_sm80",
        ]
    );
    let silu_mul = &lib.units[0].source;
    assert!(
        silu_mul.contains("using Chain = fusion::GatedChain<fusion::Silu, fusion::EpilogueChain<>>;"),
        "{silu_mul}"
    );
    assert!(
        silu_mul.contains("args.n = p->n * Chain::kGemmColsPerOutput;"),
        "{silu_mul}"
    );
    assert!(
        silu_mul.contains(
            "extern \"C\" int fusion_kernels_gemm_silu_glu_nk_f16_sm80(const fusion_gemm_params* p"
        )
    );
    // The bound weights are interleaved once; there is no norm to fold.
    assert!(
        silu_mul.contains("fusion::launch_interleave<Element, fusion::LayoutB::NK>("),
        "{silu_mul}"
    );
    assert!(!silu_mul.contains("launch_fold_weights"), "{silu_mul}");
    assert!(
        silu_mul
            .contains("fusion::sm80::TileConfig<128, 128, 32, 64, 64, 4, 2, fusion::sm80::KLoop::Pipelined>"),
        "{silu_mul}"
    );
    assert!(
        silu_mul.contains("if (p->m <= 512) return f(K<SmallTile>{});"),
        "{silu_mul}"
    );
    // The launch and the workspace query pick the kernel in one place.
    assert_eq!(silu_mul.matches("with_kernel<K>(p, ").count(), 2, "{silu_mul}");
    // Without a norm there is no folded form.
    assert!(!silu_mul.contains("_folded("), "{silu_mul}");
    // sm80's tables have no second small-M tile.
    assert!(!silu_mul.contains("SmallAltTile"), "{silu_mul}");
    // The header declares each launcher and the error string.
    let (name, header) = &lib.header;
    assert_eq!(name, "fusion_kernels.h");
    for symbol in symbols {
        assert!(header.contains(&format!(
            "int {symbol}(const fusion_gemm_params* p, void* stream);"
        )));
        assert!(header.contains(&format!(
            "int {symbol}_workspace_bytes(const fusion_gemm_params* p, void* stream, uint64_t* bytes);"
        )));
    }
    assert!(header.contains(
        "int fusion_kernels_gemm_silu_glu_nk_f16_sm80_fold_weights(const fusion_fold_params* p, void* stream);"
    ));
    assert!(!header.contains("fusion_kernels_gemm_bias_residual_nk_f16_sm80_fold_weights"));
    assert!(header.contains("const char* fusion_kernels_error_string(int code);"));
    assert!(lib.error_unit.1.contains("fusion_kernels_error_string(int code)"));
}

#[test]
fn identical_kernels_share_a_unit() {
    // gemm_bias_residual appears in gemm_bias_residual, swiglu_ffn and gpt2_mlp.
    let specs = [
        spec("gemm_bias_residual.toml", F16),
        spec("swiglu_ffn.toml", F16),
        spec("gpt2_mlp.toml", F16),
    ];
    let lib = render("fusion_kernels", &[Arch::Sm80, Arch::Sm90], &specs).unwrap();
    let residual: Vec<_> = lib
        .units
        .iter()
        .filter(|u| u.symbol.contains("_gemm_bias_residual_"))
        .collect();
    // One unit per arch (sm90 runs its own mainloop), each shared by all three.
    assert_eq!(residual.len(), 2);
    for (unit, arch) in residual.iter().zip([Arch::Sm80, Arch::Sm90]) {
        assert_eq!(unit.archs, [arch]);
        assert!(
            unit.source
                .contains("Used by: gemm_bias_residual#0, swiglu_ffn#1, gpt2_mlp#1")
        );
        for graph in &lib.graphs {
            let last = graph.kernels.last().unwrap();
            assert_eq!(last.symbol(DType::F16, arch), Some(unit.symbol.as_str()));
        }
    }
    // Symbols are unique.
    let mut symbols: Vec<_> = lib.units.iter().map(|u| &u.symbol).collect();
    symbols.sort();
    symbols.dedup();
    assert_eq!(symbols.len(), lib.units.len());
}

#[test]
fn every_named_pattern_renders_its_chain() {
    for pattern in NamedPattern::ALL {
        let file = format!("{}.toml", pattern.name());
        let lib = render("fusion_kernels", &[Arch::Sm80], &[spec(&file, F16)]).unwrap();
        assert_eq!(lib.units.len(), 1, "{file}");
        let (prologue, steps) = pattern.parts();
        let chain: Vec<&str> = steps.iter().map(|s| s.cuda_type()).collect();
        let source = &lib.units[0].source;
        assert!(
            source.contains(&format!("fusion::EpilogueChain<{}>", chain.join(", "))),
            "{file}:\n{source}"
        );
        let expected_prologue = match prologue {
            None => "fusion::NoPrologue".to_owned(),
            Some(kind) => format!("fusion::NormPrologue<fusion::NormKind::{}>", norm_type(kind)),
        };
        assert!(source.contains(&expected_prologue), "{file}:\n{source}");
    }
}

#[test]
fn dtypes_and_archs_multiply_variants() {
    let lib = render(
        "my_kernels",
        &[Arch::Sm75, Arch::Sm80, Arch::Sm90],
        &[spec("gemm_bias_gelu.toml", &[DType::F16, DType::BF16])],
    )
    .unwrap();
    let symbols: Vec<&str> = lib.units.iter().map(|u| u.symbol.as_str()).collect();
    // sm75 has no bf16; sm80 and sm90 have tiles of their own.
    assert_eq!(
        symbols,
        [
            "my_kernels_gemm_bias_gelu_nk_f16_sm75",
            "my_kernels_gemm_bias_gelu_nk_f16_sm80",
            "my_kernels_gemm_bias_gelu_nk_f16_sm90",
            "my_kernels_gemm_bias_gelu_nk_bf16_sm80",
            "my_kernels_gemm_bias_gelu_nk_bf16_sm90",
        ]
    );
    assert!(
        lib.units[0]
            .source
            .contains("fusion::sm75::Mainloop<Element, fusion::LayoutB::NK, Tile>")
    );
    assert!(!lib.units[0].source.contains("SmallTile"));
    assert!(lib.units[3].source.contains("using Element = __nv_bfloat16;"));
    let kernel = &lib.graphs[0].kernels[0];
    assert_eq!(kernel.symbol(DType::BF16, Arch::Sm75), None);
    assert_eq!(kernel.variants.len(), 5);
}

#[test]
fn sm90_units_use_the_sm90_mainloop_norm_compositions_too() {
    let lib = render(
        "k",
        &[Arch::Sm80, Arch::Sm90],
        &[spec("gemm_bias_gelu.toml", F16), spec("layernorm_gemm.toml", F16)],
    )
    .unwrap();
    let unit = |symbol: &str| {
        lib.units
            .iter()
            .find(|u| u.symbol == symbol)
            .unwrap_or_else(|| panic!("no unit {symbol}"))
    };
    let sm90 = unit("k_gemm_bias_gelu_nk_f16_sm90");
    assert!(matches!(sm90.key, KernelKey::Gemm { arch: Arch::Sm90, .. }));
    for needle in [
        "#include \"fusion/sm90/mainloop.cuh\"",
        "fusion::FusedGemm<fusion::sm90::Mainloop<Element, fusion::LayoutB::NK, Tile>, fusion::NoPrologue,",
        "using LargeTile = fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative>;",
        "// 128x256x64 (4 stages, cooperative, persistent)",
        "using SmallTile = fusion::sm90::TileConfig<64, 128, 8, fusion::sm90::Schedule::Cooperative>;",
        "using SmallAltTile = fusion::sm90::TileConfig<128, 128, 6, fusion::sm90::Schedule::Cooperative>;",
        // Every tier competes (the small ones up to m = 1024); the one whose
        // busiest CTA loads least runs.
        "fusion::LightestTier lightest(p->m, p->n * Chain::kGemmColsPerOutput);",
        "lightest.offer<LargeAltTile>(FUSION_GEMM_TILE_LARGE_ALT);",
        "  if (p->m <= 1024) {\n    lightest.offer<SmallAltTile>(FUSION_GEMM_TILE_SMALL_M_ALT);\n    lightest.offer<SmallTile>(FUSION_GEMM_TILE_SMALL_M);\n  }",
    ] {
        assert!(
            sm90.source.contains(needle),
            "`{needle}` missing from:\n{}",
            sm90.source
        );
    }
    assert!(!sm90.source.contains("sm80"), "{}", sm90.source);
    // The sm80 unit of the same composition stays apart.
    let sm80 = unit("k_gemm_bias_gelu_nk_f16_sm80");
    assert!(sm80.source.contains("#include \"fusion/sm80/mainloop.cuh\""));
    assert!(!sm80.source.contains("sm90"));
    // A norm composition on sm90 runs the sm90 mainloop too, with
    // sm90.json's default tiles.
    let norm = lib
        .units
        .iter()
        .find(|u| u.symbol.starts_with("k_layernorm_gemm_nk_f16") && u.archs.contains(&Arch::Sm90))
        .unwrap();
    assert!(matches!(norm.key, KernelKey::Gemm { arch: Arch::Sm90, .. }));
    for needle in [
        "#include \"fusion/sm90/mainloop.cuh\"",
        "fusion::FusedGemm<fusion::sm90::Mainloop<Element, fusion::LayoutB::NK, Tile>, fusion::NormPrologue<fusion::NormKind::LayerNorm>,",
        "using LargeTile = fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative>;",
        // ...and its folded form (abi.h), with the one-time fold of W.
        "using Chain = fusion::EpilogueChain<>;",
        "fusion::FoldedNorm<fusion::NormKind::LayerNorm>, Chain>;",
        "extern \"C\" int k_layernorm_gemm_nk_f16_sm90_folded(const fusion_gemm_params* p, void* stream)",
        "fusion::launch_fold_weights<fusion::NormKind::LayerNorm, Element, fusion::LayoutB::NK, false>(",
    ] {
        assert!(
            norm.source.contains(needle),
            "`{needle}` missing from:\n{}",
            norm.source
        );
    }
}

#[test]
fn gemm_units_report_their_tiles_resources_and_check_their_shared_memory() {
    let lib = render(
        "k",
        &[Arch::Sm80, Arch::Sm90],
        &[spec("gemm_bias_gelu.toml", F16)],
    )
    .unwrap();
    let unit = |symbol: &str| lib.units.iter().find(|u| u.symbol == symbol).unwrap();
    let sm90 = unit("k_gemm_bias_gelu_nk_f16_sm90");
    // One check per tile config, each naming the table entry it came from.
    for (alias, which, summary) in [
        (
            "LargeTile",
            "large",
            "128x256x64 (4 stages, cooperative, persistent)",
        ),
        (
            "SmallTile",
            "small_m",
            "64x128x64 (8 stages, cooperative, persistent)",
        ),
        (
            "SmallAltTile",
            "small_m_alt",
            "128x128x64 (6 stages, cooperative, persistent)",
        ),
    ] {
        let check = format!(
            "static_assert(Kernel<{alias}>::kBlockSmemBytes <= fusion::sm90::kSmemPerBlock,\n              \"tile config from kernels/tuned/sm90.json, entry 'default' for 'gemm_bias_gelu' ({which}) does not fit sm90: {summary} needs more shared memory per block than sm90 allows\");"
        );
        let resources = format!(
            "{{\"{which}\", uint32_t(Kernel<{alias}>::kSmemBytes), uint32_t(Kernel<{alias}>::kThreads)}},"
        );
        for needle in [check, resources] {
            assert!(
                sm90.source.contains(&needle),
                "`{needle}` missing from:\n{}",
                sm90.source
            );
        }
    }
    assert!(sm90.source.contains(
        "extern \"C\" int k_gemm_bias_gelu_nk_f16_sm90_resources(fusion_tile_resources* out, int capacity) {"
    ));
    // sm80 checks against its own limit; sm80.json's default has no small_m_alt.
    let sm80 = unit("k_gemm_bias_gelu_nk_f16_sm80");
    assert!(
        sm80.source
            .contains("static_assert(Kernel<SmallTile>::kBlockSmemBytes <= fusion::sm80::kSmemPerBlock,"),
        "{}",
        sm80.source
    );
    assert!(!sm80.source.contains("SmallAltTile"), "{}", sm80.source);
    assert!(
        sm80.source
            .contains("{\"large\", uint32_t(Kernel<LargeTile>::kSmemBytes)")
    );
    let (_, header) = &lib.header;
    for symbol in ["k_gemm_bias_gelu_nk_f16_sm80", "k_gemm_bias_gelu_nk_f16_sm90"] {
        let declaration = format!("int {symbol}_resources(fusion_tile_resources* out, int capacity);");
        assert!(
            header.contains(&declaration),
            "`{declaration}` missing from:\n{header}"
        );
    }
}

#[test]
fn tile_check_messages_are_c_string_literals() {
    assert_eq!(c_string("entry `a.f16` (large)"), "entry `a.f16` (large)");
    assert_eq!(c_string(r#"dir\"x".json"#), r#"dir\\\"x\".json"#);
    // Outside printable ASCII, each byte is a hex escape ending its literal.
    assert_eq!(c_string("é1"), r#"\xc3""\xa9""1"#);
}

#[test]
fn bf16_for_sm75_alone_is_a_build_error_naming_the_file() {
    let only_turing = render(
        "fusion_kernels",
        &[Arch::Sm75],
        &[spec("gemm_bias_gelu.toml", &[DType::BF16])],
    );
    let message = match only_turing {
        Err(e @ CodegenError::Unsupported { .. }) => e.to_string(),
        other => panic!("expected an Unsupported error, got {other:?}"),
    };
    for needle in [
        "graphs/gemm_bias_gelu.toml",
        "bf16 has no kernel on sm75",
        "sm80 or sm90",
    ] {
        assert!(message.contains(needle), "`{needle}` missing from: {message}");
    }
    // With another arch in the build, sm75 just gets the f16 variant.
    render(
        "fusion_kernels",
        &[Arch::Sm75, Arch::Sm80],
        &[spec("gemm_bias_gelu.toml", &[DType::F16, DType::BF16])],
    )
    .unwrap();
}

#[test]
fn wrappers_parse_and_name_the_graph() {
    let lib = render(
        "fusion_kernels",
        &[Arch::Sm80],
        &[
            spec("swiglu_ffn.toml", &[DType::F16, DType::BF16]),
            spec("gemm_bias_gelu.toml", F16),
        ],
    )
    .unwrap();
    let rust = wrappers::generate(&lib, true, "/out/fusion_ffi.rs");
    // Structs bind their weights; `run` takes inputs and outputs.
    assert!(rust.contains("pub struct SwigluFfn<'w, T: fusion::Element>"));
    assert!(rust.contains("pub struct SwigluFfnWeights<'w, T: fusion::Element>"));
    assert!(rust.contains("pub fn run(\n        &mut self,"), "{rust}");
    // One kernel, one dtype: a free function over concrete f16.
    assert!(rust.contains("pub fn gemm_bias_gelu("));
    assert!(rust.contains("x: &fusion::Tensor<'_, fusion::half::f16>"));
    assert!(!rust.contains("pub fn swiglu_ffn"));
    // The plan is in the docs.
    assert!(rust.contains("graph `swiglu_ffn`: 7 ops"));
    // GEMMs ask for their scratch; the free function keeps it per stream.
    assert!(rust.contains("ffi::fusion_kernels_gemm_silu_glu_nk_f16_sm80_workspace_bytes"));
    // The gated pair's weights are interleaved when the struct binds them;
    // the run then passes that one weight and no up weight.
    assert!(rust.contains("ffi::fusion_kernels_gemm_silu_glu_nk_f16_sm80_fold_weights"));
    let compact: String = rust.split_whitespace().collect();
    assert!(
        compact.contains("bind:Bind::Fold(fusion::plan::Fold::Interleave)"),
        "{rust}"
    );
    // The plan is a table the run time's executor runs.
    assert!(rust.contains("static __PLAN: fusion::plan::PlanTable"));
    assert!(compact.contains("fusion::shell::Plan::new(&__PLAN)"));
    assert!(compact.contains("fusion::shell::Bound::new(__swiglu_ffn::PLAN,stream,"));
    assert!(compact.contains("self.0.run(__swiglu_ffn::PLAN,stream,&[x],&mut[y])"));
    assert!(compact.contains("__gemm_bias_gelu::PLAN.run_per_call(stream,&[w,b],&[x],&mut[y])"));
    // What every struct has comes from the run time, documented there.
    assert!(compact.contains("fusion::shell::items!(bound__swiglu_ffn,'w,T);"));
    assert!(rust.contains("const _: () = fusion::plan::expect_schema("));
    // Without nvcc no launcher is named, and the table has no variants.
    let skipped = wrappers::generate(&lib, false, "/out/fusion_ffi.rs");
    assert!(!skipped.contains("ffi::fusion_kernels_gemm_"));
    assert!(skipped.contains("this build skipped nvcc"));
    let compact: String = skipped.split_whitespace().collect();
    assert!(compact.contains("variants:&[]"), "{skipped}");
    assert!(compact.contains("archs:None"), "{skipped}");
}

#[test]
fn bad_inputs_are_errors() {
    let err = render("Bad-Name", &[Arch::Sm80], &[]).unwrap_err().to_string();
    assert!(err.contains("not a valid library name"), "{err}");
    let err = render("k", &[Arch::Sm80], &[spec("gemm_bias.toml", &[DType::F32])])
        .unwrap_err()
        .to_string();
    assert!(err.contains("f16 and bf16 only, not f32"), "{err}");
}

#[test]
fn embedded_headers_match_the_include_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/include");
    let mut on_disk = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                on_disk.push(
                    path.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/"),
                );
            }
        }
    }
    on_disk.sort();
    let mut embedded: Vec<String> = templates::HEADERS.iter().map(|(p, _)| p.to_string()).collect();
    embedded.sort();
    assert_eq!(
        embedded, on_disk,
        "add new headers to codegen::templates::HEADERS"
    );
}

/// Changing one dim of one graph re-renders that graph's wrappers only: the
/// CUDA units do not depend on static dims (sizes are launch arguments)
/// beyond the width of a small-M tile fitted to N (`select::fitted_width`,
/// 96 columns for both F here), so every unit is byte-identical and the
/// build's object cache serves them all (no nvcc run), while the other
/// graph's generated file is unchanged.
#[test]
fn a_dim_change_touches_only_its_graphs_wrappers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/gpt2_mlp.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace("F = 3072", "F = 3000");
    assert_eq!(select::fitted_width(3072), select::fitted_width(3000));
    assert_ne!(text, edited, "gpt2_mlp.toml declares F = 3072");
    let gpt2 = |text: &str| {
        let source = crate::diagnostic::SourceFile::new("gpt2_mlp.toml", text);
        GraphSpec {
            plan: crate::fuse::plan(crate::graph_from_source(&source).unwrap()),
            dtypes: F16.to_vec(),
            origin: "graphs/gpt2_mlp.toml".into(),
            fingerprint: None,
            declaration: String::new(),
        }
    };
    let before = render("lib", &[Arch::Sm90], &[spec("swiglu_ffn.toml", F16), gpt2(&text)]).unwrap();
    let after = render(
        "lib",
        &[Arch::Sm90],
        &[spec("swiglu_ffn.toml", F16), gpt2(&edited)],
    )
    .unwrap();
    let units = |lib: &KernelLibrary| -> Vec<(String, String)> {
        lib.units
            .iter()
            .map(|u| (u.symbol.clone(), u.source.clone()))
            .collect()
    };
    assert_eq!(units(&before), units(&after));
    let file = |lib: &KernelLibrary, i| wrappers::generate_macro_graph(lib, i, true, "ffi.rs");
    assert_eq!(
        file(&before, 0),
        file(&after, 0),
        "swiglu_ffn's file is unchanged"
    );
    assert_ne!(
        file(&before, 1),
        file(&after, 1),
        "gpt2_mlp's file follows its new dim"
    );
}

#[test]
fn every_step_of_the_op_table_is_a_struct_of_epilogue_cuh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/include/fusion/epilogue.cuh");
    let header = std::fs::read_to_string(&path).unwrap();
    for op in crate::ir::ops::OPS {
        let Some(step) = op.step() else { continue };
        let name = step
            .cuda_type
            .strip_prefix("fusion::")
            .expect("steps live in namespace fusion");
        // `struct Bias {` or, for an activation, `struct Gelu : Activation<Gelu> {`.
        let start = [format!("struct {name} {{"), format!("struct {name} : ")]
            .iter()
            .find_map(|declaration| header.find(declaration.as_str()))
            .unwrap_or_else(|| panic!("epilogue.cuh has no `struct {name}` for `{}`", op.name));
        let body = &header[start..start + header[start..].find("};").unwrap()];
        assert!(
            body.contains(&format!("name = \"{}\";", step.word)),
            "`struct {name}` should be named \"{}\":\n{body}",
            step.word
        );
    }
}

#[test]
fn sigmoid_and_gelu_quick_render_their_steps() {
    let specs = [
        "gemm_bias_sigmoid.toml",
        "gemm_gelu_quick.toml",
        "sigmoid.toml",
        "gelu_quick.toml",
    ]
    .map(|file| spec(file, F16));
    let lib = render("fusion_kernels", &[Arch::Sm80, Arch::Sm90], &specs).unwrap();
    let expected = [
        (
            "fusion_kernels_gemm_bias_sigmoid_nk_f16_sm80",
            "fusion::Bias, fusion::Sigmoid",
        ),
        (
            "fusion_kernels_gemm_bias_sigmoid_nk_f16_sm90",
            "fusion::Bias, fusion::Sigmoid",
        ),
        ("fusion_kernels_gemm_gelu_quick_nk_f16_sm80", "fusion::GeluQuick"),
        ("fusion_kernels_gemm_gelu_quick_nk_f16_sm90", "fusion::GeluQuick"),
        ("fusion_kernels_sigmoid_f16", "fusion::Sigmoid"),
        ("fusion_kernels_gelu_quick_f16", "fusion::GeluQuick"),
    ];
    let symbols: Vec<&str> = lib.units.iter().map(|u| u.symbol.as_str()).collect();
    assert_eq!(symbols, expected.map(|(symbol, _)| symbol));
    for (unit, (_, steps)) in lib.units.iter().zip(expected) {
        let chain = match unit.params {
            ParamsKind::Elementwise => format!("fusion::ElementwiseChain<{steps}>"),
            _ => format!("fusion::EpilogueChain<{steps}>"),
        };
        assert!(unit.source.contains(&chain), "{}: no `{chain}`", unit.symbol);
    }
}

/// The tensors the wrapper of `lib`'s one graph passes its elementwise
/// kernel as per-step operands, by tensor id (`None` for a null pointer).
fn elementwise_operands(lib: &KernelLibrary) -> Vec<Option<usize>> {
    let rust: String = wrappers::generate(lib, true, "/out/fusion_ffi.rs")
        .split_whitespace()
        .collect();
    let start = rust
        .find("operands:[")
        .expect("the params hold per-step operands")
        + "operands:[".len();
    let list = &rust[start..start + rust[start..].find(']').expect("a closed array")];
    list.split(',')
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.strip_prefix("Some(").map(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
        })
        .collect()
}

#[test]
fn silu_mul_is_one_elementwise_unit_with_the_factor_at_its_step() {
    let spec = spec("silu_mul.toml", &[DType::F16, DType::BF16]);
    let up = spec.plan.graph.tensor_by_name("up").unwrap().0;
    let lib = render("fusion_kernels", &[Arch::Sm80, Arch::Sm90], &[spec]).unwrap();
    let symbols: Vec<&str> = lib.units.iter().map(|u| u.symbol.as_str()).collect();
    assert_eq!(
        symbols,
        ["fusion_kernels_silu_mul_f16", "fusion_kernels_silu_mul_bf16"]
    );
    for unit in &lib.units {
        assert_eq!(unit.params, ParamsKind::Elementwise);
        assert!(
            unit.source
                .contains("fusion::ElementwiseChain<fusion::Silu, fusion::Mul>"),
            "{}",
            unit.source
        );
    }
    // The silu reads nothing; the mul, step 1, reads `up`.
    let operands = elementwise_operands(&lib);
    assert_eq!(operands, [None, Some(up), None, None]);
    assert_eq!(operands.len(), crate::fuse::MAX_EPILOGUE_STEPS);
}

#[test]
fn standalone_norms_of_two_eps_share_a_unit_and_pass_their_own() {
    // The norm kernel takes eps as a parameter, so rmsnorm (1e-6) and
    // rmsnorm_eps1e5 compile once; each wrapper passes its graph's eps.
    let lib = render(
        "fusion_kernels",
        &[Arch::Sm80],
        &[spec("rmsnorm.toml", F16), spec("rmsnorm_eps1e5.toml", F16)],
    )
    .unwrap();
    assert_eq!(lib.units.len(), 1);
    assert_eq!(lib.units[0].symbol, "fusion_kernels_rmsnorm_f16");
    assert!(
        lib.units[0]
            .source
            .contains("Used by: rmsnorm#0, rmsnorm_eps1e5#0"),
        "{}",
        lib.units[0].source
    );
    let rust: String = wrappers::generate(&lib, true, "/out/fusion_ffi.rs")
        .split_whitespace()
        .collect();
    let eps_of = |graph: &str| {
        let start = rust
            .find(&format!("mod__{graph}{{"))
            .unwrap_or_else(|| panic!("no module for {graph}"));
        let body = &rust[start..];
        let eps = body.find("eps:").expect("the params carry eps") + "eps:".len();
        body[eps..eps + body[eps..].find(',').unwrap()].to_string()
    };
    assert_eq!(eps_of("rmsnorm"), "0.000001f32");
    assert_eq!(eps_of("rmsnorm_eps1e5"), "0.00001f32");
}

#[test]
fn two_factors_of_one_chain_reach_their_own_steps() {
    let source = crate::diagnostic::SourceFile::new(
        "graphs/two_factors.toml",
        r#"
[graph]
name = "two_factors"

[dims]
M = "dyn"
N = 64

[inputs]
x = "f16[M, N]"
a = "f16[M, N]"
b = "f16[M, N]"

[outputs]
y = "relu(x * a) * b"
"#,
    );
    let graph = crate::graph_from_source(&source).unwrap_or_else(|e| panic!("{e}"));
    let id = |name: &str| graph.tensor_by_name(name).unwrap().0;
    let (a, b) = (id("a"), id("b"));
    let spec = GraphSpec {
        plan: crate::fuse::plan(graph),
        dtypes: F16.to_vec(),
        origin: "graphs/two_factors.toml".to_string(),
        fingerprint: None,
        declaration: String::new(),
    };
    let lib = render("k", &[Arch::Sm80], &[spec]).unwrap();
    assert_eq!(lib.units.len(), 1);
    assert_eq!(lib.units[0].symbol, "k_mul_relu_mul_f16");
    assert!(
        lib.units[0]
            .source
            .contains("fusion::ElementwiseChain<fusion::Mul, fusion::Relu, fusion::Mul>")
    );
    assert_eq!(elementwise_operands(&lib), [Some(a), None, Some(b), None]);
}

#[test]
fn the_abi_takes_as_many_elementwise_steps_as_the_planner_chains() {
    let abi = templates::HEADERS
        .iter()
        .find(|(path, _)| *path == "fusion/abi.h")
        .expect("abi.h is embedded")
        .1;
    let define = format!(
        "#define FUSION_ELEMENTWISE_MAX_STEPS {}\n",
        crate::fuse::MAX_EPILOGUE_STEPS
    );
    assert!(abi.contains(&define), "abi.h lacks `{}`", define.trim_end());
}

/// Tensors named like the locals and statics the wrappers used to declare
/// beside them (`workspace`, `call`, `dtype`, `arch`, `ptr_0`, `GRAPH`, …).
const CLASHING_NAMES: &str = r#"
[graph]
name = "clashing_names"

[dims]
M = "dyn"
D = 64

[inputs]
workspace = "f16[M, D]"
call = "f16[M, D]"
TENSOR_0 = "f16[M, D]"

[weights]
dtype = "f16[D, D]"
arch = "f16[D]"
GRAPH = "f16[D]"
m = "f16[D]"
ptr_0 = "f16[D, D]"
weights = "f16[D, D]"

[compute]
params = "workspace @ dtype^T + arch"

[outputs]
code = "layernorm(params + call, GRAPH, m) @ ptr_0^T"
launcher_0 = "relu(TENSOR_0 @ weights^T)"
"#;

/// The identifiers a pattern binds.
fn bound_names(pat: &syn::Pat, into: &mut Vec<String>) {
    match pat {
        syn::Pat::Ident(p) => into.push(p.ident.to_string()),
        syn::Pat::Type(p) => bound_names(&p.pat, into),
        syn::Pat::Reference(p) => bound_names(&p.pat, into),
        syn::Pat::Slice(p) => p.elems.iter().for_each(|e| bound_names(e, into)),
        syn::Pat::Tuple(p) => p.elems.iter().for_each(|e| bound_names(e, into)),
        syn::Pat::Struct(p) => p.fields.iter().for_each(|f| bound_names(&f.pat, into)),
        _ => {}
    }
}

/// For every function in `items` (modules and impls included): its
/// parameters are distinct, no `let` of its body rebinds one, and none is
/// named like a static or const of its module.
fn check_no_shadowing(items: &[syn::Item], context: &str) {
    let module_values: Vec<String> = items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Static(s) => Some(s.ident.to_string()),
            syn::Item::Const(c) => Some(c.ident.to_string()),
            _ => None,
        })
        .collect();
    let mut functions: Vec<(&syn::Signature, &syn::Block)> = Vec::new();
    for item in items {
        match item {
            syn::Item::Fn(f) => functions.push((&f.sig, &f.block)),
            syn::Item::Impl(i) => functions.extend(i.items.iter().filter_map(|item| match item {
                syn::ImplItem::Fn(f) => Some((&f.sig, &f.block)),
                _ => None,
            })),
            syn::Item::Mod(m) => check_no_shadowing(&m.content.as_ref().expect("inline module").1, context),
            _ => {}
        }
    }
    for (sig, block) in functions {
        let mut params = Vec::new();
        for input in &sig.inputs {
            if let syn::FnArg::Typed(arg) = input {
                bound_names(&arg.pat, &mut params);
            }
        }
        let mut sorted = params.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            params.len(),
            "{context}: `{}` repeats a parameter: {params:?}",
            sig.ident
        );
        let mut lets = Vec::new();
        for stmt in &block.stmts {
            if let syn::Stmt::Local(local) = stmt {
                bound_names(&local.pat, &mut lets);
            }
        }
        for name in &params {
            assert!(
                !lets.contains(name),
                "{context}: `{}` rebinds its parameter `{name}`",
                sig.ident
            );
            assert!(
                !module_values.contains(name),
                "{context}: `{}`'s parameter `{name}` is a static",
                sig.ident
            );
        }
    }
}

#[test]
fn wrappers_declare_no_name_a_tensor_can_take() {
    let source = crate::diagnostic::SourceFile::new("graphs/clashing_names.toml", CLASHING_NAMES);
    let graph = crate::graph_from_source(&source).unwrap_or_else(|e| panic!("{e}"));
    assert!(graph.ops.len() >= 5, "{graph:?}");
    let toml_spec = GraphSpec {
        plan: crate::fuse::plan(graph.clone()),
        dtypes: vec![DType::F16, DType::BF16],
        origin: "graphs/clashing_names.toml".to_string(),
        fingerprint: None,
        declaration: String::new(),
    };
    let macro_spec = GraphSpec {
        fingerprint: Some(1),
        ..toml_spec.clone()
    };
    let plan_text = toml_spec.plan.to_string();
    assert!(
        plan_text.contains("between kernels"),
        "an intermediate in the workspace: {plan_text}"
    );
    for (linked, spec) in [(true, toml_spec.clone()), (false, toml_spec), (true, macro_spec)] {
        let macro_graph = spec.fingerprint.is_some();
        let lib = render("fusion_kernels", &[Arch::Sm80], &[spec]).unwrap();
        let rust = if macro_graph {
            wrappers::generate_macro_graph(&lib, 0, linked, "/out/fusion_ffi.rs")
        } else {
            wrappers::generate(&lib, linked, "/out/fusion_ffi.rs")
        };
        let file: syn::File = syn::parse_str(&rust).unwrap();
        check_no_shadowing(
            &file.items,
            &format!("macro graph {macro_graph}, linked {linked}"),
        );
        assert!(
            rust.contains("workspace: &fusion::Tensor"),
            "the tensor is a parameter"
        );
    }
}

#[test]
fn only_gemm_launchers_have_a_workspace_query() {
    let lib = render(
        "fusion_kernels",
        &[Arch::Sm90],
        &[
            spec("layernorm.toml", F16),
            spec("mul.toml", F16),
            spec("gemm.toml", F16),
        ],
    )
    .unwrap();
    let header = &lib.header.1;
    for unit in &lib.units {
        let query = format!("{}_workspace_bytes(", unit.symbol);
        assert_eq!(
            header.contains(&query),
            unit.params == ParamsKind::Gemm,
            "{}:\n{header}",
            unit.symbol
        );
        assert_eq!(unit.source.contains(&query), unit.params == ParamsKind::Gemm);
    }
    let rust = wrappers::generate(&lib, true, "/out/fusion_ffi.rs");
    // The norm and elementwise kernels' table entries have no query.
    assert_eq!(rust.matches("Launchers::Gemm {").count(), 1, "{rust}");
    assert_eq!(rust.matches("query: &[").count(), 1, "{rust}");
    assert_eq!(rust.matches("_workspace_bytes").count(), 1, "{rust}");
    assert_eq!(rust.matches("Launchers::Norm(").count(), 1, "{rust}");
    assert_eq!(rust.matches("Launchers::Elementwise(").count(), 1, "{rust}");
}

#[test]
fn nk_units_run_the_decode_kernel_first_for_small_m_and_kn_units_never() {
    let lib = render(
        "k",
        &[Arch::Sm75, Arch::Sm80, Arch::Sm90],
        &[spec("gemm_bias_gelu.toml", F16), spec("gemm_bias_silu.toml", F16)],
    )
    .unwrap();
    let unit = |symbol: &str| &lib.units.iter().find(|u| u.symbol == symbol).unwrap().source;
    // Each arch's threshold is its shipped table's decode_max_m.
    for (symbol, max_m) in [
        ("k_gemm_bias_gelu_nk_f16_sm80", 16),
        ("k_gemm_bias_gelu_nk_f16_sm90", 16),
    ] {
        let source = unit(symbol);
        let branch = format!("if (p->m <= {max_m}) return f(fusion::DecodeFor<K<LargeTile>>{{}});");
        for needle in [
            "#include \"fusion/decode.cuh\"".to_owned(),
            branch.clone(),
            "{\"decode\", uint32_t(fusion::DecodeFor<Kernel<LargeTile>>::kSmemBytes),".to_owned(),
            format!(
                "static_assert({max_m} <= fusion::kDecodeMaxM, \"decode_max_m {max_m} from kernels/tuned/"
            ),
        ] {
            assert!(
                source.contains(&needle),
                "`{needle}` missing from {symbol}:\n{source}"
            );
        }
        // Ahead of the small-M tiles, which would otherwise take those m.
        let decode_at = source.find(&branch).unwrap();
        // (The last: a caller-named tier, FUSION_GEMM_TILE, comes first.)
        let small_at = source.rfind("return f(K<SmallTile>{})").unwrap();
        assert!(decode_at < small_at, "{source}");
    }
    // gemm_bias_silu's B is [K, N]; sm75 has no decode kernel.
    for symbol in ["k_gemm_bias_silu_kn_f16_sm90", "k_gemm_bias_gelu_nk_f16_sm75"] {
        let source = unit(symbol);
        for needle in ["decode.cuh", "DecodeFor"] {
            assert!(!source.contains(needle), "`{needle}` in {symbol}:\n{source}");
        }
    }
}

/// `graphs/gemm_bias_gelu.toml` with K and N static (1000 and 3000).
fn static_gemm_bias_gelu() -> GraphSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/gemm_bias_gelu.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("K = \"dyn\"", "K = 1000")
        .replace("N = \"dyn\"", "N = 3000");
    let source = crate::diagnostic::SourceFile::new("graphs/gemm_bias_gelu_static.toml", text);
    let mut graph = crate::graph_from_source(&source).unwrap_or_else(|e| panic!("{e}"));
    graph.name = "gemm_bias_gelu_static".to_owned();
    GraphSpec {
        plan: crate::fuse::plan(graph),
        dtypes: F16.to_vec(),
        origin: "graphs/gemm_bias_gelu_static.toml".to_owned(),
        fingerprint: None,
        declaration: String::new(),
    }
}

/// A tuned cache's entries for gemm_bias_gelu at N = 3000, K = 1000 on sm90
/// become its unit's tiers there; the same composition with dynamic N and K
/// keeps the shipped table's tiles in a unit of its own.
#[test]
fn a_tuned_cache_gives_static_kernels_its_tiles_and_leaves_dynamic_ones_alone() {
    use crate::select::{CacheEntry, CacheKey};
    let tile = |bm, bn, stages| TileConfig::sm90(bm, bn, stages, None);
    let entry = |tile| CacheEntry {
        tile,
        time_us: 40.0,
        default_time_us: 48.0,
        cublaslt_time_us: 41.0,
        gpu: "NVIDIA H200".to_owned(),
        driver: "580.65.06".to_owned(),
        nvcc: "13.0.48".to_owned(),
        date: "2026-12-01".to_owned(),
    };
    let mut cache = TunedCache::default();
    cache.file = "tuned.json".to_owned();
    for (bucket, tile) in [("m<=256", tile(64, 256, 4)), ("m>4096", tile(128, 128, 5))] {
        let key = CacheKey::parse(&format!("gemm_bias_gelu.f16.nk.n3000.k1000.sm90.{bucket}")).unwrap();
        cache.entries.insert(key, entry(tile));
    }
    let graphs = [static_gemm_bias_gelu(), spec("gemm_bias_gelu.toml", F16)];
    let lib = render_tuned("k", &[Arch::Sm90], &graphs, &[], &cache).unwrap();
    assert_eq!(lib.warnings, Vec::<String>::new());
    let source = |symbol: &str| {
        &lib.units
            .iter()
            .find(|u| u.symbol == symbol)
            .unwrap_or_else(|| panic!("no unit {symbol}"))
            .source
    };
    let tuned = source("k_gemm_bias_gelu_nk_f16_sm90_n3000_k1000");
    for needle in [
        "using LargeTile = fusion::sm90::TileConfig<128, 128, 5, fusion::sm90::Schedule::Cooperative>;",
        "using SmallTile = fusion::sm90::TileConfig<64, 256, 4, fusion::sm90::Schedule::Cooperative>;",
        "if (p->m <= 16) return f(fusion::DecodeFor<K<LargeTile>>{});",
        "if (p->m <= 256) return f(K<SmallTile>{});",
        "tile config from tuned.json, entry 'gemm_bias_gelu.f16.nk.n3000.k1000.sm90.{m<=256,m>4096}'",
    ] {
        assert!(tuned.contains(needle), "`{needle}` missing from:\n{tuned}");
    }
    assert!(!tuned.contains("SmallAltTile"), "{tuned}");
    // A tuned cache's tiles keep the bounds they were measured in.
    assert!(!tuned.contains("LightestTier"), "{tuned}");
    let shipped = source("k_gemm_bias_gelu_nk_f16_sm90");
    for needle in [
        "using LargeTile = fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative>;",
        "using SmallAltTile = fusion::sm90::TileConfig<128, 128, 6, fusion::sm90::Schedule::Cooperative>;",
        "tile config from kernels/tuned/sm90.json, entry 'default'",
    ] {
        assert!(shipped.contains(needle), "`{needle}` missing from:\n{shipped}");
    }
    // Without the cache, the static graph's kernel is the shipped one with
    // its small-M alternative fitted to N = 3000 (96 columns), a unit of
    // its own beside the dynamic graph's.
    let plain = render("k", &[Arch::Sm90], &graphs).unwrap();
    assert_eq!(plain.units.len(), lib.units.len());
    let fitted = &plain
        .units
        .iter()
        .find(|u| u.symbol == "k_gemm_bias_gelu_nk_f16_sm90_w96")
        .expect("a unit fitted to N")
        .source;
    for needle in [
        "using LargeTile = fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative>;",
        "using SmallAltTile = fusion::sm90::TileConfig<128, 96, 7, fusion::sm90::Schedule::Cooperative>;",
        "entry 'default (small_m_alt fitted to N: 96 columns)'",
        "fusion::LightestTier",
        // The few-M tile, after the decode kernel and ahead of the tiers
        // (select::few_m_tile), in the dynamic graph's unit too.
        "using FewMTile = fusion::sm90::TileConfig<64, 64, 8, fusion::sm90::Schedule::Cooperative>;",
        "  if (p->m <= 16) return f(fusion::DecodeFor<K<LargeTile>>{});\n  if (fusion::few_m_runs<FewMTile>(p->m, p->n * Chain::kGemmColsPerOutput, p->k)) return f(K<FewMTile>{});\n",
        "{\"few_m\", uint32_t(Kernel<FewMTile>::kSmemBytes)",
    ] {
        assert!(fitted.contains(needle), "`{needle}` missing from:\n{fitted}");
    }
    assert!(shipped.contains("few_m_runs<FewMTile>"), "{shipped}");
    // The cache measured no M the few-M tile runs (its smallest bucket is
    // m<=256, Ms 129 to 256), so the tuned unit keeps it for those.
    assert!(tuned.contains("few_m_runs<FewMTile>"), "{tuned}");
}

/// With the model ([`TunedCache::model`]), a static GEMM's sm90 unit runs
/// one tile per M bucket, each a tile of the shipped table's tiers, in the
/// order of the buckets and after the decode kernel; the dynamic one keeps
/// the shipped tiers, and an entry of the cache still wins over the model.
#[test]
fn the_model_gives_static_sm90_kernels_a_tile_per_m_bucket() {
    let mut cache = TunedCache::default();
    cache.model = Some(crate::select::model::Calibration::shipped_sm90());
    let graphs = [static_gemm_bias_gelu(), spec("gemm_bias_gelu.toml", F16)];
    let lib = render_tuned("k", &[Arch::Sm90], &graphs, &[], &cache).unwrap();
    assert_eq!(lib.warnings, Vec::<String>::new());
    let unit = |symbol: &str| {
        lib.units
            .iter()
            .find(|u| u.symbol == symbol)
            .unwrap_or_else(|| panic!("no unit {symbol}"))
            .source
            .clone()
    };
    let modelled = unit("k_gemm_bias_gelu_nk_f16_sm90_n3000_k1000");
    assert!(
        modelled.contains(
            "tile config from kernels/tuned/sm90.model.json, entry 'gemm_bias_gelu.f16.n3000.k1000'"
        ),
        "{modelled}"
    );
    let decode = modelled.find("fusion::DecodeFor").unwrap();
    let mut last_bound = 0;
    let mut position = decode;
    for line in modelled.lines().filter(|l| {
        l.trim_start().starts_with("if (p->m <= ") && l.contains("K<") && !l.contains("DecodeFor")
    }) {
        let bound: u32 = line.trim_start()["if (p->m <= ".len()..]
            .split(')')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(bound > last_bound, "bounds out of order in:\n{modelled}");
        last_bound = bound;
        let at = modelled.find(line).unwrap();
        assert!(at > position, "{modelled}");
        position = at;
    }
    assert!(modelled.contains("  return f(K<LargeTile>{});"), "{modelled}");
    assert!(!modelled.contains("LightestTier"), "{modelled}");
    let shipped = unit("k_gemm_bias_gelu_nk_f16_sm90");
    assert!(shipped.contains("fusion::LightestTier"), "{shipped}");
    // The tiles it chose are among the tiers a build without the model
    // gives this kind at this N (the shipped ones, small_m_alt fitted to N).
    let kind = KernelKind::of(gemm_composition(&graphs[0]), DType::F16);
    let table = TunedTable::shipped(Arch::Sm90).unwrap();
    let select::Selected { config, .. } =
        select::select_tuned(&table, &cache, Arch::Sm90, &kind, Some(3000), Some(1000)).unwrap();
    let tiers = select::select_tuned(
        &table,
        &TunedCache::default(),
        Arch::Sm90,
        &kind,
        Some(3000),
        Some(1000),
    )
    .unwrap()
    .config;
    let allowed = [
        Some(tiers.large),
        tiers.large_alt,
        tiers.small_m,
        tiers.small_m_alt,
    ];
    for tile in config.by_m.unwrap() {
        assert!(allowed.contains(&Some(tile)), "{tile:?}");
    }
}

fn gemm_composition(spec: &GraphSpec) -> &crate::fuse::GemmComposition {
    spec.plan
        .kernels
        .iter()
        .find_map(|k| match &k.composition {
            Composition::Gemm(g) => Some(g),
            _ => None,
        })
        .unwrap()
}

/// A cached config the table's checks reject as a whole is a warning that
/// names the cache file and the kernel's entries, and the shipped config.
#[test]
fn a_cached_config_the_checks_reject_is_a_warning_and_the_shipped_config() {
    use crate::select::{CacheEntry, CacheKey};
    // sm80 tiles need their warp fields; the entry is checked when read,
    // so this one is planted the way a file of an older version could be.
    let mut cache = TunedCache::default();
    cache.file = "tuned.json".to_owned();
    let key = CacheKey::parse("gemm_bias_gelu.f16.nk.n3000.k1000.sm80.m>4096").unwrap();
    let tile = TileConfig {
        bm: 128,
        bn: 128,
        bk: 32,
        stages: 3,
        fields: crate::target::Fields::Sm80(crate::target::sm80::Fields {
            warp_m: 0,
            warp_n: 0,
            min_blocks_per_sm: 1,
            pipelined: false,
            staged_store: false,
        }),
    };
    cache.entries.insert(
        key,
        CacheEntry {
            tile,
            time_us: 1.0,
            default_time_us: 1.0,
            cublaslt_time_us: 1.0,
            gpu: String::new(),
            driver: String::new(),
            nvcc: String::new(),
            date: String::new(),
        },
    );
    let graphs = [static_gemm_bias_gelu(), static_gemm_bias_gelu()];
    let mut second = graphs[1].clone();
    second.plan.graph.name = "again".to_owned();
    let lib = render_tuned("k", &[Arch::Sm80], &[graphs[0].clone(), second], &[], &cache).unwrap();
    assert_eq!(lib.warnings.len(), 1, "{:?}", lib.warnings);
    let warning = &lib.warnings[0];
    assert!(
        warning.starts_with(
            "tile config from tuned.json, entry `gemm_bias_gelu.f16.nk.n3000.k1000.sm80.{m>4096}` for `gemm_bias_gelu` (large) does not fit sm80: `warp_m` is missing or 0"
        ),
        "{warning}"
    );
    assert!(
        warning.ends_with("; using kernels/tuned/sm80.json, entry `default` instead"),
        "{warning}"
    );
    assert_eq!(lib.units.len(), 1, "both graphs share the shipped unit");
    assert_eq!(lib.units[0].symbol, "k_gemm_bias_gelu_nk_f16_sm80");
}

#[test]
fn each_kernel_is_launched_only_where_its_own_output_has_elements() {
    // Two row counts: y can be empty (M = 0) while z is not (T > 0).
    let source = r#"
[graph]
name = "two_row_counts"
[dims]
M = "dyn"
T = "dyn"
D = 16
N = 8
[inputs]
x = "f16[M, D]"
u = "f16[T, D]"
[weights]
w = "f16[N, D]"
[outputs]
y = "x @ w^T"
z = "relu(u)"
"#;
    let graph = crate::graph_from_source(&crate::diagnostic::SourceFile::new("two.toml", source))
        .unwrap_or_else(|e| panic!("{e}"));
    let plan = crate::fuse::plan(graph);
    assert_eq!(plan.kernels.len(), 2);
    let spec = GraphSpec {
        plan: plan.clone(),
        dtypes: F16.to_vec(),
        origin: "two.toml".into(),
        fingerprint: None,
        declaration: String::new(),
    };
    let lib = render("fusion_kernels", &[Arch::Sm80], &[spec]).unwrap();
    let rust = wrappers::generate(&lib, true, "/out/fusion_ffi.rs");
    let compact: String = rust.split_whitespace().collect();
    // Each kernel's entry names its own output, by which the executor
    // skips its launch where that output is empty
    // (`fusion::plan::run`, `fusion::launch::Call::has_elements`), and a
    // GEMM its A, whose empty rows refuse the call.
    for (index, kernel) in plan.kernels.iter().enumerate() {
        let entry = format!(
            "label:\"{}\",output:{},",
            plan.kernel_label(index).replace(' ', ""),
            kernel.output.0
        );
        assert!(compact.contains(&entry), "no `{entry}`:\n{rust}");
    }
    let gemm = plan
        .kernels
        .iter()
        .find(|k| k.gemm_operands().a.is_some())
        .unwrap();
    let a = gemm.gemm_operands().a.unwrap().tensor.0;
    assert!(
        compact.contains(&format!("KernelOp::Gemm(GemmOp{{a:Some({a}),")),
        "{rust}"
    );
}

/// A graph with FP8 tensors reaches no template: even asked for bf16 (as
/// `Builder::dtypes` would re-type it), it is refused with the FP8 error,
/// not rendered as bf16 without its scales.
#[test]
fn an_fp8_graph_is_refused_naming_its_fp8_tensors() {
    let source = crate::diagnostic::SourceFile::new(
        "fp8.toml",
        "[graph]\nname = \"fp8\"\n[dims]\nM = \"dyn\"\nK = 64\nN = 32\n\
         [inputs]\nx = \"f8e4m3[M, K] scale x_scale\"\n\
         [weights]\nx_scale = \"f32[1]\"\nw = \"f8e4m3[N, K] scale w_scale\"\nw_scale = \"f32[N]\"\n\
         [outputs]\ny = \"x @ w^T\"\n",
    );
    let graph = crate::graph_from_source(&source).unwrap();
    let spec = GraphSpec {
        plan: crate::fuse::plan(graph),
        dtypes: vec![DType::BF16],
        origin: "fp8.toml".into(),
        fingerprint: None,
        declaration: String::new(),
    };
    let err = render("k", &[Arch::Sm90], &[spec]).unwrap_err();
    assert!(matches!(err, CodegenError::Fp8NotGenerated(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "graph `fp8`: FP8 kernels are not generated yet, and `x` and `w` are f8e4m3; the front ends, the IR's \
         checks and the CPU reference take FP8 graphs, but no GPU mainloop computes them; a build with \
         FUSION_FP8=experimental generates sm90 kernels for FP8 GEMMs (checked on a GPU, not yet timed)"
    );
}

/// A cache that carries `FUSION_FP8=experimental`.
fn fp8_enabled() -> TunedCache {
    let mut cache = TunedCache::default();
    cache.fp8 = true;
    cache
}

/// An FP8 graph from text (`fp8.toml`), compiled as declared.
fn fp8_spec(outputs: &str, weights: &str) -> GraphSpec {
    let source = crate::diagnostic::SourceFile::new(
        "fp8.toml",
        format!(
            "[graph]\nname = \"fp8\"\n[dims]\nM = \"dyn\"\nK = 64\nN = 32\n\
             [inputs]\nx = \"f8e4m3[M, K] scale x_scale\"\n\
             [weights]\nx_scale = \"f32[1]\"\nb = \"bf16[N]\"\n{weights}\n[outputs]\n{outputs}\n"
        ),
    );
    let graph = crate::graph_from_source(&source).unwrap_or_else(|e| panic!("{e:?}"));
    GraphSpec {
        plan: crate::fuse::plan(graph),
        dtypes: vec![DType::F8E4M3],
        origin: "fp8.toml".into(),
        fingerprint: None,
        declaration: String::new(),
    }
}

const PER_TENSOR: &str = "w = \"f8e4m3[N, K] scale w_scale\"\nw_scale = \"f32[1]\"";
const PER_CHANNEL: &str = "w = \"f8e4m3[N, K] scale w_scale\"\nw_scale = \"f32[N]\"";

fn render_fp8(archs: &[Arch], spec: GraphSpec) -> Result<KernelLibrary, CodegenError> {
    render_tuned("k", archs, &[spec], &[], &fp8_enabled())
}

/// With the option, an FP8 GEMM is one sm90 unit whatever else is built:
/// e4m3 operands, the scales first in its chain (per tensor or per output
/// channel, which its symbol tells apart), the sm90 table's tiles with
/// k-blocks of 128 elements and no decode kernel.
#[test]
fn an_fp8_gemm_is_an_sm90_unit_with_its_scales_first_in_the_chain() {
    for (weights, dequantize, symbol) in [
        (
            PER_TENSOR,
            "fusion::Dequantize<false>",
            "k_gemm_bias_gelu_nk_f8e4m3_sm90",
        ),
        (
            PER_CHANNEL,
            "fusion::Dequantize<true>",
            "k_gemm_bias_gelu_nk_f8e4m3_per_channel_sm90",
        ),
    ] {
        let lib = render_fp8(
            &[Arch::Sm80, Arch::Sm90],
            fp8_spec("y = \"gelu(x @ w^T + b)\"", weights),
        )
        .unwrap();
        let [unit] = &lib.units[..] else {
            panic!(
                "one unit: {:?}",
                lib.units.iter().map(|u| &u.symbol).collect::<Vec<_>>()
            );
        };
        assert_eq!(unit.symbol, symbol);
        assert_eq!(unit.archs, [Arch::Sm90]);
        assert!(
            unit.source.contains(&format!(
                "using Chain = fusion::EpilogueChain<{dequantize}, fusion::Bias, fusion::Gelu>;"
            )),
            "{}",
            unit.source
        );
        assert!(unit.source.contains("using Element = __nv_fp8_e4m3;"));
        assert!(
            unit.source
                .contains("args.c = static_cast<fusion::OutputOf<Element>*>(p->c);")
        );
        assert!(
            unit.source
                .contains("args.epilogue.scale_b = static_cast<const float*>(p->scale_b);")
        );
        assert!(
            !unit.source.contains("fusion/decode.cuh"),
            "no decode kernel for FP8 weights yet"
        );
        let KernelKey::Gemm { config, .. } = &unit.key else {
            panic!("a GEMM");
        };
        assert!(
            config
                .tiers()
                .iter()
                .flat_map(|(_, tile)| tile)
                .all(|tile| tile.bk == 128)
        );
        assert_eq!(
            lib.graphs[0].kernels[0].variants,
            [(DType::F8E4M3, Arch::Sm90, symbol.to_owned())]
        );
    }
}

/// FP8 kernels are sm90's alone: a build of older generations only is a
/// named error that says so.
#[test]
fn an_fp8_graph_without_sm90_is_an_error_naming_sm90() {
    for archs in [&[Arch::Sm80][..], &[Arch::Sm75, Arch::Sm80]] {
        let err = render_fp8(archs, fp8_spec("y = \"x @ w^T + b\"", PER_TENSOR)).unwrap_err();
        assert!(matches!(err, CodegenError::Fp8NeedsSm90 { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "fp8.toml: graph `fp8` has FP8 tensors, and FP8 kernels need sm90 (wgmma's e4m3 form); this build \
                 is for {}: build for sm90 as well",
                arch_list(archs)
            )
        );
    }
}

/// What the sm90 FP8 kernel does not compute is refused by name: a weight
/// stored [K, N] (8-bit wgmma reads both operands K-major), and an FP8
/// graph re-typed.
#[test]
fn fp8_gemms_the_kernel_does_not_compute_are_refused_by_name() {
    let kn = "w = \"f8e4m3[K, N] scale w_scale\"\nw_scale = \"f32[1]\"";
    let err = render_fp8(&[Arch::Sm90], fp8_spec("y = \"x @ w + b\"", kn)).unwrap_err();
    assert!(
        matches!(err, CodegenError::Fp8Unsupported { kernel: 0, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "fp8.toml: graph `fp8`, kernel #0 (`gemm_bias`): the FP8 weight `w` is stored [K, N], and 8-bit wgmma \
         reads both operands K-major: declare it [N, K] and multiply by its transpose (`x @ w^T`), the layout FP8 \
         checkpoints store"
    );
    let mut retyped = fp8_spec("y = \"x @ w^T + b\"", PER_TENSOR);
    retyped.dtypes = vec![DType::BF16];
    let err = render_fp8(&[Arch::Sm90], retyped).unwrap_err();
    assert_eq!(
        err.to_string(),
        "graph `fp8`: fp8.toml: an FP8 graph is compiled as declared, for f8e4m3 alone: re-typed, its scales \
         would mean nothing"
    );
}

/// An FP8 graph's kernels are generated for E4M3 alone, so a kernel that
/// is not a scaled FP8 GEMM (here a bf16 GEMM on the FP8 one's bf16
/// output) is refused by name, not generated reading bf16 as E4M3.
#[test]
fn an_fp8_graphs_other_kernels_are_refused_by_name() {
    let weights = format!("{PER_TENSOR}\nw2 = \"bf16[N, N]\"");
    let spec = fp8_spec("h = \"x @ w^T + b\"\ny = \"h @ w2^T\"", &weights);
    assert_eq!(spec.plan.kernels.len(), 2, "two GEMMs");
    let err = render_fp8(&[Arch::Sm90], spec).unwrap_err();
    assert!(
        matches!(err, CodegenError::Fp8Unsupported { kernel: 1, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with("put the FP8 GEMMs and the rest of the model in separate graphs"),
        "{err}"
    );
}

/// The option adds FP8 units and changes nothing else: a 16-bit graph
/// renders the same units with it as without.
#[test]
fn the_fp8_option_leaves_16_bit_units_unchanged() {
    let graphs = [spec("gemm_bias_gelu.toml", &[DType::F16, DType::BF16])];
    let sources = |lib: KernelLibrary| lib.units.into_iter().map(|u| u.source).collect::<Vec<_>>();
    let plain = render("k", &[Arch::Sm80, Arch::Sm90], &graphs).unwrap();
    let with_fp8 = render_tuned("k", &[Arch::Sm80, Arch::Sm90], &graphs, &[], &fp8_enabled()).unwrap();
    assert_eq!(sources(plain), sources(with_fp8));
}
