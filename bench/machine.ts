/** The machine a benchmark ran on, for the report: numbers mean nothing without it. */
import { readFileSync } from 'node:fs'
import { availableParallelism, cpus, loadavg, release, totalmem, type } from 'node:os'
import { canPin, loadCores } from './processes.js'

/** Machine facts recorded with every result. */
export interface MachineInfo {
  readonly cpuModel: string
  /** Cores this process may use (`nproc`). */
  readonly cores: number
  readonly node: string
  readonly os: string
  readonly memoryGiB: number
  /** Whether server and load generator were pinned to separate cores. */
  readonly pinned: boolean
  /** Cores of the load generator (`1`, `1-4`). */
  readonly loadCores: string
  /** 1-minute load average when the run started: a busy machine gives noisy numbers. */
  readonly loadAverage: number
  /**
   * How an idle core waits (Linux): the cpuidle driver, and for a virtual machine's `haltpoll`
   * driver how long an idle core polls before it halts. Absent where it cannot be read.
   */
  readonly idle?: { readonly driver: string; readonly haltPollNs?: number }
}

/**
 * Linux's cpuidle driver and, for `haltpoll` (a KVM guest's), `guest_halt_poll_ns`: with 0 an
 * idle core halts at once, and waking it (the load generator, when a response arrives) costs
 * the waker a VM exit.
 */
function readIdle(): MachineInfo['idle'] {
  const read = (path: string) => {
    try {
      return readFileSync(path, 'utf8').trim()
    } catch {
      return undefined
    }
  }
  const driver = read('/sys/devices/system/cpu/cpuidle/current_driver')
  if (driver === undefined || driver === '') return undefined
  const poll = driver === 'haltpoll' ? read('/sys/module/haltpoll/parameters/guest_halt_poll_ns') : undefined
  const haltPollNs = poll === undefined || !/^\d+$/.test(poll) ? undefined : Number(poll)
  return haltPollNs === undefined ? { driver } : { driver, haltPollNs }
}

/** Reads the machine facts now. */
export function describeMachine(): MachineInfo {
  const idle = readIdle()
  return {
    cpuModel: cpus()[0]?.model.trim() ?? 'unknown',
    cores: availableParallelism(),
    node: process.version,
    os: `${type()} ${release()}`,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    pinned: canPin(),
    loadCores: loadCores().list,
    loadAverage: loadavg()[0] ?? Number.NaN,
    ...(idle && { idle }),
  }
}
