//! The Hugging Face names of a feed-forward block's weights: what `hf` writes
//! into a graph and what `fusion::weights::TensorNames::hugging_face` reads
//! from a checkpoint. Always present, because the run time maps names with it.

/// The Hugging Face name, within one decoder layer (`model.layers.<i>.`), of
/// each weight of a gated block: the names `hf::ffn_toml` writes, and `gamma`,
/// as the shipped graphs call the norm's weight. What
/// `fusion::weights::TensorNames::hugging_face` maps.
pub const GATED_WEIGHT_NAMES: &[(&str, &str)] = &[
    ("norm", "post_attention_layernorm.weight"),
    ("gamma", "post_attention_layernorm.weight"),
    ("w_gate", "mlp.gate_proj.weight"),
    ("w_up", "mlp.up_proj.weight"),
    ("w_down", "mlp.down_proj.weight"),
];

/// The Hugging Face name of a gated block's weight (see [`GATED_WEIGHT_NAMES`]).
pub fn gated_weight_name(name: &str) -> Option<&'static str> {
    GATED_WEIGHT_NAMES
        .iter()
        .find(|(ours, _)| *ours == name)
        .map(|(_, theirs)| *theirs)
}
