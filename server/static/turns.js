// Reads that may answer out of order: the server answers from a pool of threads, and on a loaded
// machine any await can take seconds. Each read takes a turn; its answer is acted on only if no
// later turn was (or, for `latest`, none was taken since).

export function turns() {
  let taken = 0;
  let shown = 0;
  return {
    take: () => ++taken,
    // Whether the answer of turn `mine` may be shown, marking it shown if so. A turn answered
    // while a later one is still under way is shown: a steady stream of reads still shows.
    show(mine) {
      if (mine < shown) return false;
      shown = mine;
      return true;
    },
    // Whether `mine` is still the latest turn taken.
    latest: (mine) => mine === taken,
  };
}
