//! pdsim: a simulator of prefill/decode disaggregated LLM serving.
pub mod sharing;
