/**
 * Holds this process's event loop for `ms` (a busy wait): what a long garbage collection, a
 * synchronous parse of a large body or a resumed VM does to a server. Nothing is read from a
 * socket, and no timer runs, until it returns.
 */
export function holdEventLoop(ms: number): void {
  const end = performance.now() + ms
  while (performance.now() < end) {
    // busy
  }
}
