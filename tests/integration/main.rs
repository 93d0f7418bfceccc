//! Integration tests: one binary, one module per concern.

mod common;
mod errors;
mod extending;
mod golden;
mod handoff;
mod hardware;
mod layout;
mod mechanisms;
mod outputs;
mod policies;
mod properties;
mod reliability;
mod runs;
mod sweep;
mod traces;
