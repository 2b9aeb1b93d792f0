//! [`Frontier`]: per device, how many records of its log a site has, and their head.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::oplog::{OpId, OpRecord};

/// Per device, how many records of its log a site has: the next seq it lacks; and, where known,
/// the id of the device's last record below it (its *head*), which names the records counted: two
/// logs of one device id that differ (a device id used by two hosts with separate ledgers, a log
/// replaced by another) have the same count and different heads.
///
/// Heads are kept by [`observe`](Self::observe) and [`raise_to`](Self::raise_to) and carried by
/// [`merge`](Self::merge) (the larger count's head; for equal counts, the first head known); a
/// plain [`raise`](Self::raise) to a larger count forgets the device's head. Equality compares
/// both. Serialized, a frontier is its counts alone.
///
/// ```
/// use fencepost::relay::Frontier;
/// let frontier = Frontier::new();
/// assert_eq!(frontier.next_seq("laptop"), 0);
/// assert_eq!(frontier.head("laptop"), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "BTreeMap<Arc<str>, u64>", into = "BTreeMap<Arc<str>, u64>")]
pub struct Frontier {
    devices: BTreeMap<Arc<str>, Had>,
}

/// What a [`Frontier`] knows of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Had {
    next_seq: u64,
    head: Option<OpId>,
}

impl From<BTreeMap<Arc<str>, u64>> for Frontier {
    fn from(counts: BTreeMap<Arc<str>, u64>) -> Self {
        Self {
            devices: counts
                .into_iter()
                .map(|(device, next_seq)| (device, Had { next_seq, head: None }))
                .collect(),
        }
    }
}

impl From<Frontier> for BTreeMap<Arc<str>, u64> {
    fn from(frontier: Frontier) -> Self {
        frontier
            .devices
            .into_iter()
            .map(|(device, had)| (device, had.next_seq))
            .collect()
    }
}

impl Frontier {
    /// A frontier that has nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The first seq of `device_id` not yet had (0 for an unknown device).
    pub fn next_seq(&self, device_id: &str) -> u64 {
        self.devices.get(device_id).map_or(0, |had| had.next_seq)
    }

    /// Records that `op` is had (and so are all earlier records of its device).
    pub fn observe(&mut self, op: &OpRecord) {
        // `u64::MAX` is no seq a log reaches (a chain would need 2^64 records); a record claiming it
        // must not overflow the frontier.
        self.raise_to(&op.device_id, op.seq.saturating_add(1), Some(op.op_id));
    }

    /// The id of `device_id`'s record at `next_seq - 1`, when known.
    pub fn head(&self, device_id: &str) -> Option<OpId> {
        self.devices.get(device_id).and_then(|had| had.head)
    }

    /// Raises `device_id`'s next seq to `next_seq` (never lowers it), with `head`, the id of its
    /// record `next_seq - 1` when known: a larger count takes `head` (and forgets the head it
    /// had), an equal count keeps the head it has, or takes `head` when it had none.
    pub fn raise_to(&mut self, device_id: &str, next_seq: u64, head: Option<OpId>) {
        let head = head.filter(|_| next_seq > 0);
        match self.devices.get_mut(device_id) {
            Some(had) if had.next_seq > next_seq => {}
            Some(had) if had.next_seq == next_seq => had.head = had.head.or(head),
            Some(had) => *had = Had { next_seq, head },
            None => {
                self.devices.insert(Arc::from(device_id), Had { next_seq, head });
            }
        }
    }

    /// [`observe`](Self::observe) for each record.
    pub fn observe_all<'a>(&mut self, ops: impl IntoIterator<Item = &'a OpRecord>) {
        ops.into_iter().for_each(|op| self.observe(op));
    }

    /// The devices known, with their next seq, in device order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.devices.iter().map(|(device, had)| (&**device, had.next_seq))
    }

    /// Raises `device_id`'s next seq to `next_seq` (never lowers it), its head unknown.
    pub fn raise(&mut self, device_id: &str, next_seq: u64) {
        self.raise_to(device_id, next_seq, None);
    }

    /// Raises every device of `other` (the union, device by device the larger, with its head).
    pub fn merge(&mut self, other: &Frontier) {
        for (device, next) in other.iter() {
            self.raise_to(device, next, other.head(device));
        }
    }

    /// Whether it knows no device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// What this frontier lacks of `needed`: per device, `(device, had, needed)` where it has
    /// fewer records, in device order.
    pub fn lacking(&self, needed: &Frontier) -> Vec<(String, u64, u64)> {
        needed
            .iter()
            .filter(|(device, next)| self.next_seq(device) < *next)
            .map(|(device, next)| (device.to_owned(), self.next_seq(device), next))
            .collect()
    }
}
