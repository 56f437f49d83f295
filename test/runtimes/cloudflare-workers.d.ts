/** The two names of workerd's `cloudflare:workers` module that `worker.ts` uses. */
declare module 'cloudflare:workers' {
  /** The Worker's bindings, readable in global scope. */
  export const env: Record<string, unknown>
  /** Extends the current request's life until `promise` settles (`ctx.waitUntil`, without the `ctx`). */
  export function waitUntil(promise: Promise<unknown>): void
}
