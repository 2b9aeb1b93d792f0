//! The fold workload of DESIGN §7: 100 agents × 10 000 runs, 4 devices, epochs 1–3, about 10 %
//! of runs pending only and about 10 % failed: 1.9 M intent records.
//!
//! Shared by the `fold` bench and the `fold_memory` example, which each use part of it.
#![allow(dead_code)]

use fencepost::clock::ManualClock;
use fencepost::lease::{Intent, IntentStatus};
use fencepost::oplog::{DeviceLog, OpRecord, Surface};
use fencepost::run_id::deterministic_run_id;

pub const AGENTS: usize = 100;
pub const RUNS_PER_AGENT: usize = 10_000;
pub const DEVICES: usize = 4;

/// The device logs (to continue them) and the records, in log order per device, devices interleaved.
pub struct Workload {
    pub clock: ManualClock,
    pub logs: Vec<DeviceLog>,
    pub ops: Vec<OpRecord>,
}

/// The epoch and device that run `run` of `agent` is executed under: the lease moves from device to
/// device twice during the agent's life.
fn placement(agent: usize, run: usize) -> (u64, usize) {
    let epoch = 1 + (run * 3 / RUNS_PER_AGENT) as u64;
    (epoch, (agent + epoch as usize) % DEVICES)
}

pub fn build() -> Workload {
    let clock = ManualClock::new(1_764_400_000_000);
    let mut logs: Vec<DeviceLog> = (0..DEVICES)
        .map(|device| DeviceLog::new(&format!("device-{device}"), clock.wall_clock()).unwrap())
        .collect();
    let mut ops = Vec::with_capacity(AGENTS * RUNS_PER_AGENT * 19 / 10 + 16);
    for run in 0..RUNS_PER_AGENT {
        clock.advance(1);
        for agent in 0..AGENTS {
            let agent_id = format!("agent-{agent:03}");
            let run_id = deterministic_run_id(&agent_id, "scheduled job", &run.to_string()).unwrap();
            let (epoch, device) = placement(agent, run);
            let log = &mut logs[device];
            let pending = Intent::new(agent_id.as_str(), run_id.as_str(), epoch, IntentStatus::Pending);
            ops.push(log.append(Surface::Intent, pending.payload()));
            let terminal = match (run + agent) % 10 {
                0 => None, // pending only: in doubt, or fenced after the next fail-over
                1 => Some(IntentStatus::Failed),
                _ => Some(IntentStatus::Committed),
            };
            if let Some(status) = terminal {
                ops.push(log.append(
                    Surface::Intent,
                    Intent::new(agent_id, run_id, epoch, status).payload(),
                ));
            }
        }
    }
    Workload { clock, logs, ops }
}

/// `count` new records continuing the logs: new runs (pending then committed) at each agent's
/// latest epoch, spread over the agents.
pub fn tail(workload: &mut Workload, start: usize, count: usize) -> Vec<OpRecord> {
    let mut ops = Vec::with_capacity(count);
    let mut index = start;
    while ops.len() < count {
        workload.clock.advance(1);
        let agent = index % AGENTS;
        let agent_id = format!("agent-{agent:03}");
        let run_id =
            deterministic_run_id(&agent_id, "scheduled job", &(RUNS_PER_AGENT + index).to_string()).unwrap();
        let (epoch, device) = placement(agent, RUNS_PER_AGENT - 1);
        let log = &mut workload.logs[device];
        for status in [IntentStatus::Pending, IntentStatus::Committed] {
            ops.push(log.append(
                Surface::Intent,
                Intent::new(agent_id.as_str(), run_id.as_str(), epoch, status).payload(),
            ));
        }
        index += 1;
    }
    ops.truncate(count);
    ops
}
