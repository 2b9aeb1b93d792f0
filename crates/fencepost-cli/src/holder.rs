//! Which process of this host holds an agent's lease: the coordinator knows only the device id,
//! and every process of a host shares it. `run` records itself while it holds a lease
//! (`<data dir>/fencepost/holders/`), so that a refusal (exit 4) and `status` can say "this
//! host, process 1234" instead of leaving the operator to guess between another host and a
//! second cron job here.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::settings::{data_dir, Settings};

/// What a holding process records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HolderProcess {
    /// Its process id.
    pub pid: u32,
    /// The agent.
    pub agent_id: String,
    /// The device id it holds the lease as.
    pub device_id: String,
    /// The epoch it holds.
    pub epoch: u64,
    /// The run it was started for.
    pub run_id: String,
    /// When it was granted the lease (ms since the Unix epoch, this host's clock).
    pub granted_at_ms: u64,
}

/// The record of this process as a holder, removed when dropped.
#[derive(Debug)]
pub struct Holding {
    path: Option<PathBuf>,
}

impl Holding {
    /// Records this process as the holder of `agent_id`'s lease at `epoch` (best effort: a
    /// record that cannot be written only makes messages less precise).
    pub fn record(settings: &Settings, agent_id: &str, epoch: u64, run_id: &str) -> Self {
        let Some(path) = path_of(settings, agent_id) else {
            return Self { path: None };
        };
        let holder = HolderProcess {
            pid: std::process::id(),
            agent_id: agent_id.to_owned(),
            device_id: settings.device.clone(),
            epoch,
            run_id: run_id.to_owned(),
            granted_at_ms: fencepost::clock::system_clock()(),
        };
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                let text = serde_json::to_vec(&holder).map_err(std::io::Error::other)?;
                let temporary = path.with_extension(format!("tmp-{}", std::process::id()));
                std::fs::write(&temporary, text)?;
                std::fs::rename(&temporary, &path)
            });
        match written {
            Ok(()) => Self { path: Some(path) },
            Err(error) => {
                tracing::debug!(%error, path = %path.display(), "cannot record this process as the lease's holder");
                Self { path: None }
            }
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let Some(path) = &self.path else {
            return;
        };
        // Only our own record: another process of this host may hold the next epoch by now.
        if read(path).is_some_and(|holder| holder.pid == std::process::id()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where the holder of `agent_id` under this coordinator is recorded.
fn path_of(settings: &Settings, agent_id: &str) -> Option<PathBuf> {
    let mut digest = Sha256::new();
    digest.update(crate::settings::without_password(&settings.coordinator).as_bytes());
    digest.update([0x1f]);
    digest.update(agent_id.as_bytes());
    let key: String = digest.finalize()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Some(data_dir().ok()?.join("holders").join(format!("{key}.json")))
}

fn read(path: &std::path::Path) -> Option<HolderProcess> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The process of this host that holds `agent_id`'s lease as `device_id` at `epoch`, if one
/// recorded itself and is still alive.
pub fn find(settings: &Settings, agent_id: &str, device_id: &str, epoch: u64) -> Option<HolderProcess> {
    if device_id != settings.device {
        return None;
    }
    let holder = read(&path_of(settings, agent_id)?)?;
    let pid = i32::try_from(holder.pid).ok()?;
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    (holder.epoch == epoch && holder.device_id == device_id && holder.agent_id == agent_id && alive)
        .then_some(holder)
}

/// The holder of a lease, as messages name it: another host's device id, or this host's
/// (another process here, named by its pid when it recorded itself).
pub fn describe(settings: &Settings, agent_id: &str, holder: &str, epoch: u64) -> String {
    if holder != settings.device {
        return format!("{holder} (another host, or a process with another device id)");
    }
    match find(settings, agent_id, holder, epoch) {
        Some(process) => format!(
            "this host ({holder}), process {} running {}",
            process.pid, process.run_id
        ),
        None => format!("this host ({holder}), another process with this device id"),
    }
}
