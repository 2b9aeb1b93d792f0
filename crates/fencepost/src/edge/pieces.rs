//! Work cut into pieces that this thread and helper threads take in turn: decoding a relay's
//! lines (`relay/fs/read.rs`) and opening a protected ledger's records (`ledger/state.rs`).
//! A thread that gets less time (the fold runs beside them) takes fewer pieces; the results
//! come back in order.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// How many threads this process may run at once (read once).
pub(crate) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// `work` over `0..len` cut into ranges of `piece` items, done by this thread and `helpers`
/// scoped threads: the results, one vector per range, in order.
pub(crate) fn in_pieces<U: Send + Sync>(
    len: usize,
    piece: usize,
    helpers: usize,
    work: impl Fn(Range<usize>) -> Vec<U> + Sync,
) -> Vec<Vec<U>> {
    let piece = piece.max(1);
    let ranges: Vec<Range<usize>> = (0..len)
        .step_by(piece)
        .map(|start| start..(start + piece).min(len))
        .collect();
    let done: Vec<OnceLock<Vec<U>>> = ranges.iter().map(|_| OnceLock::new()).collect();
    let next = AtomicUsize::new(0);
    let take = || {
        while let Some(range) = ranges.get(next.fetch_add(1, Ordering::Relaxed)) {
            let index = range.start / piece;
            let _ = done[index].set(work(range.clone()));
        }
    };
    std::thread::scope(|scope| {
        let spawned: Vec<_> = (0..helpers).map(|_| scope.spawn(take)).collect();
        take();
        for helper in spawned {
            if let Err(panic) = helper.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    done.into_iter()
        .zip(ranges)
        // Every range was taken and done before the helpers were joined; one that were not
        // would be done here rather than lost.
        .map(|(result, range)| result.into_inner().unwrap_or_else(|| work(range)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_done_once_and_the_results_come_back_in_order() {
        let done = AtomicUsize::new(0);
        let pieces = in_pieces(1_000, 64, 2, |range| {
            done.fetch_add(range.len(), Ordering::Relaxed);
            range.map(|item| item * 2).collect()
        });
        assert_eq!(done.load(Ordering::Relaxed), 1_000);
        let flat: Vec<usize> = pieces.into_iter().flatten().collect();
        assert_eq!(flat, (0..1_000).map(|item| item * 2).collect::<Vec<_>>());
        assert!(in_pieces(0, 64, 1, |range| range.collect::<Vec<_>>()).is_empty());
    }
}
