//! Which process of this host holds an agent's lease: the coordinator knows only the device id,
//! and every process of a host shares it. `run` records itself while it holds a lease
//! (`<data dir>/fencepost/holders/`), so that a refusal (exit 4) and `status` can say "this
//! host, process 1234" instead of leaving the operator to guess between another host and a
//! second cron job here.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

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
    /// When the process started (Linux: clock ticks since boot, `/proc/PID/stat`): a process
    /// that took its pid later is not it.
    #[serde(default)]
    pub started_ticks: Option<u64>,
    /// Its pid namespace (Linux: `/proc/self/ns/pid`): a pid means nothing in another one (a
    /// container).
    #[serde(default)]
    pub pid_namespace: Option<String>,
}

/// What is known of the process of this host that holds a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderState {
    /// It recorded itself and still runs.
    Running(HolderProcess),
    /// It recorded itself and is gone (killed before it could release): the lease ends with its
    /// TTL.
    Gone(HolderProcess),
    /// No usable record (another host, an older fencepost, a process in another pid namespace).
    Unknown,
}

/// When process `pid` started, in clock ticks since boot (Linux).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) begin with field 3 (state);
    // the start time is field 22.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's pid namespace (Linux).
fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|link| link.display().to_string())
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
            started_ticks: process_start(std::process::id()),
            pid_namespace: pid_namespace(),
        };
        let temporary = path.with_extension(format!("tmp-{}", std::process::id()));
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                let text = serde_json::to_vec(&holder).map_err(std::io::Error::other)?;
                std::fs::write(&temporary, text)?;
                std::fs::rename(&temporary, &path)
            })
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&temporary);
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
    let coordinator = crate::settings::without_password(&settings.coordinator);
    let key = crate::settings::short_key(&[coordinator.as_bytes(), agent_id.as_bytes()]);
    Some(data_dir().ok()?.join("holders").join(format!("{key}.json")))
}

fn read(path: &std::path::Path) -> Option<HolderProcess> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The process of this host that holds `agent_id`'s lease as `device_id` at `epoch`, as far as
/// its record tells: running (the pid is alive, started when the record says, in this pid
/// namespace), gone, or unknown.
pub fn find(settings: &Settings, agent_id: &str, device_id: &str, epoch: u64) -> HolderState {
    if device_id != settings.device {
        return HolderState::Unknown;
    }
    let Some(holder) = path_of(settings, agent_id).and_then(|path| read(&path)) else {
        return HolderState::Unknown;
    };
    let ours = holder.epoch == epoch && holder.device_id == device_id && holder.agent_id == agent_id;
    let comparable = match (&holder.pid_namespace, pid_namespace()) {
        (Some(recorded), Some(here)) => *recorded == here,
        _ => true,
    };
    let Ok(pid) = i32::try_from(holder.pid) else {
        return HolderState::Unknown;
    };
    if !ours || !comparable || pid <= 0 {
        return HolderState::Unknown;
    }
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    let same_process = match holder.started_ticks {
        Some(started) => process_start(holder.pid) == Some(started),
        None => true,
    };
    if alive && same_process {
        HolderState::Running(holder)
    } else {
        HolderState::Gone(holder)
    }
}

/// The holder of a lease, as messages name it: another host's device id, or this host's
/// (another process here, named by its pid when it recorded itself).
pub fn describe(settings: &Settings, agent_id: &str, holder: &str, epoch: u64) -> String {
    if holder != settings.device {
        return format!("{holder} (another host, or a process with another device id)");
    }
    match find(settings, agent_id, holder, epoch) {
        HolderState::Running(process) => format!(
            "this host ({holder}), process {} running {}",
            process.pid, process.run_id
        ),
        HolderState::Gone(process) => format!(
            "this host ({holder}), whose process {} ended without giving it back (killed?): it ends with its TTL",
            process.pid
        ),
        HolderState::Unknown => format!("this host ({holder}), another process with this device id"),
    }
}
