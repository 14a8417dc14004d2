//! Drives the admission controller with arbitrary operation sequences and
//! checks its invariants after every step.
//!
//! The operation language and the checker live in the admission crate's
//! `tests/fuzz_model.rs`, where a proptest runs them in the normal test
//! suite; this target only turns libFuzzer's bytes into choices.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;

#[path = "../../tessera-admission/tests/fuzz_model.rs"]
mod model;

impl model::Choices for Unstructured<'_> {
    fn pick(&mut self, max: u32) -> u32 {
        // Out of bytes, `int_in_range` yields the low end: 0.
        self.int_in_range(0..=max).unwrap_or(0)
    }

    fn more(&mut self) -> bool {
        !self.is_empty()
    }
}

impl<'a> Arbitrary<'a> for model::Scenario {
    fn arbitrary(input: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Self::decode(input))
    }
}

fuzz_target!(|scenario: model::Scenario| model::run(&scenario));
