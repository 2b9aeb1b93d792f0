//! `fencepost device`: this device's identity (issue 39).

use super::*;

/// `fencepost device …`.
#[derive(Debug, clap::Subcommand)]
pub enum DeviceCommand {
    /// Print this device's public key, one line (made on first use: an Ed25519 signing key and
    /// an X25519 key-agreement key, kept in the data directory's `keys` folder, mode 0600, one
    /// per device id). Give the line to a member of a ledger, who admits the device with it.
    Key,
    /// Admit a device to the protected ledger this host is a member of: `device admit KEY
    /// --device ID`, KEY the line `fencepost device key` printed on it, ID its device id (this
    /// host's own id then comes from FENCEPOST_DEVICE, the config file, a --device before
    /// `device`, or the default). Every generation of the ledger key is wrapped to it; its
    /// records count once its log begins with that key.
    Admit {
        /// The device's public key line (`fpdev1.…`).
        key: String,
        /// Admit it with the ledger's recovery key (the file `ledger init` wrote), from any host
        /// that joined the ledger, a member or not: when the only member's key is lost, the new
        /// device admits itself this way, and gets every generation of the ledger key.
        #[arg(long, value_name = "FILE")]
        recovery_key_file: Option<PathBuf>,
    },
    /// Join the protected ledger whose fingerprint (`fencepost ledger fingerprint` on a member)
    /// is FINGERPRINT: this host then reads the ledger as protected, and its records count once
    /// a member admits it.
    Join {
        /// The ledger's fingerprint (40 hex digits; case, dashes and spaces ignored).
        fingerprint: String,
    },
    /// Revoke a member of the protected ledger this host is a member of: its records from
    /// `--from` on count for nothing (by default, from the end of its log as this host read it),
    /// the runs they name are in doubt (never run again by themselves: `fencepost ledger
    /// resolve` settles them), the devices it admitted from there on are no members, and a new
    /// generation of the ledger key seals what the remaining members write next.
    Revoke {
        /// The device id to revoke.
        #[arg(value_name = "ID")]
        revoked: String,
        /// The first record of its log to void: a stolen device, say, from before the theft
        /// (the records of its log are numbered from 0; `ledger verify` lists each log's
        /// length).
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// Revoke it with the ledger's recovery key (the file `ledger init` wrote), from any
        /// host that joined the ledger: the cut counts wherever it is, and takes the device's
        /// power to revoke others from there on too.
        #[arg(long, value_name = "FILE")]
        recovery_key_file: Option<PathBuf>,
    },
}

/// `fencepost device …`.
pub fn device(settings: &Settings, command: DeviceCommand) -> Result<i32> {
    match command {
        DeviceCommand::Key => {
            let folder = crate::settings::keys_dir()?;
            let device = fencepost::id::DeviceId::new(&settings.device)?;
            let (key, created) = fencepost::identity::load_or_create(&folder, &device)?;
            if created {
                err!(
                    "made the key of device {device} in {} (its identity: back it up with the data directory, copy it to no other host)",
                    fencepost::identity::key_path(&folder, &device).display()
                );
            }
            out!("{}", key.public());
            Ok(EXIT_RAN_OK)
        }
        // main.rs takes the --device after `admit` for the admitted device's id.
        DeviceCommand::Admit {
            key,
            recovery_key_file,
        } => super::protect::admit(settings, &key, None, recovery_key_file.as_deref()),
        DeviceCommand::Join { fingerprint } => super::protect::join(settings, &fingerprint),
        DeviceCommand::Revoke {
            revoked,
            from,
            recovery_key_file,
        } => super::protect::revoke(settings, &revoked, from, recovery_key_file.as_deref()),
    }
}
