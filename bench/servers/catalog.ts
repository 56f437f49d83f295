/**
 * The HTTP servers of the benchmark, by id: for each framework, the bare handler, the same
 * handler behind our adapter with the full pipeline, and the anchor chain (the framework's
 * usual auth and rate-limit middleware). Every one answers the same fixed `tools/list` result
 * to `POST /v1`.
 */

/** A framework group; ratios are taken to the group's bare server. */
export type Framework = 'fastify' | 'express' | 'hono'
/** What sits in front of the handler. */
export type Stack = 'bare' | 'dispatch' | 'anchor'

/** One benchmarked server. */
export interface ServerEntry {
  readonly id: `${Framework}-${Stack}`
  readonly framework: Framework
  readonly stack: Stack
  /** How the report names it. */
  readonly label: string
}

export const FRAMEWORKS: readonly Framework[] = ['fastify', 'express', 'hono']

export const SERVERS: readonly ServerEntry[] = [
  { id: 'fastify-bare', framework: 'fastify', stack: 'bare', label: 'bare Fastify' },
  { id: 'fastify-dispatch', framework: 'fastify', stack: 'dispatch', label: 'Fastify + mcp-dispatch/fastify (full pipeline)' },
  { id: 'fastify-anchor', framework: 'fastify', stack: 'anchor', label: 'Fastify + @fastify/rate-limit + bearer check' },
  { id: 'express-bare', framework: 'express', stack: 'bare', label: 'bare Express' },
  { id: 'express-dispatch', framework: 'express', stack: 'dispatch', label: 'Express + mcp-dispatch/express (full pipeline)' },
  {
    id: 'express-anchor',
    framework: 'express',
    stack: 'anchor',
    label: 'Express + SDK requireBearerAuth + express-rate-limit',
  },
  { id: 'hono-bare', framework: 'hono', stack: 'bare', label: 'bare Hono (@hono/node-server)' },
  { id: 'hono-dispatch', framework: 'hono', stack: 'dispatch', label: 'Hono + mcp-dispatch/web (full pipeline)' },
  { id: 'hono-anchor', framework: 'hono', stack: 'anchor', label: 'Hono + hono/bearer-auth + hono-rate-limiter' },
]

/** Messages a server process sends to the orchestrator over IPC. */
export type ServerMessage =
  | { type: 'listening'; port: number; token: string; hostname: string }
  | { type: 'unavailable'; reason: string }
  | {
      type: 'stats'
      decisions: number
      storeCalls: number
      byMethod: Record<string, number>
      /** `process.cpuUsage()` user + system, µs: CPU per request is robust to a starved client. */
      cpuMicros: number
    }

/** Messages the orchestrator sends to a server process. */
export type OrchestratorMessage = { type: 'stats' } | { type: 'close' }
