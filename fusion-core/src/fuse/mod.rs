//! The fusion matcher: splits a graph into fused kernels.
