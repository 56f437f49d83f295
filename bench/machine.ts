/** The machine a benchmark ran on, for the report: numbers mean nothing without it. */
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
}

/** Reads the machine facts now. */
export function describeMachine(): MachineInfo {
  return {
    cpuModel: cpus()[0]?.model.trim() ?? 'unknown',
    cores: availableParallelism(),
    node: process.version,
    os: `${type()} ${release()}`,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    pinned: canPin(),
    loadCores: loadCores().list,
    loadAverage: loadavg()[0] ?? Number.NaN,
  }
}
