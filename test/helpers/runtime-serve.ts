/**
 * A fetch handler served by Bun (`Bun.serve`) or Deno (`Deno.serve`) on 127.0.0.1: the part the
 * runtime servers (`test/runtimes/server.ts`, `test/runtimes/token-api-audit-server.ts`) share.
 * It prints one JSON line (`{ port }`) once it listens (what `spawnServing` waits for), and serves
 * until it is killed. Nothing here imports: it runs as it is under both runtimes.
 */

/** A platform's handler: the request and the client's address as the runtime tells it. */
export type RuntimeHandler = (request: Request, clientAddress: string | undefined) => Promise<Response>

interface Runtimes {
  Bun?: {
    serve(options: {
      port: number
      hostname: string
      fetch(request: Request, server: { requestIP(request: Request): { address: string } | null }): Promise<Response>
    }): { port: number }
  }
  Deno?: {
    args: string[]
    serve(
      options: { port: number; hostname: string; onListen(address: { port: number }): void },
      handler: (request: Request, info: { remoteAddr: { hostname: string } }) => Promise<Response>,
    ): unknown
  }
  process?: { argv: string[] }
}
const runtime = globalThis as Runtimes

/** The arguments given the script after its path, under Bun or Deno. */
export function runtimeArgs(): string[] {
  return runtime.Deno ? runtime.Deno.args : runtime.process!.argv.slice(2)
}

/**
 * Serves `handler` at `port` (0: one the system picks) under the runtime the script runs in and
 * prints `{ port }` once it listens; `script` names it in the error thrown under any other.
 */
export function serveOnRuntime(script: string, handler: RuntimeHandler, port = 0): void {
  const announce = (port: number) => console.log(JSON.stringify({ port }))
  if (runtime.Bun) {
    const server = runtime.Bun.serve({
      port,
      hostname: '127.0.0.1',
      fetch: (request, bun) => handler(request, bun.requestIP(request)?.address),
    })
    announce(server.port)
  } else if (runtime.Deno) {
    runtime.Deno.serve({ port, hostname: '127.0.0.1', onListen: ({ port }) => announce(port) }, (request, info) => handler(request, info.remoteAddr.hostname))
  } else {
    throw new Error(`${script} runs under Bun or Deno`)
  }
}
