//! `fencepost device`: this device's identity (issue 39).

use super::*;

/// `fencepost device …`.
#[derive(Debug, clap::Subcommand)]
pub enum DeviceCommand {
    /// Print this device's public key, one line (made on first use: an Ed25519 signing key and
    /// an X25519 key-agreement key, kept in the data directory's `keys` folder, mode 0600, one
    /// per device id). Give the line to a member of a ledger, who admits the device with it.
    Key,
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
    }
}
