//! [`InMemoryRelay`]: the reference relay, for tests, the simulator and single-process use.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::{
    group_by_device, plan_device_push, Appended, DevicePlan, Frontier, MakeRecords, PullBatch, PushReport,
    Relay, RelayError,
};
use crate::oplog::{LogHead, OpRecord};

/// A relay held in memory. `Clone` shares one store, so clones act as one relay seen by many sites.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::oplog::{DeviceLog, Surface};
/// use fencepost::relay::{Frontier, InMemoryRelay, Relay};
/// use serde_json::json;
///
/// let relay = InMemoryRelay::new();
/// let mut log = DeviceLog::new("laptop", ManualClock::new(1).wall_clock()).unwrap();
/// let op = log.append(Surface::log("note"), json!({"text": "hi"}));
/// relay.push(&[op.clone()]).unwrap();
/// assert_eq!(relay.push(&[op.clone()]).unwrap().already_present, 1); // idempotent
/// assert_eq!(relay.pull(&Frontier::new()).unwrap().ops, vec![op]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct InMemoryRelay {
    logs: Arc<Mutex<BTreeMap<Arc<str>, StoredLog>>>,
}

#[derive(Debug)]
struct StoredLog {
    head: LogHead,
    ops: Vec<OpRecord>,
}

impl InMemoryRelay {
    /// An empty relay.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Relay for InMemoryRelay {
    /// Every record is checked against its chain as it is stored.
    fn checks_records(&self) -> bool {
        true
    }

    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
        let groups = group_by_device(ops)?;
        // A panic elsewhere cannot leave the map half-written: it is changed only after all checks.
        let mut logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut plans: Vec<DevicePlan<'_>> = Vec::with_capacity(groups.len());
        for (device_id, device_ops) in groups {
            let empty;
            let stored = match logs.get(device_id) {
                Some(stored) => stored,
                None => {
                    empty = StoredLog {
                        head: LogHead::new(device_id),
                        ops: Vec::new(),
                    };
                    &empty
                }
            };
            let plan = plan_device_push(&stored.head, |seq| Ok(stored.ops[seq as usize].op_id), device_ops)?;
            plans.push(plan);
        }
        let mut report = PushReport::default();
        for plan in plans {
            report.already_present += plan.already_present;
            report.appended += plan.fresh.len();
            if plan.fresh.is_empty() {
                continue;
            }
            let stored = logs
                .entry(Arc::clone(plan.head.device_id()))
                .or_insert_with(|| StoredLog {
                    head: LogHead::new(Arc::clone(plan.head.device_id())),
                    ops: Vec::new(),
                });
            stored.ops.extend(plan.fresh.into_iter().cloned());
            stored.head = plan.head;
            debug_assert_eq!(stored.head.next_seq(), stored.ops.len() as u64);
        }
        Ok(report)
    }

    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError> {
        let logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut batch = PullBatch::default();
        for (device_id, stored) in logs.iter() {
            let from = usize::try_from(since.next_seq(device_id)).unwrap_or(usize::MAX);
            if let Some(missing) = stored.ops.get(from..) {
                batch.ops.extend_from_slice(missing);
            }
        }
        Ok(batch)
    }

    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut MakeRecords<'_>,
    ) -> Result<Appended, RelayError> {
        crate::id::validate_id(crate::id::IdKind::Device, device_id)?;
        let mut logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        let stored = logs.entry(Arc::from(device_id)).or_insert_with(|| StoredLog {
            head: LogHead::new(device_id),
            ops: Vec::new(),
        });
        let from = usize::try_from(since_seq).unwrap_or(usize::MAX);
        let tail = stored.ops.get(from..).unwrap_or_default().to_vec();
        let made = make(&tail)?;
        let mut head = stored.head.clone();
        for op in &made {
            head.accept(op)?;
        }
        stored.ops.extend(made.iter().cloned());
        stored.head = head;
        Ok(Appended { tail, appended: made })
    }
}
