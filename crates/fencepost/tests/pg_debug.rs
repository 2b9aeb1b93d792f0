#[path = "postgres.rs"]
#[allow(dead_code, unused_imports, unused_macros)]
mod pg;
use fencepost::conformance::{check_history, record_thread_history, Event, HistoryConfig, LeaseOp, Outcome, HISTORY_START_MS};

#[test]
#[ignore]
fn debug_history() {
    let harness = pg::PostgresHarnessForDebug::new();
    for seed in 0..20 {
        let events = record_thread_history(&harness, &HistoryConfig::default(), seed);
        if check_history(events.clone()) { continue; }
        let advances: Vec<(u64, u64)> = {
            let calls: Vec<u64> = events.iter().filter(|e| matches!(e.op, LeaseOp::Advance{..}) && !e.is_return).map(|e| e.at).collect();
            let rets: Vec<u64> = events.iter().filter(|e| matches!(e.op, LeaseOp::Advance{..}) && e.is_return).map(|e| e.at).collect();
            calls.into_iter().zip(rets).collect()
        };
        let lower = |t: u64| HISTORY_START_MS + 7 * advances.iter().filter(|(_, r)| *r < t).count() as u64;
        let upper = |t: u64| HISTORY_START_MS + 7 * advances.iter().filter(|(c, _)| *c < t).count() as u64;
        // Grants: (call, return, epoch).
        let mut grant_calls: std::collections::HashMap<usize, u64> = Default::default();
        let mut grants: Vec<(u64, u64, u64)> = Vec::new();
        let mut sorted0 = events.clone(); sorted0.sort_by_key(|e| (e.at, e.is_return));
        for e in &sorted0 {
            if !e.is_return { grant_calls.insert(e.process, e.at); continue; }
            if let LeaseOp::Acquire { outcome: Outcome::Lease { epoch, .. }, .. } = &e.op { grants.push((grant_calls[&e.process], e.at, *epoch)); }
        }
        let mut epochs: Vec<u64> = grants.iter().map(|g| g.2).collect(); epochs.sort();
        println!("grants: {} epochs {:?}", grants.len(), epochs);
        let min_epoch = |t: u64| grants.iter().filter(|g| g.1 < t).map(|g| g.2).max().unwrap_or(0);
        let max_epoch = |t: u64| grants.iter().filter(|g| g.0 < t).map(|g| g.2).max().unwrap_or(0);
        let mut calls: std::collections::HashMap<usize, u64> = Default::default();
        let mut sorted = events.clone(); sorted.sort_by_key(|e| (e.at, e.is_return));
        let mut bad = 0;
        for e in &sorted {
            if !e.is_return { calls.insert(e.process, e.at); continue; }
            let c = calls[&e.process];
            let implied = match &e.op {
                LeaseOp::Acquire { outcome: Outcome::Lease { expires_at_ms, .. }, ttl_ms, .. } => Some(expires_at_ms - ttl_ms),
                LeaseOp::Renew { outcome: Outcome::Lease { expires_at_ms, .. }, ttl_ms, .. } => Some(expires_at_ms - ttl_ms),
                _ => None,
            };
            let reported = match &e.op {
                LeaseOp::Acquire { outcome: Outcome::Held { epoch, .. }, .. } | LeaseOp::Current { outcome: Outcome::Lease { epoch, .. } } => Some(*epoch),
                LeaseOp::Renew { outcome: Outcome::Lost { current_epoch }, .. } | LeaseOp::Release { outcome: Outcome::Lost { current_epoch }, .. } => Some(*current_epoch),
                _ => None,
            };
            if let Some(epoch) = reported {
                if epoch < min_epoch(c) || epoch > max_epoch(e.at) { bad += 1; println!("epoch {epoch} outside [{}, {}] for p{} [{}..{}] {:?}", min_epoch(c), max_epoch(e.at), e.process, c, e.at, e.op); }
            }
            if let LeaseOp::Acquire { outcome: Outcome::Held { expires_at_ms, device, epoch }, .. } = &e.op {
                if lower(c) >= *expires_at_ms { bad += 1; println!("held by d{device} e{epoch} until {expires_at_ms}, but the clock was already {} at the call; p{} [{}..{}]", lower(c), e.process, c, e.at); }
            }
            if let Some(now) = implied {
                if now < lower(c) || now > upper(e.at) { bad += 1; println!("clock {now} outside [{}, {}] for p{} [{}..{}] {:?}", lower(c), upper(e.at), e.process, c, e.at, e.op); }
            }
        }
        panic!("seed {seed}: {bad} operations with an impossible clock");
    }
}
