//! Shared by the backend test files.

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

/// A stamp for recorded histories that every process of one host shares: nanoseconds of the
/// system clock.
pub fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// One test per rule of the suite, for one backend, each named after its rule.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ident, $harness:expr $(, #[$meta:meta])*) => {
        mod $backend {
            use super::*;

            #[test]
            $(#[$meta])*
            fn l1_acquire_grants_a_free_or_expired_agent_and_refuses_a_valid_lease() {
                conformance::l1_acquire_grants_a_free_or_expired_agent_and_refuses_a_valid_lease(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn l2_renew_extends_the_holders_lease_until_stolen() {
                conformance::l2_renew_extends_the_holders_lease_until_stolen(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn l3_release_clears_the_holder_and_keeps_the_epoch() {
                conformance::l3_release_clears_the_holder_and_keeps_the_epoch(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn l4_current_reports_the_holder_expired_or_not() {
                conformance::l4_current_reports_the_holder_expired_or_not(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn l5_epochs_never_repeat_or_regress() {
                conformance::l5_epochs_never_repeat_or_regress(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn l5_the_last_epoch_is_minted_once_and_never_clamped() {
                conformance::l5_the_last_epoch_is_minted_once_and_never_clamped(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn l6_concurrent_acquires_have_exactly_one_winner() {
                conformance::l6_concurrent_acquires_have_exactly_one_winner(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn l6_recorded_thread_histories_are_linearizable() {
                let config = HistoryConfig::default();
                assert!(config.histories >= 20 && config.threads * config.operations_per_thread >= 200);
                conformance::l6_recorded_histories_are_linearizable(&$harness, &config);
            }

            #[test]
            $(#[$meta])*
            fn l8_bad_input_is_a_clear_error_and_changes_nothing() {
                conformance::l8_bad_input_is_a_clear_error_and_changes_nothing(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn d1_the_fence_reads_the_oracle_then_the_coordinator() {
                conformance::d1_the_fence_reads_the_oracle_then_the_coordinator(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn h1_the_holder_publishes_a_monotone_cumulative_frontier() {
                conformance::h1_the_holder_publishes_a_monotone_cumulative_frontier(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn h1_the_published_heads_name_the_records() {
                conformance::h1_the_published_heads_name_the_records(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn h2_h3_the_combined_calls_act_as_their_parts() {
                conformance::h2_h3_the_combined_calls_act_as_their_parts(&$harness);
            }

            #[test]
            $(#[$meta])*
            fn h4_the_published_frontier_survives_reopening() {
                conformance::h4_the_published_frontier_survives_reopening(&$harness);
            }
        }
    };
}
