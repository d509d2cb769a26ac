//! The built-in kernels: one item per graph in `graphs/`, generated at build
//! time. Each graph has a struct (`SwigluFfn::new().run(&stream, …)`) and,
//! when it is a single kernel, a function (`kernels::gemm_bias_gelu(&stream,
//! &x, &w, &b, &mut y)`). Every item's documentation shows the graph's
//! arguments and its fusion plan.

include!(concat!(env!("OUT_DIR"), "/fusion_kernels.rs"));
