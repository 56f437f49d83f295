/**
 * Loads the framework adapters by their public names, tolerating the ones that do not exist
 * yet: the benchmarks and the robustness tests cover whichever adapters the source tree has,
 * and pick up a new one (`src/adapters/<name>/index.ts`) without a change here.
 *
 * In the bench bundles, a missing adapter resolves to a stub exporting `__unavailable`
 * (see `build.ts`); under vitest or tsx, the import itself fails. Both give `undefined` here.
 */
import type { TrustProxy } from 'mcp-dispatch'
import type { Dispatcher, DispatcherOptions } from 'mcp-dispatch'

/** What every adapter's `mcpDispatch` accepts. */
export interface AnyAdapterOptions {
  dispatcher: Dispatcher | DispatcherOptions
  trustProxy?: TrustProxy
  onError?: (error: unknown, context: string) => void
}

/** The Express adapter's surface used here: `app.use(mcpDispatch(options))`. */
export interface ExpressAdapter {
  mcpDispatch(options: AnyAdapterOptions): (req: any, res: any, next: (error?: unknown) => void) => void
  routeByVersion?: (routes: any) => (req: any, res: any, next: (error?: unknown) => void) => void
}

/** The Fastify adapter's surface used here: `await app.register(mcpDispatch(options))`. */
export interface FastifyAdapter {
  mcpDispatch(options: AnyAdapterOptions): any
  routeByVersion?: (routes: any) => (request: any, reply: any) => Promise<unknown>
  frameworkErrors?: (error: any, request: any, reply: any) => void
}

/** Adapters loaded from the source tree; `undefined` for one that is not there. */
export interface LoadedAdapters {
  express: ExpressAdapter | undefined
  fastify: FastifyAdapter | undefined
  /** Why an adapter is missing, by name. */
  missing: Record<string, string>
}

function usable<T>(name: string, mod: unknown, missing: Record<string, string>): T | undefined {
  const m = mod as { __unavailable?: string; mcpDispatch?: unknown } | undefined
  if (!m || typeof m.__unavailable === 'string' || typeof m.mcpDispatch !== 'function') {
    missing[name] = m?.__unavailable ?? `src/adapters/${name}/index.ts does not export mcpDispatch`
    return undefined
  }
  return m as T
}

/** Imports `mcp-dispatch/express` and `mcp-dispatch/fastify` when they exist. */
export async function loadAdapters(): Promise<LoadedAdapters> {
  const missing: Record<string, string> = {}
  // The `as string` keeps TypeScript from requiring the modules at compile time; bundlers
  // and vitest still see literal specifiers.
  const express = await import('mcp-dispatch/express' as string).catch((error: Error) => {
    missing.express = `adapter not available (${error.message.split('\n')[0]})`
    return undefined
  })
  const fastify = await import('mcp-dispatch/fastify' as string).catch((error: Error) => {
    missing.fastify = `adapter not available (${error.message.split('\n')[0]})`
    return undefined
  })
  return {
    express: express === undefined ? undefined : usable<ExpressAdapter>('express', express, missing),
    fastify: fastify === undefined ? undefined : usable<FastifyAdapter>('fastify', fastify, missing),
    missing,
  }
}
