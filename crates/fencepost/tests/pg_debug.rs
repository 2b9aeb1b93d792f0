#[path = "postgres.rs"]
#[allow(dead_code, unused_imports, unused_macros)]
mod pg;
use fencepost::conformance::{check_history, record_thread_history, HistoryConfig, Event};
#[test]
#[ignore]
fn debug_history() {
    let harness = pg::PostgresHarnessForDebug::new();
    for seed in 12..13 {
        let mut events = record_thread_history(&harness, &HistoryConfig::default(), seed);
        if check_history(events.clone()) { continue; }
        events.sort_by_key(|e| (e.at, e.is_return));
        let mut lo = 0; 
        for k in 1..=events.len() {
            let prefix: Vec<Event> = events[..k].iter().cloned().collect();
            let completed: Vec<Event> = prefix.iter().filter(|e| !e.is_return && prefix.iter().any(|r| r.is_return && r.process == e.process && r.op == e.op && r.at > e.at) || e.is_return).cloned().collect();
            if !check_history(completed) { lo = k; break; }
        }
        for e in &events[lo.saturating_sub(60)..(lo+6).min(events.len())] { println!("{} p{} {} {:?}", e.at, e.process, if e.is_return {"RET"} else {"CALL"}, e.op); }
        panic!("seed {seed} fails at {lo}");
    }
}
