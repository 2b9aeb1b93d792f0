//! [`PostgresRelay`] (feature `postgres`): the ledger in PostgreSQL, in the coordinator's schema, for
//! many hosts that share only a database URL.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use tokio_postgres::SimpleQueryRow;

use super::{
    group_by_device, plan_device_push, stored_head, verify_pulled, Appended, CheckpointStore, Frontier,
    MakeRecords, ProblemKind, PullBatch, PushReport, Relay, RelayError, RelayProblem,
};
use crate::backend::postgres::{bind, Literal, PostgresConfig, PostgresLeaseCoordinator};
use crate::oplog::{LogHead, OpId, OpRecord};

/// Every device's log in two tables beside the PostgreSQL coordinator's, in its schema
/// (`relay_devices`: each device's length; `relay_records`: each record's JSON wire form, keyed by
/// device and seq), made by the coordinator's [`migrate`](PostgresLeaseCoordinator::migrate)
/// (schema version 3). Rule R1:
///
/// * [`push`](Relay::push) is one transaction in two round trips: the first locks the pushed
///   devices' rows (in device order, so two pushes never deadlock) and reads their heads and the
///   stored records the push overlaps; the chains are verified here; the second stores the new
///   records and lengths and commits. A refused push stores nothing.
/// * [`pull`](Relay::pull) is one statement (one snapshot of every device) that reads, per device,
///   only the records from the caller's frontier on (the primary key is `(device_id, seq)`:
///   O(new records)); they are verified here, and a damaged record (a row edited by hand, a gap, a
///   length that disagrees with the rows) is damage of its device, the other devices going on.
/// * [`append`](Relay::append) holds the device's row lock from reading its tail to the commit,
///   so the processes of every host that share a device id interleave instead of forking it.
///
/// Like the coordinator it works through PgBouncer in transaction or session mode (statement
/// mode runs no transaction block: pushes and appends are refused there with an error naming the
/// mode). It has a connection of its own (a coordinator's [`PostgresConfig`]: URL, schema and
/// bounds), so a long pull never delays the lease's renewal. Grants for a least-privilege role:
/// `SELECT, INSERT, UPDATE` on `relay_devices` and `relay_records`; `DELETE` on `relay_records`
/// only for the role that [prunes](Relay::prune) (which deletes only its device's rows that a
/// stored checkpoint covers).
///
/// ```no_run
/// use fencepost::backend::postgres::PostgresConfig;
/// use fencepost::relay::{Frontier, PostgresRelay, Relay};
///
/// let relay = PostgresRelay::connect(PostgresConfig::new("postgres://fencepost_agent:secret@db.internal/app"))?;
/// relay.check_schema()?; // `fencepost admin migrate` made the tables
/// let batch = relay.pull(&Frontier::new())?;
/// println!("{} records, {} problems", batch.ops.len(), batch.problems.len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PostgresRelay {
    database: PostgresLeaseCoordinator,
    devices: String,
    records: String,
    checkpoints: String,
    chunks: String,
    mirror: Option<PathBuf>,
}

/// The bytes of a checkpoint in one stored chunk (twice as many hex digits travel).
const CHUNK_BYTES: usize = 1 << 20;
/// The chunks read in one round trip.
const CHUNKS_PER_READ: i64 = 4;

impl PostgresRelay {
    /// Connects (a bounded number of attempts; see [`PostgresLeaseCoordinator::connect`]).
    /// The tables are made by the coordinator's `migrate` (`fencepost admin migrate`);
    /// [`check_schema`](Self::check_schema) says whether it was done.
    ///
    /// # Errors
    /// [`RelayError::Database`] when the URL or schema name is invalid or no attempt connects.
    pub fn connect(config: PostgresConfig) -> Result<Self, RelayError> {
        let database = PostgresLeaseCoordinator::connect(config).map_err(|error| RelayError::Database {
            operation: "connect to",
            transient: error.is_transient(),
            message: error.to_string(),
            may_have_applied: false,
        })?;
        let schema = database.quoted_schema();
        Ok(Self {
            devices: format!("{schema}.relay_devices"),
            records: format!("{schema}.relay_records"),
            checkpoints: format!("{schema}.relay_checkpoints"),
            chunks: format!("{schema}.relay_checkpoint_chunks"),
            database,
            mirror: None,
        })
    }

    /// Keeps the ledger's shared [checkpoints](crate::checkpoint) in the database
    /// (`relay_checkpoints`, `relay_checkpoint_chunks`), with copies of the ones this site uses
    /// in `folder` (of this host; the processes of one host may share it). Without it, the
    /// ledger has no checkpoints: every new site reads every record.
    #[must_use]
    pub fn with_checkpoint_mirror(mut self, folder: impl Into<PathBuf>) -> Self {
        self.mirror = Some(folder.into());
        self
    }

    /// Checks that the schema is at the version this code needs (one read), as
    /// [`PostgresLeaseCoordinator::check_schema`] does.
    ///
    /// # Errors
    /// [`RelayError::Database`] saying what to do (run `fencepost admin migrate`, or upgrade).
    pub fn check_schema(&self) -> Result<(), RelayError> {
        self.database
            .check_schema()
            .map_err(|error| RelayError::Database {
                operation: "open",
                transient: error.is_transient(),
                message: error.to_string(),
                may_have_applied: false,
            })
    }

    /// The settings of the connection.
    pub fn config(&self) -> &PostgresConfig {
        self.database.config()
    }

    fn damage(&self, device_id: &str, seq: u64, detail: String) -> RelayProblem {
        RelayProblem {
            kind: ProblemKind::Damage,
            device_id: Some(device_id.to_owned()),
            file: None,
            line_number: None,
            detail: format!("record {seq} in {} (the ledger's table): {detail}", self.records),
        }
    }

    /// The statements of the first round trip of a write to `device_id`: make its row when new,
    /// lock it and read its length, then read its largest seq and its stored records with seq in
    /// `from..=to` and its last one.
    fn lock_and_read(&self, device_id: &str, from: u64, to: u64) -> [String; 4] {
        let device = Literal::Text(device_id);
        [
            bind(
                &format!(
                    "INSERT INTO {devices} (device_id, next_seq) VALUES ($1, 0) ON CONFLICT (device_id) DO NOTHING",
                    devices = self.devices
                ),
                &[device],
            ),
            // The lock first, in a statement of its own: in READ COMMITTED each statement reads a
            // snapshot taken when it starts, and only the next statements see what the writer
            // this one waited for committed.
            bind(
                &format!(
                    "SELECT next_seq FROM {devices} WHERE device_id = $1 FOR UPDATE",
                    devices = self.devices
                ),
                &[device],
            ),
            bind(
                &format!(
                    "SELECT max(seq), min(seq) FROM {records} WHERE device_id = $1",
                    records = self.records
                ),
                &[device],
            ),
            bind(
                &format!(
                    "SELECT seq, record FROM {records} WHERE device_id = $1 AND seq >= $2 AND seq <= $3
                     UNION
                     SELECT seq, record FROM {records}
                     WHERE device_id = $1 AND seq = (SELECT d.next_seq - 1 FROM {devices} AS d WHERE d.device_id = $1)
                     ORDER BY seq",
                    devices = self.devices,
                    records = self.records
                ),
                &[device, Literal::Int(seq_value(from)), Literal::Int(seq_value(to))],
            ),
        ]
    }

    /// What the first round trip read of one device: its head (or the damage that keeps it from
    /// being written), its stored records by seq, and the seq of its first stored row (after 0
    /// once a prune removed the records before it).
    fn read_device(
        &self,
        device_id: &str,
        sets: &mut impl Iterator<Item = Vec<SimpleQueryRow>>,
    ) -> Result<(LogHead, BTreeMap<u64, String>, u64), RelayError> {
        let _inserted = sets.next();
        let length = sets.next().unwrap_or_default();
        let top = sets.next().unwrap_or_default();
        let rows = sets.next().unwrap_or_default();
        let row = length.first().ok_or_else(|| RelayError::Database {
            operation: "read",
            message: format!("device {device_id:?}: its row was not returned"),
            may_have_applied: false,
            transient: false,
        })?;
        let next_seq = row.get(0).and_then(|text| text.parse::<u64>().ok()).unwrap_or(0);
        let begins = top
            .first()
            .and_then(|row| row.get(1))
            .and_then(|text| text.parse::<u64>().ok())
            .unwrap_or(0);
        let top = top
            .first()
            .and_then(|row| row.get(0))
            .and_then(|text| text.parse::<u64>().ok());
        let stored: BTreeMap<u64, String> = rows
            .iter()
            .filter_map(|row| Some((row.get(0)?.parse::<u64>().ok()?, row.get(1)?.to_owned())))
            .collect();
        let damage = |seq, detail| self.damage(device_id, seq, detail);
        let last = next_seq
            .checked_sub(1)
            .and_then(|last| stored.get(&last))
            .map(|record| Some(record.as_bytes()));
        let head = stored_head(device_id, next_seq, top, last, &damage)?;
        Ok((head, stored, begins))
    }

    /// The statements of the second round trip: store `ops` of `device_id` and its new length.
    fn store(&self, device_id: &str, ops: &[&OpRecord], next_seq: u64) -> Vec<String> {
        let mut values = String::new();
        let mut line = Vec::new();
        for op in ops {
            line.clear();
            op.write_json_line(&mut line);
            let record = String::from_utf8_lossy(line.trim_ascii_end());
            if !values.is_empty() {
                values.push(',');
            }
            values.push('(');
            Literal::Text(device_id).write(&mut values);
            values.push(',');
            Literal::Int(seq_value(op.seq)).write(&mut values);
            values.push(',');
            Literal::Text(&record).write(&mut values);
            values.push(')');
        }
        vec![
            format!(
                "INSERT INTO {records} (device_id, seq, record) VALUES {values}",
                records = self.records
            ),
            bind(
                &format!(
                    "UPDATE {devices} SET next_seq = $2 WHERE device_id = $1",
                    devices = self.devices
                ),
                &[Literal::Text(device_id), Literal::Int(seq_value(next_seq))],
            ),
        ]
    }
}

/// A seq as a stored `bigint` (seqs beyond 2^63 are refused by the log long before).
fn seq_value(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// The stored record `seq` of `device_id` as read by a write's first round trip, checked to be
/// that record with an id over its content (the chain is checked by the caller); a missing or
/// damaged one is damage of the device.
fn stored_op(
    relay: &PostgresRelay,
    device_id: &str,
    stored: &BTreeMap<u64, String>,
    seq: u64,
) -> Result<OpRecord, RelayError> {
    let damage = |seq, detail| relay.damage(device_id, seq, detail);
    match stored.get(&seq) {
        Some(record) => super::stored_record(device_id, seq, Some(record.as_bytes()), &damage),
        None => Err(damage(seq, "missing".to_owned())),
    }
    .map_err(|problem| RelayError::DeviceDamaged {
        device_id: device_id.to_owned(),
        problem,
    })
}

impl Relay for PostgresRelay {
    /// Every record is checked against its chain as it is read.
    fn checks_records(&self) -> bool {
        true
    }

    fn is_database(&self) -> bool {
        true
    }

    /// The caller's frontier: this relay reads by it.
    fn cursor(&self, frontier: &Frontier) -> Option<serde_json::Value> {
        super::frontier_cursor(frontier)
    }

    /// Checks that every device still holds the cursor's last record.
    fn resume(&self, cursor: &serde_json::Value) -> Result<(), super::ResumeError> {
        super::resume_by_pull(self, cursor)
    }

    /// The mirror's folder ([`with_checkpoint_mirror`](PostgresRelay::with_checkpoint_mirror)).
    fn checkpoints_dir(&self) -> Option<PathBuf> {
        self.mirror.clone()
    }

    /// The database, when there is a mirror.
    fn checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        self.mirror.as_ref().map(|_| self as &dyn CheckpointStore)
    }

    /// Reads each device's first row, in one statement (an index lookup per device).
    fn log_starts(&self) -> Result<BTreeMap<String, (u64, OpId)>, RelayError> {
        let statement = format!(
            "SELECT d.device_id, r.seq, r.record
             FROM {devices} AS d
             JOIN LATERAL (SELECT seq, record FROM {records} AS x WHERE x.device_id = d.device_id
                           ORDER BY x.seq LIMIT 1) AS r ON true
             WHERE r.seq > 0",
            devices = self.devices,
            records = self.records
        );
        let rows = self
            .database
            .read_rows("read", vec![statement])?
            .into_iter()
            .next()
            .unwrap_or_default();
        Ok(super::stored_starts(rows.iter().filter_map(|row| {
            Some((
                row.get(0)?,
                row.get(1)?.parse::<u64>().ok()?,
                row.get(2).map(str::as_bytes),
            ))
        })))
    }

    /// One transaction in two round trips: the device's row locked and the records where the
    /// checkpoint ends read and checked, then the rows before the kept ones deleted (the role
    /// needs `DELETE` on `relay_records`).
    fn prune(&self, device_id: &str, through_seq: u64, through_id: OpId) -> Result<u64, RelayError> {
        crate::id::validate_id(crate::id::IdKind::Device, device_id)?;
        let mut first = self
            .lock_and_read(
                device_id,
                through_seq.saturating_sub(1),
                through_seq.saturating_add(1),
            )
            .to_vec();
        first.push(bind(
            &format!("SELECT min(seq) FROM {} WHERE device_id = $1", self.records),
            &[Literal::Text(device_id)],
        ));
        self.database.two_round_transaction("prune", &first, |sets| {
            let mut sets = sets.into_iter();
            let (head, stored, _) = self.read_device(device_id, &mut sets)?;
            let Some(last) = head.next_seq().checked_sub(1) else {
                return Ok((Vec::new(), 0));
            };
            let begins = sets
                .next()
                .unwrap_or_default()
                .first()
                .and_then(|row| row.get(0))
                .and_then(|text| text.parse::<u64>().ok())
                .unwrap_or(0);
            let damage = |seq, detail| self.damage(device_id, seq, detail);
            let read = |seq| stored_op(self, device_id, &stored, seq);
            let Some(keep_from) =
                super::plan_prune(device_id, through_seq, through_id, last, begins, read, &damage)?
            else {
                return Ok((Vec::new(), 0));
            };
            let delete = bind(
                &format!("DELETE FROM {} WHERE device_id = $1 AND seq < $2", self.records),
                &[Literal::Text(device_id), Literal::Int(seq_value(keep_from))],
            );
            Ok((vec![delete], keep_from - begins))
        })
    }

    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
        let groups = group_by_device(ops)?;
        if groups.is_empty() {
            return Ok(PushReport::default());
        }
        // Devices in order (the map's): two pushes lock rows in the same order.
        let mut first = Vec::with_capacity(groups.len() * 4);
        for (device_id, device_ops) in &groups {
            let from = device_ops.iter().map(|op| op.seq).min().unwrap_or(0);
            let to = device_ops.iter().map(|op| op.seq).max().unwrap_or(0);
            first.extend(self.lock_and_read(device_id, from, to));
        }
        self.database.two_round_transaction("push to", &first, |sets| {
            let mut sets = sets.into_iter();
            let mut report = PushReport::default();
            let mut second = Vec::new();
            for (device_id, device_ops) in groups {
                let (head, stored, _) = self.read_device(device_id, &mut sets)?;
                let plan = plan_device_push(
                    &head,
                    |seq| stored_op(self, device_id, &stored, seq).map(|op| op.op_id),
                    device_ops,
                )?;
                report.already_present += plan.already_present;
                report.appended += plan.fresh.len();
                if !plan.fresh.is_empty() {
                    second.extend(self.store(device_id, &plan.fresh, plan.head.next_seq()));
                }
            }
            Ok((second, report))
        })
    }

    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError> {
        let mut devices = String::new();
        let mut froms = String::new();
        for (device_id, next_seq) in since.iter() {
            if !devices.is_empty() {
                devices.push(',');
                froms.push(',');
            }
            Literal::Text(device_id).write(&mut devices);
            Literal::Int(seq_value(next_seq)).write(&mut froms);
        }
        // One statement, one snapshot. Per device, from the record before the caller's frontier
        // (which anchors the chain of the first new one): an index range scan each.
        let statement = format!(
            "SELECT d.device_id, d.next_seq, r.seq, r.record, d.first_seq
             -- With where each log begins (after record 0 once pruned after a checkpoint): an
             -- index lookup per device, once (OFFSET 0 keeps the subquery from being flattened
             -- into one evaluation per record).
             FROM (SELECT e.device_id, e.next_seq,
                          (SELECT min(m.seq) FROM {records} AS m WHERE m.device_id = e.device_id) AS first_seq
                   FROM {devices_table} AS e OFFSET 0) AS d
             LEFT JOIN unnest(ARRAY[{devices}]::text[], ARRAY[{froms}]::bigint[]) AS f(device_id, from_seq)
                 ON f.device_id = d.device_id
             LEFT JOIN LATERAL (
                 SELECT seq, record FROM {records} AS r
                 WHERE r.device_id = d.device_id AND r.seq >= greatest(coalesce(f.from_seq, 0) - 1, 0)
                 ORDER BY r.seq
             ) AS r ON true
             WHERE d.next_seq > coalesce(f.from_seq, 0)
                -- Rows at or beyond both the stored length and the frontier (a length edited
                -- down, or to 0): read, so that they are reported as damage.
                OR EXISTS (SELECT 1 FROM {records} AS x
                           WHERE x.device_id = d.device_id AND x.seq >= greatest(d.next_seq, coalesce(f.from_seq, 0)))
             ORDER BY d.device_id COLLATE \"C\", r.seq",
            devices_table = self.devices,
            records = self.records
        );
        // Devices with records but no length row (deleted by hand): their records would be
        // invisible. A loose index scan over the records' device ids: O(devices).
        let orphans = format!(
            "WITH RECURSIVE ids AS (
                 (SELECT device_id FROM {records} ORDER BY device_id LIMIT 1)
                 UNION ALL
                 SELECT (SELECT r.device_id FROM {records} AS r WHERE r.device_id > ids.device_id
                         ORDER BY r.device_id LIMIT 1)
                 FROM ids WHERE ids.device_id IS NOT NULL
             )
             SELECT device_id FROM ids
             WHERE device_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM {devices_table} AS d WHERE d.device_id = ids.device_id)",
            devices_table = self.devices,
            records = self.records
        );
        let mut sets = self
            .database
            .read_rows("pull from", vec![statement, orphans])?
            .into_iter();
        let rows = sets.next().unwrap_or_default();
        let mut batch = PullBatch::default();
        for row in sets.next().unwrap_or_default() {
            let device_id = row.get(0).unwrap_or("");
            batch.problems.push(self.damage(
                device_id,
                0,
                "the device has records but no length (its row in the devices table was deleted)".to_owned(),
            ));
        }
        let mut index = 0;
        while index < rows.len() {
            let device_id = rows[index].get(0).unwrap_or("").to_owned();
            let end = rows[index..]
                .iter()
                .position(|row| row.get(0) != Some(device_id.as_str()))
                .map_or(rows.len(), |offset| index + offset);
            let stored = rows[index]
                .get(1)
                .and_then(|text| text.parse::<u64>().ok())
                .unwrap_or(0);
            let device_rows = rows[index..end]
                .iter()
                .filter(|row| row.get(2).is_some())
                .map(|row| {
                    (
                        row.get(2).and_then(|seq| seq.parse::<u64>().ok()),
                        row.get(3).map(str::as_bytes),
                    )
                });
            let first = rows[index].get(4).and_then(|text| text.parse::<u64>().ok());
            let damage = |seq, detail| self.damage(&device_id, seq, detail);
            let (ops, problem) = verify_pulled(
                &device_id,
                since.next_seq(&device_id),
                stored,
                first,
                device_rows,
                &damage,
            );
            batch.ops.extend(ops);
            batch.problems.extend(problem);
            index = end;
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
        let first = self.lock_and_read(device_id, since_seq, u64::MAX >> 1);
        self.database.two_round_transaction("append to", &first, |sets| {
            let mut sets = sets.into_iter();
            let (mut head, stored, begins) = self.read_device(device_id, &mut sets)?;
            // Records of the caller's that a prune removed since it read (another process of
            // the device appended them, a checkpoint covers them) are not handed over.
            let tail = (since_seq.max(begins)..head.next_seq())
                .map(|seq| stored_op(self, device_id, &stored, seq))
                .collect::<Result<Vec<_>, _>>()?;
            let made = make(&tail)?;
            for op in &made {
                head.accept(op)?;
            }
            let refs: Vec<&OpRecord> = made.iter().collect();
            let second = if refs.is_empty() {
                Vec::new()
            } else {
                self.store(device_id, &refs, head.next_seq())
            };
            Ok((second, Appended { tail, appended: made }))
        })
    }
}

/// Each checkpoint is a row of `relay_checkpoints` (its name, its upload, its size and number of
/// chunks) and its bytes in `relay_checkpoint_chunks`, keyed by the upload: the chunks are
/// stored first, then the row, in a statement of its own, so that a checkpoint is seen whole or
/// not at all, and two uploads of one name (two compactions of the same records, rule K4) never
/// mix their chunks. Grants: `SELECT` for the sites that start from them; `INSERT, DELETE` for
/// the role that compacts.
impl CheckpointStore for PostgresRelay {
    fn names(&self) -> Result<Vec<String>, RelayError> {
        let rows = self.database.read_rows(
            "list the checkpoints of",
            vec![format!("SELECT name FROM {}", self.checkpoints)],
        )?;
        Ok(rows
            .into_iter()
            .flatten()
            .filter_map(|row| row.get(0).map(str::to_owned))
            .collect())
    }

    fn download(&self, name: &str, to: &mut dyn std::io::Write) -> Result<bool, RelayError> {
        let header = self.database.read_rows(
            "read a checkpoint of",
            vec![bind(
                &format!(
                    "SELECT upload, bytes, chunks FROM {} WHERE name = $1",
                    self.checkpoints
                ),
                &[Literal::Text(name)],
            )],
        )?;
        let Some(row) = header.into_iter().flatten().next() else {
            return Ok(false);
        };
        let damaged = |detail: String| RelayError::Database {
            operation: "read a checkpoint of",
            message: format!("checkpoint {name} in {}: {detail}", self.checkpoints),
            may_have_applied: false,
            transient: false,
        };
        let upload = row.get(0).unwrap_or("").to_owned();
        let bytes = row.get(1).and_then(|text| text.parse::<u64>().ok()).unwrap_or(0);
        let chunks = row.get(2).and_then(|text| text.parse::<i64>().ok()).unwrap_or(0);
        let mut written = 0u64;
        let mut data = Vec::with_capacity(CHUNK_BYTES);
        let mut next = 0i64;
        while next < chunks {
            let end = chunks.min(next + CHUNKS_PER_READ);
            let rows = self.database.read_rows(
                "read a checkpoint of",
                vec![bind(
                    &format!(
                        "SELECT chunk, encode(data, 'hex') FROM {} WHERE upload = $1 AND chunk >= $2 AND chunk < $3 ORDER BY chunk",
                        self.chunks
                    ),
                    &[Literal::Text(&upload), Literal::Int(next), Literal::Int(end)],
                )],
            )?;
            for row in rows.into_iter().flatten() {
                let chunk = row.get(0).and_then(|text| text.parse::<i64>().ok());
                if chunk != Some(next) {
                    return self.gone_or(
                        name,
                        &upload,
                        damaged(format!("chunk {next} of {chunks} is missing")),
                    );
                }
                data.clear();
                if !crate::hex::decode_lower_hex_into(row.get(1).unwrap_or(""), &mut data) {
                    return Err(damaged(format!("chunk {next} is not hex")));
                }
                to.write_all(&data)
                    .map_err(|error| damaged(format!("cannot write the copy: {error}")))?;
                written += data.len() as u64;
                next += 1;
            }
            if next < end {
                return self.gone_or(
                    name,
                    &upload,
                    damaged(format!("chunk {next} of {chunks} is missing")),
                );
            }
        }
        if written != bytes {
            return Err(damaged(format!("its chunks hold {written} bytes, not {bytes}")));
        }
        Ok(true)
    }

    fn upload(&self, name: &str, path: &Path) -> Result<(), RelayError> {
        let mut file = std::fs::File::open(path).map_err(|error| unreadable(path, &error))?;
        let upload = self.new_upload(name)?;
        let (bytes, chunks) = self.upload_chunks(&upload, &mut file, path)?;
        // One of that name stored already is the same checkpoint (rule K4), or a damaged copy
        // of it: this upload replaces it, and its chunks go (a site reading them meanwhile
        // finds the checkpoint gone, `gone_or`, and reads the records this time). Its row is
        // locked from the first statement to the commit: a second upload of the name at once
        // waits, then replaces this one the same way.
        let literals = [
            Literal::Text(name),
            Literal::Text(&upload),
            Literal::Int(i64::try_from(bytes).unwrap_or(i64::MAX)),
            Literal::Int(chunks),
        ];
        self.database.write_rows(
            "store a checkpoint in",
            vec![
                bind(
                    &format!(
                        "DELETE FROM {chunks} WHERE upload <> $2
                         AND upload IN (SELECT upload FROM {checkpoints} WHERE name = $1 FOR UPDATE)",
                        checkpoints = self.checkpoints,
                        chunks = self.chunks
                    ),
                    &literals,
                ),
                bind(
                    &format!(
                        "INSERT INTO {} (name, upload, bytes, chunks) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (name) DO UPDATE
                         SET upload = excluded.upload, bytes = excluded.bytes, chunks = excluded.chunks",
                        self.checkpoints
                    ),
                    &literals,
                ),
            ],
        )?;
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<(), RelayError> {
        self.database.write_rows(
            "remove a checkpoint from",
            vec![bind(
                &format!(
                    "WITH gone AS (DELETE FROM {checkpoints} WHERE name = $1 RETURNING upload)
                     DELETE FROM {chunks} WHERE upload IN (SELECT upload FROM gone)",
                    checkpoints = self.checkpoints,
                    chunks = self.chunks
                ),
                &[Literal::Text(name)],
            )],
        )?;
        Ok(())
    }
}

impl PostgresRelay {
    /// A download of `upload` that found a chunk missing: `false` when the checkpoint was
    /// removed or stored again meanwhile (another compaction), else the damage.
    fn gone_or(&self, name: &str, upload: &str, damage: RelayError) -> Result<bool, RelayError> {
        let still = self.database.read_rows(
            "read a checkpoint of",
            vec![bind(
                &format!(
                    "SELECT 1 FROM {} WHERE name = $1 AND upload = $2",
                    self.checkpoints
                ),
                &[Literal::Text(name), Literal::Text(upload)],
            )],
        )?;
        if still.into_iter().flatten().next().is_some() {
            Err(damage)
        } else {
            Ok(false)
        }
    }
}

impl PostgresRelay {
    /// A name for a new upload of checkpoint `name` (the server's: a second upload of the name
    /// by another compaction has another), after removing the chunks of uploads killed an hour
    /// ago or more, which no checkpoint names.
    fn new_upload(&self, name: &str) -> Result<String, RelayError> {
        let rows = self.database.write_rows(
            "store a checkpoint in",
            vec![
                format!(
                    "DELETE FROM {chunks} AS c WHERE c.written_at < now() - interval '1 hour'
                     AND NOT EXISTS (SELECT 1 FROM {checkpoints} AS k WHERE k.upload = c.upload)",
                    chunks = self.chunks,
                    checkpoints = self.checkpoints
                ),
                "SELECT md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text)".to_owned(),
            ],
        )?;
        rows.into_iter()
            .nth(1)
            .and_then(|rows| rows.into_iter().next())
            .and_then(|row| row.get(0).map(|id| format!("{name}/{id}")))
            .ok_or_else(|| RelayError::Database {
                operation: "store a checkpoint in",
                message: "the server named no upload".to_owned(),
                may_have_applied: false,
                transient: false,
            })
    }

    /// Stores the file's bytes as chunks of `upload`; returns how many bytes and chunks.
    fn upload_chunks(
        &self,
        upload: &str,
        file: &mut std::fs::File,
        path: &Path,
    ) -> Result<(u64, i64), RelayError> {
        let mut buffer = vec![0u8; CHUNK_BYTES];
        let mut bytes = 0u64;
        let mut chunks = 0i64;
        loop {
            let mut filled = 0;
            while filled < buffer.len() {
                match file.read(&mut buffer[filled..]) {
                    Ok(0) => break,
                    Ok(read) => filled += read,
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(unreadable(path, &error)),
                }
            }
            if filled == 0 {
                break;
            }
            let mut hex = String::with_capacity(filled * 2);
            crate::hex::push_lower_hex(&mut hex, &buffer[..filled]);
            self.database.write_rows(
                "store a checkpoint in",
                vec![bind(
                    &format!(
                        "INSERT INTO {} (upload, chunk, data) VALUES ($1, $2, decode($3, 'hex'))",
                        self.chunks
                    ),
                    &[Literal::Text(upload), Literal::Int(chunks), Literal::Text(&hex)],
                )],
            )?;
            bytes += filled as u64;
            chunks += 1;
        }
        Ok((bytes, chunks))
    }
}

/// A checkpoint file that cannot be read, as the relay reports it.
fn unreadable(path: &Path, error: &std::io::Error) -> RelayError {
    RelayError::Database {
        operation: "store a checkpoint in",
        message: format!("cannot read {}: {error}", path.display()),
        may_have_applied: false,
        transient: false,
    }
}
