//! Where a reading stands ([`Relay::cursor`](super::Relay::cursor)), so that a site resumes
//! reading each file at its offset.

use super::*;

/// Where an [`FsRelay`]'s reading stands ([`Relay::cursor`]).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FsCursor {
    pub(super) files: Vec<FileCursor>,
}

/// Where the reading of one device file stands.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileCursor {
    pub(super) name: String,
    pub(super) verified_to: u64,
    pub(super) last_start: u64,
    pub(super) head: HeadMark,
}

impl FsRelay {
    /// The index of a file resumed at `file`, once the file is checked against it.
    pub(super) fn resumed_file(&self, file: &FileCursor) -> Result<DeviceFile, String> {
        let head = LogHead::from_mark(&file.head)
            .ok_or_else(|| format!("the cursor of {} is damaged", file.name))?;
        let (Some(_), Some(last_seq)) = (head.last_op_id(), head.next_seq().checked_sub(1)) else {
            return Err(format!("the cursor of {} names no record", file.name));
        };
        if !is_device_file_name(&file.name) || device_file_name(head.device_id()) != file.name {
            return Err(format!(
                "the cursor names {:?}, not the file of {:?}",
                file.name,
                head.device_id()
            ));
        }
        let line_bytes_ok = file
            .verified_to
            .checked_sub(file.last_start)
            .is_some_and(|length| (1..=self.config.max_line_bytes as u64 + 1).contains(&length));
        if !line_bytes_ok {
            return Err(format!("the cursor of {} is damaged", file.name));
        }
        let path = self.devices_dir.join(&file.name);
        // Where it was, or where the file holds it now (pruned since: the file begins after a
        // checkpoint, and the reading goes on where the records it read are).
        let located = self
            .locate(&path, &head, Some((file.last_start, file.verified_to)))
            .map_err(|detail| {
                format!(
                    "record {last_seq} is not where it was read: {}",
                    detail.trim_end_matches(prune::PRUNED_MARK)
                )
            })?;
        Ok(DeviceFile {
            path,
            first_seq: located.first_seq,
            offsets: located.offsets,
            verified_to: located.verified_to,
            head: Some(head),
            damage: None,
            begins: located.begins,
            identity: located.identity,
        })
    }
}
