//! Every error `fusion_graph!` reports, compiled and compared with the
//! checked-in `tests/ui/*.stderr` (regenerate with `TRYBUILD=overwrite`).

#[test]
fn diagnostics() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
