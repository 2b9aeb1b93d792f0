//! The damage the relay reported, as the [`Ledger`] keeps it: what it refuses, what an operator
//! accepted, and what is recomputed after each reading.

use super::*;

/// What a database ledger that holds fewer records than a site read before did
/// ([`ProblemKind::WentBack`](crate::relay::ProblemKind::WentBack)).
pub(super) const WENT_BACK: &str = "this database went back (restored from a dump or an older copy, or failed over to a standby that lagged) and forgot records this site read, commits among them";

/// What a database ledger that holds other records than a site read before did.
pub(super) const WENT_BACK_WRITTEN: &str = "this database went back (restored from a dump or an older copy, or failed over to a standby that lagged), forgot records this site read, commits among them, and was written since";

impl Ledger {
    /// Every problem the last pull reported (damage, incomplete last lines, ignored files), and
    /// the devices found with fewer records than this site saw before.
    pub fn problems(&self) -> &[RelayProblem] {
        &self.problems
    }

    /// The damage that makes this ledger incomplete (rule R1): problems of kind
    /// [`ProblemKind::Damage`](crate::relay::ProblemKind::Damage) whose device (or file) was not
    /// accepted with [`accept_damage`](Self::accept_damage). [`dispatch`](crate::dispatch::dispatch) refuses to run anything
    /// while there is any: a run that the damaged device committed would look new.
    pub fn damage(&self) -> Vec<&RelayProblem> {
        self.problems
            .iter()
            .filter(|problem| problem.is_damage() && !self.is_accepted(problem))
            .collect()
    }

    pub(super) fn is_accepted(&self, problem: &RelayProblem) -> bool {
        // A snapshot that cannot be read is not the ledger's damage: nothing to accept (the next
        // process rebuilds it).
        self.snapshot_damage.as_ref() != Some(problem)
            && self.checkpoint_damage.as_ref() != Some(problem)
            && self.accepted.iter().any(|device| names(problem, device))
    }

    /// Folds into the view every run the snapshot holds committed, as its commit alone (the
    /// records that show it may not be here): a caller that accepts the damage runs none of
    /// them again.
    pub(super) fn keep_commits_of_snapshot(&mut self) {
        let Some(snapshot) = &self.snapshot else {
            return;
        };
        let state = &mut self.view.state;
        let kept = snapshot.store.for_each_run(|agent, run, summary| {
            if let Some(commit) = summary.committed() {
                let commit = crate::fold::RunSummary {
                    best: commit.clone(),
                    committed_below_failed: None,
                };
                state.merge_summary(agent, run, &commit);
            }
        });
        if let Err(error) = kept {
            tracing::warn!(%error, "cannot read the commits of the checkpoint this ledger does not match; they count only once its files reach it");
        }
    }

    /// Why this ledger's [snapshot](LedgerOptions::snapshot) could not be read, if it could not
    /// (a run's stored state was lost or changed): part of [`damage`](Self::damage) until the
    /// process ends, and cannot be accepted; the snapshot was removed, so the next open reads the
    /// whole ledger and rebuilds it.
    pub fn snapshot_failure(&self) -> Option<&RelayProblem> {
        self.snapshot_damage.as_ref()
    }

    /// Accepts the damage of `device` (a device id, or a device file's name): [`dispatch`](crate::dispatch::dispatch) no
    /// longer refuses because of it, in this ledger. The operator's decision is recorded in this
    /// device's log (surface `log/fencepost.accept-damaged`, with the problems seen), so it can be
    /// audited. Returns how many current problems it covers; when none, nothing is recorded or
    /// accepted.
    ///
    /// # Errors
    /// [`LedgerError::Relay`] when the record cannot be stored (nothing is accepted then).
    pub fn accept_damage(&mut self, device: &str) -> Result<usize, LedgerError> {
        let mut accepted = self.accepted.clone();
        accepted.insert(device.to_owned());
        let covered: Vec<String> = self
            .problems
            .iter()
            .filter(|problem| self.snapshot_damage.as_ref() != Some(*problem))
            .filter(|problem| self.checkpoint_damage.as_ref() != Some(*problem))
            .filter(|problem| problem.is_damage() && names(problem, device))
            .map(ToString::to_string)
            .collect();
        if covered.is_empty() {
            return Ok(0); // nothing to accept, nothing recorded
        }
        self.append_now(
            Surface::log("fencepost.accept-damaged"),
            serde_json::json!({"device": device, "problems": covered}),
        )?;
        self.accepted = accepted;
        Ok(covered.len())
    }

    /// Accepts that the records of `device` that the agent's earlier holders published
    /// (`published`, from [`LeaseCoordinator::published_frontier`](crate::lease::LeaseCoordinator::published_frontier))
    /// and that this ledger lacks are lost for good (a host whose ledger was never shared, a
    /// disk that died): [`behind`](Self::behind) no longer waits for *those* records, in this
    /// ledger, so the runs they settled may run again. Records of the device published later
    /// (beyond `published`) are waited for as any others. The decision is recorded in this
    /// device's log (surface `log/fencepost.accept-missing`, with the records missing). Returns
    /// how many records it covers; when none (the ledger lacks nothing of `device`), nothing is
    /// recorded or accepted.
    ///
    /// # Errors
    /// [`LedgerError::Relay`] when the record cannot be stored (nothing is accepted then).
    pub fn accept_missing(&mut self, device: &str, published: &Frontier) -> Result<u64, LedgerError> {
        let Some(missing) = self
            .view
            .frontier
            .lacking(published)
            .into_iter()
            .find(|(lacking, _, _)| lacking == device)
        else {
            return Ok(0);
        };
        let (_, has, needs) = missing;
        self.append_now(
            Surface::log("fencepost.accept-missing"),
            serde_json::json!({"device": device, "has": has, "published": needs}),
        )?;
        let waived = self.waived.entry(device.to_owned()).or_insert(0);
        *waived = (*waived).max(needs);
        Ok(needs - has)
    }

    /// Takes the problems of a pull whose records were absorbed.
    pub(super) fn take_problems(&mut self, problems: Vec<RelayProblem>) -> Result<(), LedgerError> {
        for problem in problems.iter().filter(|problem| problem.is_damage()) {
            tracing::debug!(%problem, "the ledger is damaged");
        }
        self.relay_problems = problems;
        self.recompute_problems();
        self.prove_equivocations();
        self.save_seen()
    }

    /// The problems: the last pull's, the records found replaced (for good: a replaced record
    /// stays damage, even once the file has grown past it), and the devices with fewer records
    /// than the seen file remembers.
    pub(super) fn recompute_problems(&mut self) {
        self.problems = self.relay_problems.clone();
        self.problems.extend(self.replaced.iter().cloned());
        self.problems.extend(self.view.rejected().cloned());
        self.problems.extend(self.snapshot_damage.iter().cloned());
        self.problems.extend(self.checkpoint_damage.iter().cloned());
        let snapshot_marks = self
            .snapshot_marks
            .iter()
            .map(|mark| (mark, "this site's snapshot".to_owned(), "read"));
        let checkpoint_marks = self.checkpoint_marks.iter().flat_map(|(file, marks)| {
            let name = file
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
            marks
                .iter()
                .map(move |mark| (mark, format!("the checkpoint {name}"), "covers"))
        });
        let mut found = Vec::new();
        for (mark, whose, verb) in snapshot_marks.chain(checkpoint_marks) {
            let device = &mark.device_id;
            if self
                .problems
                .iter()
                .chain(&found)
                .any(|problem: &RelayProblem| problem.device_id.as_ref() == Some(device))
            {
                continue; // said already
            }
            let has = self.view.frontier.next_seq(device);
            let here = self.view.last_id_known(device, mark.next_seq);
            let mut kind = crate::relay::ProblemKind::Damage;
            let detail = if has < mark.next_seq && self.relay.is_database() {
                kind = crate::relay::ProblemKind::WentBack;
                format!(
                    "{whose} {verb} {} records of this device, the database has {has}: {WENT_BACK}",
                    mark.next_seq
                )
            } else if has < mark.next_seq {
                format!(
                    "{whose} {verb} {} records of this device, the ledger here has {has}: a synced folder that has not brought them yet (run again once it has), or a file that shrank, was replaced or lost records (restore it from a copy)",
                    mark.next_seq
                )
            } else if let (Some(here), Some((last_op_id, _, _))) = (here, mark.last) {
                if here == last_op_id {
                    continue;
                }
                let cause;
                (kind, cause) = self.replaced_cause();
                format!(
                    "record {} is {here}, but {whose} {verb} {last_op_id} there: {cause}",
                    mark.next_seq - 1
                )
            } else {
                continue;
            };
            found.push(RelayProblem {
                kind,
                device_id: Some(device.clone()),
                file: None,
                line_number: None,
                detail,
            });
        }
        self.problems.extend(found);
        let mut suspects = Vec::new();
        if let Some(seen) = &self.seen {
            for (device, mark) in &seen.devices {
                let has = self.view.frontier.next_seq(device);
                // A file that begins after what this reading has (pruned while it read, or
                // after a checkpoint not here yet) is said already, and its records were not
                // handed over: what the site saw is checked once they are (found by the test
                // `k6_concurrent_prunes_on_one_folder_refuse_no_run_and_no_compaction`: this
                // second problem made the gap look like other damage, which is not read again).
                let gap = self.problems.iter().any(|problem| {
                    problem.kind == crate::relay::ProblemKind::Pruned
                        && problem.device_id.as_ref() == Some(device)
                });
                if gap && has < mark.next_seq {
                    continue;
                }
                let mut kind = crate::relay::ProblemKind::Damage;
                let detail = if has < mark.next_seq && self.relay.is_database() {
                    kind = crate::relay::ProblemKind::WentBack;
                    format!(
                        "this site has seen {} records of this device, the database has {has}: {WENT_BACK}",
                        mark.next_seq
                    )
                } else if has < mark.next_seq {
                    format!(
                        "this site has seen {} records of this device, the ledger now has {has}: its file shrank, was replaced or lost records (restore it from a copy)",
                        mark.next_seq
                    )
                } else {
                    // The record seen last, where this view knows it without reading it again:
                    // a file replaced by another log's pruned one (with that log's checkpoint)
                    // holds another there (found by an adversarial test: refused once, then
                    // run on, since the record was never read again to be compared).
                    let here = self.view.last_id_known(device, mark.next_seq);
                    let said = self
                        .problems
                        .iter()
                        .any(|problem| problem.device_id.as_ref() == Some(device));
                    match here {
                        Some(here) if here != mark.last_op_id && !said => {
                            let cause;
                            (kind, cause) = self.replaced_cause();
                            suspects.push((device.clone(), mark.clone()));
                            format!(
                                "record {} is {here}, but this site saw {} there: {cause}",
                                mark.next_seq - 1,
                                mark.last_op_id
                            )
                        }
                        _ => continue,
                    }
                };
                self.problems.push(RelayProblem {
                    kind,
                    device_id: Some(device.clone()),
                    file: None,
                    line_number: None,
                    detail,
                });
            }
        }
        self.suspects.extend(suspects);
    }

    /// Why a device holds another record where this site saw one, and how serious it is: in a
    /// database, it went back and was written since
    /// ([`ProblemKind::WentBack`](crate::relay::ProblemKind::WentBack)); else its file was
    /// replaced (damage).
    pub(super) fn replaced_cause(&self) -> (crate::relay::ProblemKind, &'static str) {
        if self.relay.is_database() {
            (crate::relay::ProblemKind::WentBack, WENT_BACK_WRITTEN)
        } else {
            (
                crate::relay::ProblemKind::Damage,
                "the file was replaced (restore it from a copy)",
            )
        }
    }
}

/// Whether `problem` concerns `device` (a device id, or the name of its file in the relay).
pub(super) fn names(problem: &RelayProblem, device: &str) -> bool {
    let file_name = problem
        .file
        .as_ref()
        .and_then(|file| file.file_name())
        .map(|name| name.to_string_lossy().into_owned());
    match problem.device_id.as_deref() {
        // A device's damage is accepted by its id, and only by it.
        Some(id) => id == device,
        // A file that says nothing of its device (unreadable, garbage from its first line): by the
        // file's name, or by the id whose file it is.
        None => {
            file_name.is_some_and(|name| name == device || name == crate::relay::device_file_name(device))
        }
    }
}
