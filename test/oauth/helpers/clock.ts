/** A manual clock: starts at the real time and moves only when a test says so. */
export interface ManualClock {
  (): number
  advance(ms: number): void
}

export function createManualClock(start = Date.now()): ManualClock {
  let at = start
  return Object.assign(() => at, {
    advance(ms: number) {
      at += ms
    },
  })
}

/**
 * Timers that never fire by themselves: a per-call timeout set with them fires only when the
 * test calls `fireAll()` (e.g. when the slow upstream has the request in hand).
 */
export function createManualTimers(): {
  setTimeout(callback: () => void, ms: number): unknown
  clearTimeout(handle: unknown): void
  fireAll(): number
  readonly pending: number
} {
  const pending = new Set<() => void>()
  return {
    setTimeout(callback) {
      const handle = () => callback()
      pending.add(handle)
      return handle
    },
    clearTimeout(handle) {
      pending.delete(handle as () => void)
    },
    fireAll() {
      const due = [...pending]
      pending.clear()
      for (const fire of due) fire()
      return due.length
    },
    get pending() {
      return pending.size
    },
  }
}

/** A `sleep` that returns at once and records what it was asked to wait. */
export function createRecordingSleep(clock?: ManualClock): ((ms: number) => Promise<void>) & { delays: number[] } {
  const delays: number[] = []
  const sleep = async (ms: number) => {
    delays.push(ms)
    clock?.advance(ms)
  }
  return Object.assign(sleep, { delays })
}
