//! Why a duplicate happened: every effect that lands is counted, and a duplicate is attributed to
//! the zombie among its effects (paused, or its lease lost to a coordinator fail-over in flight),
//! to ledger lag, or to the mode's missing guard.

use super::world::{agent_name, InFlight, World};
use super::{Cause, Effect, GuardMode};

impl World<'_> {
    /// Counts the effect of `flight`, landing now at `index`'s resource, and attributes it when it
    /// is a duplicate.
    pub(super) fn apply(&mut self, index: usize, flight: &InFlight) {
        let key = (flight.agent, flight.occurrence);
        let count = self.applied.entry(key).or_insert(0);
        *count += 1;
        let duplicate = *count > 1;
        let stale = match self.mode {
            GuardMode::None | GuardMode::Lease => None,
            GuardMode::Fence | GuardMode::Token => {
                let name = agent_name(flight.agent);
                let still_held = matches!(
                    self.coordinator.inner.current(&name),
                    Ok(Some(lease)) if lease.holder == self.sites[index].name && lease.epoch == flight.epoch
                );
                match (still_held, flight.paused) {
                    (true, _) => None,
                    (false, true) => Some(Cause::PauseAfterFence),
                    (false, false) => Some(Cause::LeaseLostInFlight),
                }
            }
        };
        let earlier_stale = self.stale_landings.get(&key).copied();
        if let Some(cause) = stale {
            self.stale_landings.entry(key).or_insert(cause);
        }
        let duplicate = duplicate.then(|| match self.mode {
            GuardMode::None => Cause::NoGuard,
            GuardMode::Lease => Cause::NoFence,
            // One of the two effects was a zombie, or the second site had not heard of the first.
            GuardMode::Fence | GuardMode::Token => {
                stale.or(earlier_stale).unwrap_or(if flight.frontier_lost {
                    Cause::FrontierLost
                } else if flight.lagging {
                    Cause::LedgerLag
                } else {
                    Cause::Unexplained
                })
            }
        });
        self.report.effects += 1;
        if let Some(cause) = duplicate {
            self.report.duplicates += 1;
            *self.report.duplicates_by_cause.entry(cause).or_insert(0) += 1;
        }
        self.report.effect_log.push(Effect {
            site: index,
            agent: flight.agent,
            occurrence: flight.occurrence,
            epoch: flight.epoch,
            at_ms: self.now_ms,
            duplicate,
        });
    }
}
