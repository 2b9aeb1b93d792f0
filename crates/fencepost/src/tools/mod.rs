//! The tools: built on the core and the edge, deciding nothing of the protocol: the conformance
//! suite every coordinator and relay passes, a reference fenced resource, and the simulator.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod resource;
#[cfg(feature = "simulate")]
pub mod simulate;
